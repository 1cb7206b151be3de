// Claims walk fresh messages from a cursor (src/store/postgres/claim_cursor.h,
// sql/004_claim_cursor.sql). These tests move the cursor past a message that is not claimable yet
// and check that it is claimed once it is: a writer's transaction still open, an operator's replay
// of a message never claimed, a partition gained, a message given back. (That the walk does start
// at the cursor depends on every transaction in the cluster, so parallel tests would make a check
// of it flaky: tests/unit/claim_cursor_test.cpp covers where the cursor goes.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "outbox/store/postgres_admin.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

class PgClaimCursorTest : public ::testing::Test {
 protected:
  TestSchema schema_;
  postgres::Writer writer_{schema_.name()};
  std::unique_ptr<Store> store_ = OpenTestStore(schema_);

  MessageId Enqueue(std::string topic, std::optional<std::string> key = std::nullopt) {
    const NewMessage message = TestMessage(std::move(topic), std::move(key));
    return store_->Enqueue(std::span{&message, 1}).at(0);
  }
  std::vector<Envelope> ClaimAndComplete(
      std::optional<std::vector<PartitionLease>> partitions = std::nullopt) {
    ClaimRequest request;
    request.owner = "relay";
    request.max_messages = 1000;
    request.partitions = std::move(partitions);
    auto batch = store_->Claim(request);
    std::vector<LeasedId> leased;
    for (const auto& envelope : batch) leased.push_back(LeasedId::Of(envelope));
    EXPECT_EQ(store_->Complete("relay", leased).settled, static_cast<std::int64_t>(leased.size()));
    return batch;
  }
  // Rounds of newer messages, each claimed and completed: the cursor moves past older ones.
  void MoveTheCursor(const std::optional<std::vector<PartitionLease>>& partitions = std::nullopt,
                     const std::string& key = "filler") {
    for (int round = 0; round < 4; ++round) {
      for (int i = 0; i < 5; ++i) Enqueue("filler", key);
      for (const auto& envelope : ClaimAndComplete(partitions)) {
        EXPECT_EQ(envelope.topic, "filler") << "claimed too early";
      }
    }
  }
  static bool Contains(const std::vector<Envelope>& batch, const MessageId& id) {
    return std::any_of(batch.begin(), batch.end(), [&](const Envelope& e) { return e.id == id; });
  }
};

TEST_F(PgClaimCursorTest, AMessageOfATransactionStillOpenIsClaimedOnceItCommits) {
  MoveTheCursor();  // the horizon is known before the writer begins
  auto app = Connect();
  Sql(app.get(), "BEGIN");
  const MessageId slow = writer_.Enqueue(app.get(), TestMessage("slow"));
  MoveTheCursor();  // newer messages, committed first, claimed and deleted
  Sql(app.get(), "COMMIT");
  const MessageId later = Enqueue("later");
  const auto batch = ClaimAndComplete();
  EXPECT_TRUE(Contains(batch, slow)) << "a message older than the claimed ones was passed over";
  EXPECT_TRUE(Contains(batch, later));
}

TEST_F(PgClaimCursorTest, AReplayOfAMessageAbandonedBeforeItsFirstClaimIsClaimed) {
  const MessageId doomed = Enqueue("doomed");
  auto admin = postgres::OpenAdmin(PgUrl(), schema_.name());
  MessageFilter only_it;
  only_it.ids = std::vector<MessageId>{doomed};
  ASSERT_EQ(admin->Abandon(only_it, "test", false).count, 1);
  MoveTheCursor();
  ASSERT_EQ(admin->Replay(only_it, false).count, 1);
  const auto batch = ClaimAndComplete();
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, doomed);
}

TEST_F(PgClaimCursorTest, APartitionGainedIsWalkedFromItsOldestMessage) {
  const auto leases = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
  const Membership membership = leases->Heartbeat("relay", std::chrono::seconds{30}, {});
  ASSERT_EQ(membership.owned.size(), 64U);
  const auto partition_of = [&](const std::string& key) {
    return std::stoi(
        Scalar(schema_.conn(), "SELECT " + schema_.name() + ".partition_of('" + key + "', 64)"));
  };
  const std::string waiting_key = "waiting";
  std::string moving_key = "moving";
  for (int i = 0; partition_of(moving_key) == partition_of(waiting_key); ++i) {
    moving_key = "moving" + std::to_string(i);
  }
  const auto lease_of = [&](int partition) {
    return membership.owned.at(static_cast<std::size_t>(partition));
  };
  const MessageId waiting = Enqueue("waiting", waiting_key);
  // Claims over the other partition only move the cursor past the waiting message...
  const std::vector<PartitionLease> one{lease_of(partition_of(moving_key))};
  MoveTheCursor(one, moving_key);
  // ...which is claimed as soon as its partition is among the claimed ones.
  std::vector<PartitionLease> both = one;
  both.push_back(lease_of(partition_of(waiting_key)));
  const auto batch = ClaimAndComplete(both);
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, waiting);
}

// An outage longer than the partition lease: a claim under leases that have expired claims
// nothing, and must not move the cursor past the messages of those partitions either; renewed
// under the same epochs, they are not "gained", so nothing walks back to them (found by
// RelayTest.AClaimWhoseReplyIsLostInAnOutageLongerThanThePartitionLeaseReordersNoStream: the
// stream's second message waited for the net's walk, a minute).
TEST_F(PgClaimCursorTest, AClaimUnderExpiredPartitionLeasesPassesNoneOfTheirMessages) {
  const auto leases = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
  const std::chrono::milliseconds lease{1000};
  const std::vector<PartitionLease> held = leases->Heartbeat("relay", lease, {}).owned;
  ASSERT_EQ(held.size(), 64U);
  MoveTheCursor(held);  // the horizon is known before the writer begins
  auto app = Connect();
  Sql(app.get(), "BEGIN");
  const MessageId waiting = writer_.Enqueue(app.get(), TestMessage("waiting"));
  MoveTheCursor(held);  // claims made while it is not visible: the horizon passes its id
  Sql(app.get(), "COMMIT");
  std::this_thread::sleep_for(lease + std::chrono::milliseconds{300});
  EXPECT_TRUE(ClaimAndComplete(held).empty()) << "claimed under expired partition leases";
  ASSERT_EQ(leases->Heartbeat("relay", std::chrono::seconds{30}, {}).owned, held)
      << "the leases were not renewed under the same epochs";
  const auto batch = ClaimAndComplete(held);
  EXPECT_TRUE(Contains(batch, waiting))
      << "the cursor passed a message of partitions whose leases had expired";
}

TEST_F(PgClaimCursorTest, AMessageGivenBackIsClaimedBeforeItsStreamsLaterOnes) {
  const MessageId first = Enqueue("s", "stream");
  ClaimRequest request;
  request.owner = "relay";
  request.max_messages = 10;
  const auto claimed = store_->Claim(request);
  ASSERT_EQ(claimed.size(), 1U);
  MoveTheCursor();  // while the first is leased
  const MessageId second = Enqueue("s", "stream");
  const LeasedId lease = LeasedId::Of(claimed[0]);
  ASSERT_EQ(store_->Release("relay", std::span{&lease, 1}).settled, 1);
  const auto batch = ClaimAndComplete();
  ASSERT_EQ(batch.size(), 2U);
  EXPECT_EQ(batch[0].id, first);
  EXPECT_EQ(batch[1].id, second);
}

}  // namespace
}  // namespace outbox::testing
