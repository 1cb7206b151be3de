#include "outbox/core/retry_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace outbox {
namespace {

using std::chrono::milliseconds;

RetryPolicy Policy() {
  RetryPolicy policy;
  policy.initial_delay = milliseconds{100};
  policy.max_delay = milliseconds{10000};
  policy.multiplier = 2.0;
  policy.jitter = 0.25;
  policy.max_attempts = 5;
  return policy;
}

TEST(RetryPolicyTest, BaseDelayIsExponentialAndCapped) {
  const auto policy = Policy();
  EXPECT_EQ(policy.BaseDelay(1), milliseconds{100});
  EXPECT_EQ(policy.BaseDelay(2), milliseconds{200});
  EXPECT_EQ(policy.BaseDelay(3), milliseconds{400});
  EXPECT_EQ(policy.BaseDelay(7), milliseconds{6400});
  EXPECT_EQ(policy.BaseDelay(8), milliseconds{10000});
  EXPECT_EQ(policy.BaseDelay(1000000), milliseconds{10000});  // no overflow
}

TEST(RetryPolicyTest, JitterStaysWithinBoundsAndSpreads) {
  const auto policy = Policy();
  auto random = SeededRandom(42);
  for (int attempt = 1; attempt <= 10; ++attempt) {
    const double base = static_cast<double>(policy.BaseDelay(attempt).count());
    std::vector<double> ratios;
    for (int i = 0; i < 10000; ++i) {
      ratios.push_back(static_cast<double>(policy.Delay(attempt, random).count()) / base);
    }
    const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
    double mean = 0;
    for (double r : ratios) mean += r / static_cast<double>(ratios.size());
    SCOPED_TRACE(attempt);
    // Bounds: +-25 % (plus rounding to whole milliseconds).
    EXPECT_GE(*low, 0.75 - 0.5 / base);
    EXPECT_LE(*high, 1.25 + 0.5 / base);
    // Spread: the samples fill the range rather than sitting on one value.
    EXPECT_LT(*low, 0.76);
    EXPECT_GT(*high, 1.24);
    EXPECT_NEAR(mean, 1.0, 0.01);
    // Roughly uniform: about a quarter of the samples in each quarter of the range.
    const auto lower_quarter =
        std::count_if(ratios.begin(), ratios.end(), [](double r) { return r < 0.875; });
    EXPECT_NEAR(static_cast<double>(lower_quarter) / 10000.0, 0.25, 0.03);
  }
}

TEST(RetryPolicyTest, SeededSourcesRepeat) {
  const auto policy = Policy();
  auto first = SeededRandom(7);
  auto second = SeededRandom(7);
  auto other = SeededRandom(8);
  int differences = 0;
  for (int attempt = 1; attempt <= 20; ++attempt) {
    const auto a = policy.Delay(attempt, first);
    EXPECT_EQ(a, policy.Delay(attempt, second));
    differences += a != policy.Delay(attempt, other) ? 1 : 0;
  }
  EXPECT_GT(differences, 10);
}

TEST(RetryPolicyTest, SeededSourceIsPortable) {
  // SplitMix64's first output for seed 0 is 0xe220a8397b1dcdaf; pinning it keeps seeded test
  // runs identical on every platform.
  auto random = SeededRandom(0);
  EXPECT_DOUBLE_EQ(random(), static_cast<double>(0xe220a8397b1dcdafULL >> 11U) * 0x1.0p-53);
}

TEST(RetryPolicyTest, NoJitterMeansExactDelays) {
  auto policy = Policy();
  policy.jitter = 0;
  auto random = SeededRandom(1);
  EXPECT_EQ(policy.Delay(3, random), milliseconds{400});
}

TEST(RetryPolicyTest, ExhaustedAtMaxAttempts) {
  const auto policy = Policy();
  EXPECT_FALSE(policy.Exhausted(0));
  EXPECT_FALSE(policy.Exhausted(4));
  EXPECT_TRUE(policy.Exhausted(5));
  EXPECT_TRUE(policy.Exhausted(6));
}

TEST(RetryPolicyTest, ValidateNamesTheBadField) {
  EXPECT_EQ(Policy().Validate(), std::nullopt);
  EXPECT_EQ(RetryPolicy{}.Validate(), std::nullopt);
  auto bad = Policy();
  bad.max_attempts = 0;
  EXPECT_NE(bad.Validate().value_or("").find("max_attempts"), std::string::npos);
  bad = Policy();
  bad.jitter = 1.5;
  EXPECT_NE(bad.Validate().value_or("").find("jitter"), std::string::npos);
  bad = Policy();
  bad.multiplier = 0.5;
  EXPECT_NE(bad.Validate().value_or("").find("multiplier"), std::string::npos);
  bad = Policy();
  bad.max_delay = milliseconds{1};
  EXPECT_NE(bad.Validate().value_or("").find("max_delay"), std::string::npos);
  bad = Policy();
  bad.initial_delay = milliseconds{-1};
  EXPECT_NE(bad.Validate().value_or("").find("initial_delay"), std::string::npos);
}

}  // namespace
}  // namespace outbox
