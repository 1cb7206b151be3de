#include "outbox/core/uuid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <unordered_set>
#include <vector>

namespace outbox {
namespace {

using std::chrono::milliseconds;

TEST(UuidTest, ParsesAndFormatsCanonicalText) {
  const auto id = Uuid::Parse("01890A5D-AC96-774B-BCCE-B302099A8057");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->ToString(), "01890a5d-ac96-774b-bcce-b302099a8057");
  EXPECT_EQ(id->version(), 7);
  EXPECT_TRUE(id->HasRfcVariant());
  EXPECT_EQ(id->UnixMillis(), 0x01890a5dac96U);
  EXPECT_TRUE(Uuid{}.IsNil());
  EXPECT_EQ(Uuid{}.ToString(), "00000000-0000-0000-0000-000000000000");
}

TEST(UuidTest, RejectsMalformedText) {
  for (const char* text :
       {"", "01890a5d", "01890a5d-ac96-774b-bcce-b302099a805",
        "01890a5d-ac96-774b-bcce-b302099a80570", "01890a5dxac96-774b-bcce-b302099a8057",
        "01890a5d-ac96-774b-bcce-b302099a805g", "{01890a5d-ac96-774b-bcce-b302099a80}"}) {
    EXPECT_EQ(Uuid::Parse(text), std::nullopt) << text;
  }
}

TEST(UuidV7Test, LayoutFollowsRfc9562) {
  ManualClock clock{TimePoint{milliseconds{0x0123456789ABLL}}};
  UuidV7Generator generator{clock};
  for (int i = 0; i < 1000; ++i) {
    const Uuid id = generator.Next();
    EXPECT_EQ(id.version(), 7);
    EXPECT_TRUE(id.HasRfcVariant());
    EXPECT_EQ(id.UnixMillis(), 0x0123456789ABU);
    EXPECT_EQ(Uuid::Parse(id.ToString()), id);
  }
}

TEST(UuidV7Test, MonotonicWithinAMillisecondAndWhenTheClockGoesBack) {
  ManualClock clock{TimePoint{milliseconds{1'700'000'000'000}}};
  UuidV7Generator generator{clock};
  Uuid previous = generator.Next();
  // 10,000 ids in one millisecond overflow the 12-bit counter: the timestamp moves ahead.
  for (int i = 0; i < 10000; ++i) {
    const Uuid next = generator.Next();
    ASSERT_LT(previous, next) << i;
    previous = next;
  }
  EXPECT_GT(previous.UnixMillis(), 1'700'000'000'000U);
  clock.Advance(milliseconds{-60'000});  // the wall clock steps back a minute
  const Uuid after_step = generator.Next();
  EXPECT_LT(previous, after_step);
  clock.Advance(milliseconds{120'000});
  const Uuid later = generator.Next();
  EXPECT_LT(after_step, later);
  EXPECT_EQ(later.UnixMillis(), 1'700'000'060'000U);
}

TEST(UuidV7Test, AMillionIdsFromSeveralThreadsAreUniqueAndOrdered) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 250'000;
  UuidV7Generator generator;
  const auto start = std::chrono::system_clock::now();
  std::vector<std::vector<Uuid>> per_thread(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&generator, &ids = per_thread[static_cast<std::size_t>(t)]] {
      ids.reserve(kPerThread);
      for (int i = 0; i < kPerThread; ++i) ids.push_back(generator.Next());
    });
  }
  for (auto& thread : threads) thread.join();
  const auto end = std::chrono::system_clock::now();

  std::vector<Uuid> all;
  for (const auto& ids : per_thread) {
    // Each thread sees strictly increasing ids.
    EXPECT_TRUE(std::adjacent_find(ids.begin(), ids.end(), std::greater_equal<>{}) == ids.end());
    all.insert(all.end(), ids.begin(), ids.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "duplicate id";
  ASSERT_EQ(all.size(), std::size_t{kThreads} * kPerThread);
  // Timestamps come from the clock (the counter may run ahead by a few ms under this load).
  const auto millis = [](auto t) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<milliseconds>(t.time_since_epoch()).count());
  };
  EXPECT_GE(all.front().UnixMillis(), millis(start));
  EXPECT_LE(all.back().UnixMillis(), millis(end) + 1000);
  std::unordered_set<Uuid> hashed(all.begin(), all.end());
  EXPECT_EQ(hashed.size(), all.size());
}

TEST(UuidV7Test, ProcessWideGeneratorIsOrdered) {
  const Uuid a = NewUuidV7();
  const Uuid b = NewUuidV7();
  EXPECT_LT(a, b);
  EXPECT_EQ(a.version(), 7);
}

}  // namespace
}  // namespace outbox
