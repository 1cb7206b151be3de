#include "outbox/core/partition.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

namespace outbox {
namespace {

// Published FNV-1a 32-bit test vectors (Fowler/Noll/Vo reference test suite).
static_assert(Fnv1a32("") == 0x811c9dc5U);
static_assert(Fnv1a32("a") == 0xe40c292cU);
static_assert(Fnv1a32("foobar") == 0xbf9cf968U);

TEST(PartitionTest, Fnv1aReferenceVectors) {
  EXPECT_EQ(Fnv1a32(""), 0x811c9dc5U);
  EXPECT_EQ(Fnv1a32("a"), 0xe40c292cU);
  EXPECT_EQ(Fnv1a32("b"), 0xe70c2de5U);
  EXPECT_EQ(Fnv1a32("foo"), 0xa9f37ed7U);
  EXPECT_EQ(Fnv1a32("foobar"), 0xbf9cf968U);
}

TEST(PartitionTest, BytesAreUnsigned) {
  // Non-ASCII bytes must hash as 0x80..0xff on every platform, whatever the signedness of char.
  EXPECT_EQ(Fnv1a32("\xff"), (0x811c9dc5U ^ 0xffU) * 16777619U);
}

// Fixed partition assignments. The SQL enqueue function is tested against these same vectors;
// changing any of them moves existing streams between partitions and breaks ordering.
TEST(PartitionTest, FixedAssignments) {
  EXPECT_EQ(Fnv1a32("order-42"), 0x572446f4U);
  EXPECT_EQ(PartitionOf("order-42", 16), 4);
  EXPECT_EQ(Fnv1a32("customer/7"), 0x8054dc6fU);
  EXPECT_EQ(PartitionOf("customer/7", 64), 47);
  EXPECT_EQ(Fnv1a32("Gr\xc3\xbc\xc3\x9f"
                    "e"),
            0xb8226e38U);  // "Grüße" in UTF-8
  EXPECT_EQ(PartitionOf("anything", 1), 0);
}

TEST(PartitionTest, UnkeyedMessagesUseTheIdText) {
  const auto id = Uuid::Parse("01890a5d-ac96-774b-bcce-b302099a8057").value();
  EXPECT_EQ(PartitionFor(std::nullopt, id, 32), 19);  // Fnv1a32 of the text form: 0xde10fff3
  EXPECT_EQ(PartitionFor(std::string{"k"}, id, 32), PartitionOf("k", 32));
}

TEST(PartitionTest, RejectsBadCounts) {
  EXPECT_THROW(PartitionOf("k", 0), std::invalid_argument);
  EXPECT_THROW(PartitionOf("k", -3), std::invalid_argument);
  EXPECT_THROW(PartitionOf("k", kMaxPartitionCount + 1), std::invalid_argument);
  EXPECT_NO_THROW(PartitionOf("k", kMaxPartitionCount));
}

TEST(PartitionTest, SpreadsKeysEvenly) {
  constexpr int kPartitions = 16;
  constexpr int kKeys = 160000;
  std::map<int, int> counts;
  for (int i = 0; i < kKeys; ++i) ++counts[PartitionOf("order-" + std::to_string(i), kPartitions)];
  ASSERT_EQ(counts.size(), std::size_t{kPartitions});
  for (const auto& [partition, count] : counts) {
    EXPECT_NEAR(count, kKeys / kPartitions, kKeys / kPartitions / 10) << "partition " << partition;
  }
}

}  // namespace
}  // namespace outbox
