#include "outbox/core/clock.h"

#include <gtest/gtest.h>

namespace outbox {
namespace {

using std::chrono::milliseconds;

TEST(FormatRfc3339Test, UtcWithTheFractionAskedForTruncated) {
  using namespace std::chrono_literals;
  EXPECT_EQ(FormatRfc3339(TimePoint{}, 3), "1970-01-01T00:00:00.000Z");
  const TimePoint time =
      std::chrono::sys_days{std::chrono::year{2024} / 5 / 1} + 12h + 34min + 56s + 789ms + 999us;
  EXPECT_EQ(FormatRfc3339(time, 3), "2024-05-01T12:34:56.789Z");  // truncated, not rounded
  EXPECT_EQ(FormatRfc3339(time, 6), "2024-05-01T12:34:56.789999Z");
  EXPECT_EQ(FormatRfc3339(time, 0), "2024-05-01T12:34:56Z");
  EXPECT_EQ(FormatRfc3339(TimePoint{} - 1ms, 3), "1969-12-31T23:59:59.999Z");
  EXPECT_EQ(FormatRfc3339(TimePoint{} - 1us, 6), "1969-12-31T23:59:59.999999Z");
  EXPECT_THROW(FormatRfc3339(time, 2), std::invalid_argument);
}

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
