#include "outbox/core/clock.h"

#include <gtest/gtest.h>

namespace outbox {
namespace {

using std::chrono::milliseconds;

TEST(ManualClockTest, MovesOnlyWhenTold) {
  ManualClock clock{TimePoint{milliseconds{1000}}};
  EXPECT_EQ(clock.Now(), TimePoint{milliseconds{1000}});
  EXPECT_EQ(clock.Now(), TimePoint{milliseconds{1000}});
  clock.Advance(milliseconds{250});
  EXPECT_EQ(clock.Now(), TimePoint{milliseconds{1250}});
  clock.Set(TimePoint{milliseconds{5}});
  EXPECT_EQ(clock.Now(), TimePoint{milliseconds{5}});
}

TEST(SystemClockTest, FollowsTheWallClock) {
  const auto before = std::chrono::system_clock::now();
  const auto now = SystemClock::Instance().Now();
  const auto after = std::chrono::system_clock::now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
}

}  // namespace
}  // namespace outbox
