#include "outbox/core/hand_off.h"

#include <gtest/gtest.h>

#include <thread>

namespace outbox {
namespace {

using std::chrono::milliseconds;

TEST(HandOffQueueTest, DeliversInOrderAndDropsWhatDoesNotFit) {
  HandOffQueue queue{3};
  const std::vector<MessageId> ids{NewUuidV7(), NewUuidV7(), NewUuidV7(), NewUuidV7()};
  EXPECT_TRUE(queue.Offer(std::span{ids}.first(2)));
  EXPECT_FALSE(queue.Offer(std::span{ids}.subspan(2)));  // 2 + 2 > 3: dropped whole
  EXPECT_EQ(queue.dropped(), 2U);
  EXPECT_TRUE(queue.Offer(std::span{ids}.subspan(2, 1)));
  const auto taken = queue.Take(10, milliseconds{0});
  ASSERT_EQ(taken.size(), 3U);
  EXPECT_EQ(taken[0], ids[0]);
  EXPECT_EQ(taken[1], ids[1]);
  EXPECT_EQ(taken[2], ids[2]);
  EXPECT_TRUE(queue.Take(10, milliseconds{1}).empty());
}

TEST(HandOffQueueTest, TakeWakesOnOffer) {
  HandOffQueue queue;
  const MessageId id = NewUuidV7();
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds{20});
    queue.Offer(std::span{&id, 1});
  });
  const auto taken = queue.Take(10, milliseconds{5000});
  writer.join();
  ASSERT_EQ(taken.size(), 1U);
  EXPECT_EQ(taken[0], id);
}

}  // namespace
}  // namespace outbox

namespace outbox {
namespace {

TEST(HandOffQueueTest, ListenerHearsEverySuccessfulOfferOnly) {
  HandOffQueue queue{1};
  int heard = 0;
  queue.SetListener([&] { ++heard; });
  const MessageId id = NewUuidV7();
  EXPECT_TRUE(queue.Offer(std::span{&id, 1}));
  EXPECT_FALSE(queue.Offer(std::span{&id, 1}));  // full: dropped, nobody woken for nothing
  EXPECT_EQ(heard, 1);
  queue.SetListener({});
  queue.Take(1, std::chrono::milliseconds{0});
  EXPECT_TRUE(queue.Offer(std::span{&id, 1}));
  EXPECT_EQ(heard, 1);
}

}  // namespace
}  // namespace outbox
