// The cursor a PostgreSQL claim walks fresh messages from (src/store/postgres/claim_cursor.h):
// it never passes a message that can still become claimable.
#include "claim_cursor.h"

#include <gtest/gtest.h>

namespace outbox::postgres {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Steady = std::chrono::steady_clock;

TimePoint At(std::int64_t unix_millis) { return TimePoint{milliseconds{unix_millis}}; }

Uuid IdAt(std::int64_t unix_millis, std::uint8_t tail = 0x42) {
  Uuid::Bytes bytes = ClaimCursor::Floor(At(unix_millis)).bytes();
  bytes[6] = 0x70;  // version 7
  bytes[15] = tail;
  return Uuid{bytes};
}

ClaimObservation Seen(std::int64_t unix_millis, std::uint64_t oldest_running,
                      std::optional<std::uint64_t> own, std::optional<Uuid> frontier) {
  return ClaimObservation{.frontier = frontier,
                          .database_now = At(unix_millis),
                          .oldest_running_xid = oldest_running,
                          .own_xid = own};
}

std::vector<PartitionLease> Held(std::initializer_list<PartitionLease> leases) { return leases; }

TEST(ClaimCursorTest, FloorIsTheSmallestIdOfItsMillisecond) {
  const Uuid floor = ClaimCursor::Floor(At(1'700'000'000'123) + std::chrono::microseconds{999});
  EXPECT_EQ(floor.ToString(), "018bcfe5-687b-0000-0000-000000000000");
  EXPECT_EQ(floor.UnixMillis(), 1'700'000'000'123U);
  EXPECT_LT(floor, IdAt(1'700'000'000'123, 0));
  EXPECT_GT(floor, IdAt(1'700'000'000'122, 0xff));
}

TEST(ClaimCursorTest, WalksFromTheOldestUntilEveryTransactionOfAnEarlierClaimHasEnded) {
  ClaimCursor cursor;
  const auto now = Steady::now();
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil());
  // Claim 1 at t=1000 got xid 100 while 90 was still running.
  cursor.Observe(Seen(1000, 90, 100, IdAt(5000)));
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil()) << "no horizon yet";
  // Claim 2: 95 is the oldest running: claim 1's own transaction may not be the last one to end.
  cursor.Observe(Seen(2000, 95, 110, IdAt(5000)));
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil());
  // Claim 3: everything up to claim 1's xid has ended, so everything written before t=1000 is
  // visible; the fresh messages start later, at 5000, so the horizon bounds the cursor.
  cursor.Observe(Seen(3000, 101, 120, IdAt(5000)));
  EXPECT_EQ(cursor.Next(std::nullopt, now), ClaimCursor::Floor(At(1000)));
  // Claim 4: claims 2 and 3 are behind us too; the horizon is claim 3's time.
  cursor.Observe(Seen(4000, 121, 130, IdAt(5000)));
  EXPECT_EQ(cursor.Next(std::nullopt, now), ClaimCursor::Floor(At(3000)));
}

TEST(ClaimCursorTest, ABacklogKeepsTheCursorAtItsFirstUnclaimedMessage) {
  ClaimCursor cursor;
  const auto now = Steady::now();
  cursor.Next(std::nullopt, now);
  cursor.Observe(Seen(90'000, 10, 11, IdAt(1000)));
  cursor.Next(std::nullopt, now);
  cursor.Observe(Seen(91'000, 12, 13, IdAt(2000)));
  EXPECT_EQ(cursor.Next(std::nullopt, now), IdAt(2000)) << "the frontier is older than the horizon";
  cursor.Observe(Seen(92'000, 14, 15, std::nullopt));  // nothing fresh left
  EXPECT_EQ(cursor.Next(std::nullopt, now), ClaimCursor::Floor(At(91'000)));
}

TEST(ClaimCursorTest, ClaimsWithoutATransactionIdDoNotMoveTheHorizon) {
  ClaimCursor cursor;
  const auto now = Steady::now();
  cursor.Next(std::nullopt, now);
  cursor.Observe(Seen(1000, 10, std::nullopt, std::nullopt));
  cursor.Observe(Seen(2000, 50, std::nullopt, std::nullopt));
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil());
}

TEST(ClaimCursorTest, GainingAPartitionWalksFromTheOldestAgainLosingOneDoesNot) {
  ClaimCursor cursor;
  auto now = Steady::now();
  const auto two = Held({{1, 5}, {2, 5}});
  cursor.Next(two, now);
  cursor.Observe(Seen(1000, 10, 11, std::nullopt));
  cursor.Observe(Seen(2000, 12, 13, std::nullopt));
  const Uuid moved = ClaimCursor::Floor(At(1000));
  ASSERT_EQ(cursor.Next(two, now), moved);
  EXPECT_EQ(cursor.Next(Held({{1, 5}}), now), moved) << "lost partition 2";
  EXPECT_TRUE(cursor.Next(Held({{1, 5}, {2, 6}}), now).IsNil()) << "took partition 2 back";
  cursor.Observe(Seen(3000, 14, 15, std::nullopt));
  ASSERT_EQ(cursor.Next(Held({{1, 5}, {2, 6}}), now), ClaimCursor::Floor(At(2000)));
  EXPECT_TRUE(cursor.Next(Held({{1, 5}, {2, 7}}), now).IsNil()) << "a new epoch is a new lease";
  cursor.Observe(Seen(4000, 16, 17, std::nullopt));
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil()) << "from some partitions to all of them";
}

TEST(ClaimCursorTest, WalksFromTheOldestOnceAMinuteAsANet) {
  ClaimCursor cursor;
  const auto start = Steady::now();
  cursor.Next(std::nullopt, start);
  cursor.Observe(Seen(1000, 10, 11, std::nullopt));
  cursor.Observe(Seen(2000, 12, 13, std::nullopt));
  EXPECT_FALSE(cursor.Next(std::nullopt, start + seconds{59}).IsNil());
  EXPECT_TRUE(cursor.Next(std::nullopt, start + seconds{60}).IsNil());
  cursor.Observe(Seen(3000, 14, 15, std::nullopt));
  EXPECT_FALSE(cursor.Next(std::nullopt, start + seconds{61}).IsNil());
}

TEST(ClaimCursorTest, TheNetWaitsLongerEachTimeItFindsNothingAndAMinuteAfterItFindsSomething) {
  ClaimCursor cursor;
  auto now = Steady::now();
  cursor.Next(std::nullopt, now);
  cursor.Observe(Seen(1000, 10, 11, std::nullopt));
  cursor.Observe(Seen(2000, 12, 13, std::nullopt));
  ASSERT_FALSE(cursor.Next(std::nullopt, now).IsNil());
  // Each net walk that finds no fresh message behind the cursor doubles the interval.
  for (const int expected : {120, 240, 480, 960, 960}) {
    now += cursor.full_walk_interval();
    EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil());
    cursor.Observe(Seen(3000, 14, 15, IdAt(2500)));
    EXPECT_EQ(cursor.full_walk_interval(), seconds{expected});
    EXPECT_FALSE(cursor.Next(std::nullopt, now + seconds{1}).IsNil());
  }
  EXPECT_EQ(cursor.found_behind(), 0U);
  // One that finds a fresh message behind where the cursor was: back to a minute.
  now += cursor.full_walk_interval();
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil());
  cursor.Observe(Seen(4000, 16, 17, IdAt(500)));
  EXPECT_EQ(cursor.found_behind(), 1U);
  EXPECT_EQ(cursor.full_walk_interval(), ClaimCursor::kFullWalkInterval);
  // A walk from the oldest for another reason (a partition gained) is not the net's.
  EXPECT_TRUE(cursor.Next(Held({{1, 1}}), now + seconds{2}).IsNil());
  cursor.Observe(Seen(5000, 18, 19, IdAt(4500)));
  EXPECT_EQ(cursor.full_walk_interval(), ClaimCursor::kFullWalkInterval);
}

TEST(ClaimCursorTest, ADatabaseClockGoingBackForgetsTheHorizon) {
  ClaimCursor cursor;
  const auto now = Steady::now();
  cursor.Next(std::nullopt, now);
  cursor.Observe(Seen(5000, 10, 11, std::nullopt));
  cursor.Observe(Seen(6000, 12, 13, std::nullopt));
  ASSERT_FALSE(cursor.Next(std::nullopt, now).IsNil());
  cursor.Observe(Seen(4000, 14, 15, std::nullopt));  // stepped back a second
  EXPECT_TRUE(cursor.Next(std::nullopt, now).IsNil());
  cursor.Observe(Seen(4500, 16, 17, std::nullopt));
  EXPECT_EQ(cursor.Next(std::nullopt, now), ClaimCursor::Floor(At(4000)));
}

TEST(ClaimCursorTest, ALongTransactionKeepsTheCursorBackAndItsMemoryBounded) {
  ClaimCursor cursor;
  const auto now = Steady::now();
  cursor.Next(std::nullopt, now);
  cursor.Observe(Seen(1000, 10, 11, std::nullopt));
  cursor.Observe(Seen(1500, 12, 13, std::nullopt));  // horizon 1000
  // Transaction 14 stays open for 10,000 claims.
  for (std::uint64_t i = 0; i < 10'000; ++i) {
    cursor.Observe(Seen(static_cast<std::int64_t>(2000 + i), 14, 100 + i, std::nullopt));
  }
  EXPECT_EQ(cursor.Next(std::nullopt, now), ClaimCursor::Floor(At(1500)));
  // It ends: the horizon jumps to the newest claim whose transactions have all ended.
  cursor.Observe(Seen(20'000, 100'000, 100'001, std::nullopt));
  EXPECT_EQ(cursor.Next(std::nullopt, now), ClaimCursor::Floor(At(2000 + 9'999)));
}

}  // namespace
}  // namespace outbox::postgres
