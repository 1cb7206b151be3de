// The HTTP sink's classification of answers (classify.h), every status class and the interplay of
// retry_statuses and abandon_statuses (issue #40). No server: the function alone.

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "classify.h"

namespace outbox::webhook {
namespace {

std::optional<FailureKind> KindOf(long status, const std::vector<int>& retry = {},
                                  const std::vector<int>& abandon = {}) {
  const auto failure = ClassifyStatus(status, StatusLists{retry, abandon}, "", "");
  if (!failure) return std::nullopt;
  return failure->kind;
}

TEST(HttpClassifyTest, EveryStatusClassByDefault) {
  for (const long status : {200L, 201L, 202L, 204L, 299L}) {
    EXPECT_EQ(KindOf(status), std::nullopt) << status;
  }
  for (const long status : {100L, 101L, 199L, 300L, 301L, 302L, 304L, 307L, 308L}) {
    EXPECT_EQ(KindOf(status), FailureKind::kRejected) << status;
  }
  // The message itself can never be accepted as it is.
  for (const long status : {400L, 413L, 415L, 422L}) {
    EXPECT_EQ(KindOf(status), FailureKind::kPermanent) << status;
  }
  // The endpoint refuses the relay: a state of the destination.
  for (const long status : {401L, 403L, 407L}) {
    EXPECT_EQ(KindOf(status), FailureKind::kUnavailable) << status;
    EXPECT_TRUE(RefusesRelay(status, StatusLists{{}, {}})) << status;
  }
  // Any other 4xx, every 5xx, and beyond: retried with an attempt spent.
  for (const long status :
       {402L, 404L, 405L, 406L, 408L, 409L, 410L, 411L, 412L, 414L, 416L, 418L, 421L, 423L,
        425L, 426L, 428L, 429L, 431L, 451L, 499L, 500L, 501L, 502L, 503L, 504L, 599L, 600L}) {
    EXPECT_EQ(KindOf(status), FailureKind::kRejected) << status;
    EXPECT_FALSE(RefusesRelay(status, StatusLists{{}, {}})) << status;
  }
}

TEST(HttpClassifyTest, AbandonStatusesAbandonAtOnce) {
  const std::vector<int> abandon{404, 410, 501, 403};
  for (const long status : {404L, 410L, 501L, 403L}) {
    const auto failure = ClassifyStatus(status, StatusLists{{}, abandon}, "gone", "");
    ASSERT_TRUE(failure.has_value()) << status;
    EXPECT_EQ(failure->kind, FailureKind::kPermanent) << status;
    EXPECT_NE(failure->reason.find("abandon_statuses"), std::string::npos) << failure->reason;
    EXPECT_NE(failure->reason.find(": gone"), std::string::npos) << failure->reason;
  }
  // A listed 403 is the message's, not a refusal of the relay.
  EXPECT_FALSE(RefusesRelay(403, StatusLists{{}, abandon}));
  EXPECT_TRUE(RefusesRelay(401, StatusLists{{}, abandon}));
  EXPECT_EQ(KindOf(405, {}, abandon), FailureKind::kRejected);
}

TEST(HttpClassifyTest, RetryStatusesKeepTheirMeaning) {
  // Listed: retried with an attempt spent, whatever the default.
  const std::vector<int> retry{400, 401, 403, 404, 422};
  for (const long status : {400L, 401L, 403L, 404L, 422L}) {
    EXPECT_EQ(KindOf(status, retry), FailureKind::kRejected) << status;
  }
  EXPECT_FALSE(RefusesRelay(401, StatusLists{retry, {}}));
  EXPECT_FALSE(RefusesRelay(403, StatusLists{retry, {}}));
  EXPECT_TRUE(RefusesRelay(407, StatusLists{retry, {}}));
  // Not listed: the defaults.
  EXPECT_EQ(KindOf(413, retry), FailureKind::kPermanent);
  EXPECT_EQ(KindOf(407, retry), FailureKind::kUnavailable);
}

TEST(HttpClassifyTest, ReasonsSayWhatHappened) {
  const auto refused = ClassifyStatus(401, StatusLists{{}, {}}, "token expired", "");
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, "HTTP 401: token expired");
  EXPECT_EQ(RefusalOf(401), "its credentials");
  EXPECT_EQ(RefusalOf(403), "its permissions");
  EXPECT_EQ(RefusalOf(407), "its proxy credentials");
  const auto bad = ClassifyStatus(422, StatusLists{{}, {}}, "", "");
  EXPECT_NE(bad->reason.find("cannot be accepted as it is"), std::string::npos) << bad->reason;

  const Failure sent = ClassifyTimeout(true, "request_timeout (5 s)");
  EXPECT_EQ(sent.kind, FailureKind::kOutcomeUnknown);
  EXPECT_EQ(sent.reason, "sent, no answer within request_timeout (5 s)");
  const Failure queued = ClassifyTimeout(false, "request_timeout (5 s)");
  EXPECT_EQ(queued.kind, FailureKind::kOutcomeUnknown);
  EXPECT_NE(queued.reason.find("not sent within request_timeout (5 s)"), std::string::npos);
  EXPECT_EQ(queued.reason.find("resolve"), std::string::npos);
}

}  // namespace
}  // namespace outbox::webhook
