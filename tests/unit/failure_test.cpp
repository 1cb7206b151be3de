#include "outbox/core/failure.h"

#include <gtest/gtest.h>

#include "outbox/store/failure_plan.h"

namespace outbox {
namespace {

struct Row {
  FailureKind kind;
  std::string_view name;
  FailureTreatment expected;
};

// The classification table of STYLE.md point 5, stated once more so a change to it is a
// deliberate change to this test too.
const Row kTable[] = {
    {FailureKind::kUnavailable, "unavailable", {false, true, false, true}},
    {FailureKind::kRejected, "rejected", {true, true, false, true}},
    {FailureKind::kPermanent, "permanent", {true, false, true, true}},
    {FailureKind::kLeaseLost, "lease_lost", {false, false, false, false}},
    {FailureKind::kOutcomeUnknown, "outcome_unknown", {false, true, false, true}},
};

TEST(FailureTest, ClassificationTable) {
  ASSERT_EQ(std::size(kTable), static_cast<std::size_t>(kFailureKindCount));
  for (const auto& row : kTable) {
    SCOPED_TRACE(row.name);
    const FailureTreatment actual = TreatmentOf(row.kind);
    EXPECT_EQ(actual.spends_attempt, row.expected.spends_attempt);
    EXPECT_EQ(actual.retry, row.expected.retry);
    EXPECT_EQ(actual.abandon_now, row.expected.abandon_now);
    EXPECT_EQ(actual.keep_lease, row.expected.keep_lease);
    // A failure either retries, abandons, or (lease lost) leaves the message to its new owner.
    EXPECT_LE(int{actual.retry} + int{actual.abandon_now}, 1);
    EXPECT_EQ(NameOf(row.kind), row.name);
    EXPECT_EQ(ParseFailureKind(row.name), row.kind);
  }
}

TEST(FailureTest, OutagesNeverSpendAttempts) {
  // An hour-long broker outage must abandon nothing.
  EXPECT_FALSE(TreatmentOf(FailureKind::kUnavailable).spends_attempt);
  EXPECT_FALSE(TreatmentOf(FailureKind::kOutcomeUnknown).spends_attempt);
}

TEST(FailureTest, UnknownNamesAreRejected) {
  EXPECT_EQ(ParseFailureKind(""), std::nullopt);
  EXPECT_EQ(ParseFailureKind("Rejected"), std::nullopt);
  EXPECT_EQ(ParseFailureKind("retry"), std::nullopt);
}

TEST(FailureTest, DescribeNamesKindAndReason) {
  EXPECT_EQ((Failure{FailureKind::kRejected, "NOT_FOUND - no exchange 'x'"}.Describe()),
            "rejected: NOT_FOUND - no exchange 'x'");
  EXPECT_EQ((Failure{FailureKind::kLeaseLost, ""}.Describe()), "lease_lost");
}

// A destination's Retry-After (an HTTP endpoint's 429 or 503) is a floor under the delay: the
// message is not claimed again sooner, whether the failure spent an attempt or not; abandoning
// is not postponed by it.
TEST(FailurePlanTest, RetryAfterIsAFloorUnderTheDelay) {
  RetryPolicy retry;
  retry.initial_delay = std::chrono::milliseconds{100};
  retry.jitter = 0;
  retry.max_attempts = 3;
  UniformRandom random = SeededRandom(1);
  const auto plan = [&](FailureKind kind, int attempts, std::chrono::milliseconds retry_after) {
    FailedMessage failed;
    failed.attempts = attempts;
    failed.failure = Failure{kind, "HTTP 429", retry_after};
    return PlanFailure(failed, retry, random).value();
  };
  using std::chrono::milliseconds;
  EXPECT_EQ(plan(FailureKind::kRejected, 0, milliseconds{0}).delay, milliseconds{100});
  EXPECT_EQ(plan(FailureKind::kRejected, 0, milliseconds{2000}).delay, milliseconds{2000});
  EXPECT_EQ(plan(FailureKind::kRejected, 0, milliseconds{50}).delay, milliseconds{100});
  EXPECT_EQ(plan(FailureKind::kUnavailable, 0, milliseconds{0}).delay, milliseconds{0});
  const FailurePlan waiting = plan(FailureKind::kUnavailable, 0, milliseconds{1500});
  EXPECT_EQ(waiting.delay, milliseconds{1500});
  EXPECT_FALSE(waiting.spend_attempt);
  const FailurePlan last = plan(FailureKind::kRejected, 2, milliseconds{2000});
  EXPECT_TRUE(last.abandon);
  EXPECT_TRUE(plan(FailureKind::kPermanent, 0, milliseconds{2000}).abandon);
}

}  // namespace
}  // namespace outbox
