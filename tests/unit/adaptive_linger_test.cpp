// The relay's linger from the arrival rate (src/relay/adaptive_linger.h, issue #49).

#include "adaptive_linger.h"

#include <gtest/gtest.h>

#include <chrono>

namespace outbox {
namespace {

using std::chrono::milliseconds;
using Clock = AdaptiveLinger::Clock;

// `rate` messages a second, in rounds of `per_round`, for `seconds`, from `start`.
Clock::time_point Feed(AdaptiveLinger& linger, Clock::time_point start, double rate, int per_round,
                       double seconds) {
  const auto rounds = static_cast<int>(rate * seconds / per_round);
  const auto gap =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(per_round / rate));
  auto now = start;
  for (int i = 0; i < rounds; ++i) {
    now += gap;
    linger.Observe(now, static_cast<std::size_t>(per_round));
  }
  return now;
}

const Clock::time_point kStart = Clock::time_point{} + std::chrono::hours{1};

TEST(AdaptiveLingerTest, TheRateIsWhatArrivedOverAboutTheLastQuarterOfASecond) {
  AdaptiveLinger linger(milliseconds{25}, 200);
  const auto now = Feed(linger, kStart, 1000, 5, 5);
  EXPECT_NEAR(linger.Rate(now), 1000, 60);
  // Quiet: it decays, by e after one time constant.
  EXPECT_NEAR(linger.Rate(now + std::chrono::milliseconds{250}), 1000 / 2.718, 20);
  EXPECT_LT(linger.Rate(now + std::chrono::seconds{3}), 1);
}

TEST(AdaptiveLingerTest, AModerateRateGoesAtOnce) {
  AdaptiveLinger linger(milliseconds{25}, 200);
  const auto now = Feed(linger, kStart, 100, 1, 5);
  EXPECT_EQ(linger.Wait(now), milliseconds{0});
  const auto later = Feed(linger, now, 190, 1, 5);
  EXPECT_EQ(linger.Wait(later), milliseconds{0});
}

TEST(AdaptiveLingerTest, AHighRateGathersUpToTheCap) {
  AdaptiveLinger linger(milliseconds{25}, 200);
  auto now = Feed(linger, kStart, 1000, 25, 5);
  EXPECT_EQ(linger.Wait(now), milliseconds{25});
  // So fast that a full batch comes sooner than the cap: only as long as that takes.
  now = Feed(linger, now, 20000, 200, 5);
  EXPECT_GE(linger.Wait(now), milliseconds{9});
  EXPECT_LE(linger.Wait(now), milliseconds{11});
}

TEST(AdaptiveLingerTest, ARateThatFallsStopsTheLingerWithinASecond) {
  AdaptiveLinger linger(milliseconds{25}, 200);
  auto now = Feed(linger, kStart, 2000, 50, 5);
  ASSERT_EQ(linger.Wait(now), milliseconds{25});
  now = Feed(linger, now, 50, 1, 1);
  EXPECT_EQ(linger.Wait(now), milliseconds{0});
}

TEST(AdaptiveLingerTest, ACapOfZeroNeverLingers) {
  AdaptiveLinger linger(milliseconds{0}, 200);
  const auto now = Feed(linger, kStart, 5000, 100, 3);
  EXPECT_EQ(linger.Wait(now), milliseconds{0});
}

TEST(AdaptiveLingerTest, ACapTooShortToGatherTwoMessagesNeverLingers) {
  AdaptiveLinger linger(milliseconds{1}, 200);
  const auto now = Feed(linger, kStart, 1000, 5, 3);  // 1 message per ms
  EXPECT_EQ(linger.Wait(now), milliseconds{0});
  const auto faster = Feed(linger, now, 3000, 15, 3);  // 3 per ms: worth it
  EXPECT_EQ(linger.Wait(faster), milliseconds{1});
}

TEST(AdaptiveLingerTest, NothingObservedNeverLingers) {
  AdaptiveLinger linger(milliseconds{25}, 200);
  EXPECT_EQ(linger.Wait(kStart), milliseconds{0});
  EXPECT_EQ(linger.Rate(kStart), 0);
}

}  // namespace
}  // namespace outbox
