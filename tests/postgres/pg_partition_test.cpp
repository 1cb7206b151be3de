// Partition leases (store/partitions.h) against a real PostgreSQL: fair shares, hand-back,
// takeover of expired leases with a new epoch, claims fenced by the epoch, completions of a
// zombie rejected after a takeover, clean leave, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "connection.h"
#include "outbox/core/error.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLease{60000};

class PgPartitionTest : public ::testing::Test {
 protected:
  TestSchema schema_;

  std::unique_ptr<PartitionLeases> Open() {
    return postgres::OpenPartitionLeases(PgUrl(), schema_.name());
  }
  std::unique_ptr<Store> OpenStore() { return OpenTestStore(schema_); }
  // `count` messages, each on a stream of its own.
  void Enqueue(Store& store, int count) {
    std::vector<NewMessage> messages(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
      messages[static_cast<std::size_t>(i)].topic = "orders";
      messages[static_cast<std::size_t>(i)].stream_key = "order-" + std::to_string(i);
      messages[static_cast<std::size_t>(i)].payload = "{}";
    }
    store.Enqueue(messages);
  }
  static ClaimRequest Request(const std::string& owner, const Membership& membership) {
    ClaimRequest request;
    request.owner = owner;
    request.max_messages = 1000;
    request.lease_duration = kLease;
    request.partitions = membership.owned;
    return request;
  }
  std::string Owners() {
    return Scalar(schema_.conn(),
                  "SELECT string_agg(owner || '=' || n, ',' ORDER BY owner) FROM (SELECT owner, "
                  "count(*) AS n FROM " +
                      schema_.name() + ".partition_leases GROUP BY owner) x");
  }
  static std::set<int> Partitions(const Membership& membership) {
    std::set<int> partitions;
    for (const auto& held : membership.owned) partitions.insert(held.partition);
    return partitions;
  }
};

// A relay reclaims expired message leases (its own, lost track of) only in partitions it still
// holds, and never what it has in flight.
TEST_F(PgPartitionTest, ExpiredLeasesAreReclaimedOnlyInHeldPartitionsAndNotInFlight) {
  auto leases = Open();
  auto store = OpenStore();
  const auto membership = leases->Heartbeat("a/1", kLease, {});
  Enqueue(*store, 200);
  auto request = Request("a/1", membership);
  request.lease_duration = milliseconds{50};
  const auto batch = store->Claim(request);
  ASSERT_EQ(batch.size(), 200U);
  std::this_thread::sleep_for(milliseconds{120});
  const int half = 32;  // partitions 0..31
  const auto in_half = [&](const Envelope& e) { return e.partition < half; };
  const auto expected = std::count_if(batch.begin(), batch.end(), in_half);
  ASSERT_GT(expected, 1);
  ReclaimRequest reclaim;
  reclaim.owner = "a/1";
  reclaim.partitions =
      std::vector<PartitionLease>(membership.owned.begin(), membership.owned.begin() + half);
  const auto kept = std::find_if(batch.begin(), batch.end(), in_half);
  reclaim.in_flight = {kept->id};
  auto stale = reclaim;
  for (auto& held : *stale.partitions) ++held.epoch;
  EXPECT_EQ(store->ReclaimExpired(stale), 0) << "under epochs no longer held";
  auto other_owner = reclaim;
  other_owner.owner = "b/1";
  EXPECT_EQ(store->ReclaimExpired(other_owner), 0) << "partitions b does not hold";
  EXPECT_EQ(store->ReclaimExpired(reclaim), expected - 1);
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                       ".messages WHERE status = 'processing' AND partition < 32"),
            "1");
  reclaim.partitions = std::vector<PartitionLease>{};
  EXPECT_EQ(store->ReclaimExpired(reclaim), 0) << "no partition: nothing";
}

// After an outage longer than the lease, a relay's partition leases have expired too: its own
// message leases (own_unexpired, after a claim whose reply was lost) go back all the same, with
// the partitions it last held or none; another owner's never, nor what it has in flight.
TEST_F(PgPartitionTest, AnOwnersOwnLeasesGoBackEvenAfterItsPartitionLeasesExpired) {
  auto leases = Open();
  auto store = OpenStore();
  const auto membership = leases->Heartbeat("a/1", milliseconds{300}, {});
  Enqueue(*store, 50);
  const auto batch = store->Claim(Request("a/1", membership));  // message leases: kLease
  ASSERT_EQ(batch.size(), 50U);
  std::this_thread::sleep_for(milliseconds{400});  // the partition leases expired, not these
  ReclaimRequest reclaim;
  reclaim.owner = "b/1";
  reclaim.partitions = membership.owned;
  reclaim.own_unexpired = true;
  EXPECT_EQ(store->ReclaimExpired(reclaim), 0) << "another owner's leases";
  reclaim.owner = "a/1";
  reclaim.own_unexpired = false;
  EXPECT_EQ(store->ReclaimExpired(reclaim), 0) << "unexpired, and not asked for its own";
  reclaim.own_unexpired = true;
  reclaim.partitions = std::vector<PartitionLease>{};  // none held any more
  reclaim.in_flight = {batch.front().id};
  EXPECT_EQ(store->ReclaimExpired(reclaim), 49);
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                       ".messages WHERE status = 'processing'"),
            "1");
}

TEST_F(PgPartitionTest, TheFirstRelayTakesEveryPartitionUnderEpochOne) {
  auto leases = Open();
  const auto membership = leases->Heartbeat("a/1", kLease, {});
  EXPECT_EQ(membership.partition_count, 64);
  EXPECT_EQ(membership.live_instances, 1);
  EXPECT_EQ(membership.fair_share, 64);
  EXPECT_EQ(membership.acquired, 64);
  EXPECT_EQ(membership.taken_over, 0);
  ASSERT_EQ(membership.owned.size(), 64U);
  for (int p = 0; p < 64; ++p) {
    EXPECT_EQ(membership.owned[static_cast<std::size_t>(p)], (PartitionLease{p, 1}));
  }
  EXPECT_TRUE(membership.surplus.empty());
  EXPECT_EQ(membership.next_heartbeat, milliseconds{20000});  // a third of the lease
  // Renewing takes nothing new and keeps the epochs.
  const auto again = leases->Heartbeat("a/1", kLease, {});
  EXPECT_EQ(again.acquired, 0);
  EXPECT_EQ(again.owned, membership.owned);
}

TEST_F(PgPartitionTest, RelaysConvergeToFairSharesThroughSurplusHandedBack) {
  auto a = Open();
  auto b = Open();
  auto c = Open();
  a->Heartbeat("a/1", kLease, {});
  auto joined = b->Heartbeat("b/1", kLease, {});
  EXPECT_EQ(joined.live_instances, 2);
  EXPECT_EQ(joined.fair_share, 32);
  EXPECT_TRUE(joined.owned.empty()) << "a live relay's partitions are never taken";
  const auto told = a->Heartbeat("a/1", kLease, {});
  ASSERT_EQ(told.surplus.size(), 32U);
  a->Heartbeat("a/1", kLease, told.surplus);
  joined = b->Heartbeat("b/1", kLease, {});
  EXPECT_EQ(joined.owned.size(), 32U);
  EXPECT_EQ(joined.acquired, 32);
  EXPECT_EQ(joined.taken_over, 0);
  EXPECT_EQ(Owners(), "a/1=32,b/1=32");

  // A third: shares 22, 21, 21 (ceil for the first 64 % 3 relays by owner, floor for the rest).
  EXPECT_EQ(c->Heartbeat("c/1", kLease, {}).fair_share, 21);
  for (int round = 0; round < 2; ++round) {
    for (const auto& [leases, owner] : {std::pair{a.get(), "a/1"}, std::pair{b.get(), "b/1"}}) {
      const auto membership = leases->Heartbeat(owner, kLease, {});
      if (!membership.surplus.empty()) leases->Heartbeat(owner, kLease, membership.surplus);
    }
    c->Heartbeat("c/1", kLease, {});
  }
  EXPECT_EQ(Owners(), "a/1=22,b/1=21,c/1=21");
  EXPECT_EQ(a->Heartbeat("a/1", kLease, {}).fair_share, 22);
}

TEST_F(PgPartitionTest, ClaimsComeOnlyFromHeldPartitions) {
  auto store = OpenStore();
  Enqueue(*store, 400);
  auto a = Open();
  auto b = Open();
  a->Heartbeat("a/1", kLease, {});
  b->Heartbeat("b/1", kLease, {});
  a->Heartbeat("a/1", kLease, a->Heartbeat("a/1", kLease, {}).surplus);
  const auto mine = b->Heartbeat("b/1", kLease, {});
  ASSERT_EQ(mine.owned.size(), 32U);
  const auto batch = store->Claim(Request("b/1", mine));
  ASSERT_FALSE(batch.empty());
  const auto held = Partitions(mine);
  for (const auto& envelope : batch) EXPECT_TRUE(held.contains(envelope.partition));
  EXPECT_EQ(static_cast<int>(batch.size()),
            std::stoi(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                                 ".messages WHERE partition >= 32")));
  // An empty set claims nothing (not "everything").
  ClaimRequest none = Request("c/1", mine);
  none.partitions = std::vector<PartitionLease>{};
  EXPECT_TRUE(store->Claim(none).empty());
}

TEST_F(PgPartitionTest, AClaimUnderAStaleEpochOrAnotherOwnersLeaseGetsNothing) {
  auto store = OpenStore();
  Enqueue(*store, 50);
  auto a = Open();
  const auto first = a->Heartbeat("a/1", kLease, {});
  a->Leave("a/1");
  const auto second = a->Heartbeat("a/1", kLease, {});  // rejoins: every epoch moved on
  EXPECT_EQ(second.owned.front().epoch, first.owned.front().epoch + 1);
  EXPECT_TRUE(store->Claim(Request("a/1", first)).empty()) << "stale epochs claimed";
  EXPECT_TRUE(store->Claim(Request("b/1", second)).empty()) << "claimed under a's leases";
  EXPECT_EQ(store->Claim(Request("a/1", second)).size(), 50U);
}

TEST_F(PgPartitionTest, AnExpiredLeaseIsTakenOverAndTheZombiesCompletionsAreRejected) {
  auto store = OpenStore();
  Enqueue(*store, 100);
  auto zombie = Open();
  auto survivor = Open();
  const milliseconds short_lease{300};
  const auto before = zombie->Heartbeat("zombie/1", short_lease, {});
  auto claimed = store->Claim(Request("zombie/1", before));
  ASSERT_EQ(claimed.size(), 100U);
  // The zombie freezes past its lease; the survivor's heartbeat takes everything over.
  std::this_thread::sleep_for(short_lease + milliseconds{100});
  const auto after = survivor->Heartbeat("survivor/1", kLease, {});
  EXPECT_EQ(after.live_instances, 1) << "the zombie's registration expired with its lease";
  EXPECT_EQ(after.acquired, 64);
  EXPECT_EQ(after.taken_over, 64);
  EXPECT_EQ(after.owned.front().epoch, before.owned.front().epoch + 1);
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                       ".messages WHERE status = 'processing'"),
            "0")
      << "the zombie's message leases were not voided";

  // The zombie wakes: its completions are not accepted, its claims get nothing.
  std::vector<LeasedId> done;
  for (const auto& envelope : claimed) done.push_back(LeasedId::Of(envelope));
  const auto completed = store->Complete("zombie/1", done);
  EXPECT_EQ(completed.settled, 0);
  EXPECT_EQ(completed.lease_lost.size(), 100U);
  EXPECT_TRUE(store->Claim(Request("zombie/1", before)).empty());
  // Its heartbeat finds nothing left and nothing to take (the survivor's share is everything
  // until the zombie counts as live again; then the survivor hands half back).
  const auto woke = zombie->Heartbeat("zombie/1", kLease, {});
  EXPECT_TRUE(woke.owned.empty());
  EXPECT_EQ(woke.live_instances, 2);
  // The survivor publishes every message, once.
  const auto taken = store->Claim(Request("survivor/1", after));
  EXPECT_EQ(taken.size(), 100U);
}

TEST_F(PgPartitionTest, ATakeoverSkipsAPartitionAClaimIsUsingAndWaitsForNoOne) {
  auto zombie = Open();
  auto survivor = Open();
  zombie->Heartbeat("zombie/1", milliseconds{200}, {});
  std::this_thread::sleep_for(milliseconds{300});
  // An in-flight claim of the zombie holds partition 5's lease row as a claim does.
  auto claim = Connect();
  Sql(claim.get(), "BEGIN");
  Sql(claim.get(),
      "SELECT 1 FROM " + schema_.name() + ".partition_leases WHERE partition = 5 FOR KEY SHARE");
  const auto after = survivor->Heartbeat("survivor/1", kLease, {});
  EXPECT_EQ(after.acquired, 63);
  EXPECT_FALSE(Partitions(after).contains(5));
  // Below its share, so the relay heartbeats again at its next sweep.
  EXPECT_LT(static_cast<int>(after.owned.size()), after.fair_share);
  Sql(claim.get(), "COMMIT");
  EXPECT_TRUE(Partitions(survivor->Heartbeat("survivor/1", kLease, {})).contains(5));
}

TEST_F(PgPartitionTest, LeavingFreesPartitionsAndGivesLeasedMessagesBack) {
  auto store = OpenStore();
  Enqueue(*store, 20);
  auto a = Open();
  auto b = Open();
  const auto held = a->Heartbeat("a/1", kLease, {});
  ASSERT_EQ(store->Claim(Request("a/1", held)).size(), 20U);
  a->Leave("a/1");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                       ".partition_leases WHERE owner IS NOT NULL"),
            "0");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                       ".messages WHERE status = 'pending' AND attempts = 0"),
            "20");
  const auto taken = b->Heartbeat("b/1", kLease, {});
  EXPECT_EQ(taken.acquired, 64);
  EXPECT_EQ(taken.taken_over, 0) << "a released partition is not a takeover";
  EXPECT_EQ(taken.live_instances, 1);
}

TEST_F(PgPartitionTest, ADeadRelaysLeaseExpiryBringsTheNextHeartbeatForward) {
  auto a = Open();
  auto b = Open();
  // a's leases end 3 s after its heartbeat: b (a third of its lease is 10 s) should look again
  // just after that. How long after a's heartbeat b's came is measured, not assumed: on a busy
  // machine the two can be far apart.
  constexpr milliseconds kShortLease{3000};
  const auto before = std::chrono::steady_clock::now();
  a->Heartbeat("a/1", kShortLease, {});
  const auto membership = b->Heartbeat("b/1", milliseconds{30000}, {});
  const auto apart =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - before);
  ASSERT_LT(apart, kShortLease) << "a's leases had ended before b's heartbeat: nothing to check";
  EXPECT_LE(membership.next_heartbeat, kShortLease + milliseconds{100});
  EXPECT_GE(membership.next_heartbeat, kShortLease - apart)
      << "a's leases end " << (kShortLease - apart).count() << " ms or more after b's heartbeat";
}

// The heartbeat says whether anything is left to do (issue #42: an idle relay then skips its
// sweeps): a message waiting, fresh or given back, leased, or failed; not one published or
// abandoned.
TEST_F(PgPartitionTest, TheHeartbeatSaysWhetherAnyMessageIsUnfinished) {
  auto store = OpenStore();
  auto leases = Open();
  EXPECT_EQ(leases->Heartbeat("a/1", kLease, {}).unfinished, false) << "an empty outbox";
  Enqueue(*store, 1);
  EXPECT_EQ(leases->Heartbeat("a/1", kLease, {}).unfinished, true) << "a fresh message";
  const std::string table = schema_.name() + ".messages";
  const auto with = [&](const std::string& set) {
    Sql(schema_.conn(), "UPDATE " + table + " SET " + set);
    return leases->Heartbeat("a/1", kLease, {}).unfinished;
  };
  EXPECT_EQ(with("status = 'processing', lease_owner = 'x/1', lease_until = now() + interval "
                 "'1 minute', lease_epoch = 1"),
            true)
      << "leased";
  EXPECT_EQ(with("status = 'pending', lease_owner = NULL, lease_until = NULL"), true)
      << "given back (lease_epoch 1)";
  EXPECT_EQ(with("status = 'failed', available_at = now() + interval '1 hour'"), true)
      << "failed, its retry not yet due";
  EXPECT_EQ(with("status = 'failed', lease_epoch = 0"), true) << "failed, never claimed";
  EXPECT_EQ(with("status = 'published', published_at = now()"), false) << "published";
  EXPECT_EQ(with("status = 'abandoned', abandoned_at = now()"), false) << "abandoned";
}

TEST_F(PgPartitionTest, StatsCountLiveRelaysAndPartitionsNobodyHolds) {
  auto store = OpenStore();
  auto a = Open();
  auto b = Open();
  EXPECT_EQ(store->Stats().live_relays, 0);
  EXPECT_EQ(store->Stats().unowned_partitions, 0) << "no relay shares partitions: none is missed";
  a->Heartbeat("a/1", kLease, {});
  b->Heartbeat("b/1", kLease, {});
  auto stats = store->Stats();
  EXPECT_EQ(stats.live_relays, 2);
  EXPECT_EQ(stats.unowned_partitions, 0);
  a->Leave("a/1");
  stats = store->Stats();
  EXPECT_EQ(stats.live_relays, 1);
  EXPECT_EQ(stats.unowned_partitions, 64) << "b has not taken a's partitions yet";
  b->Heartbeat("b/1", kLease, {});
  EXPECT_EQ(store->Stats().unowned_partitions, 0);
}

TEST_F(PgPartitionTest, BadInputIsRefusedWithAClearError) {
  auto leases = Open();
  EXPECT_THROW(leases->Heartbeat("", kLease, {}), std::invalid_argument);
  EXPECT_THROW(leases->Heartbeat("a/1", milliseconds{0}, {}), std::invalid_argument);
  EXPECT_THROW(leases->Leave(""), std::invalid_argument);
  EXPECT_THROW(postgres::OpenPartitionLeases(PgUrl(), "Bad-Schema"), ConfigError);
  const std::string fn = schema_.name() + ".relay_heartbeat";
  EXPECT_NE(RunExpectingError(schema_.conn(), "SELECT * FROM " + fn + "('', 1000, '{}')")
                .find("relay must not be empty"),
            std::string::npos);
  EXPECT_NE(RunExpectingError(schema_.conn(), "SELECT * FROM " + fn + "('a', -5, '{}')")
                .find("lease_ms must be positive, got -5"),
            std::string::npos);
  EXPECT_NE(RunExpectingError(schema_.conn(), "SELECT * FROM " + fn + "(NULL, 1000, '{}')")
                .find("relay must not be empty"),
            std::string::npos);
  EXPECT_NE(RunExpectingError(schema_.conn(), "SELECT * FROM " + fn + "('a', NULL, '{}')")
                .find("lease_ms must be positive"),
            std::string::npos);
  for (const char* relay : {"''", "NULL"}) {
    EXPECT_NE(RunExpectingError(schema_.conn(),
                                "SELECT " + schema_.name() + ".relay_leave(" + relay + "::text)")
                  .find("relay_leave: relay must not be empty"),
              std::string::npos)
        << relay;
  }
  // Releasing partitions one does not hold changes nothing.
  const auto held = leases->Heartbeat("a/1", kLease, {});
  auto b = Open();
  EXPECT_EQ(b->Heartbeat("b/1", kLease, std::vector<int>{1, 2, 999}).released, 0);
  EXPECT_EQ(leases->Heartbeat("a/1", kLease, {}).owned.size(), held.owned.size());
}

TEST_F(PgPartitionTest, ThePartitionCountChangesOnlyWhileNothingDependsOnIt) {
  const std::string settings = schema_.name() + ".settings";
  Sql(schema_.conn(), "UPDATE " + settings + " SET partition_count = 8");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".partition_leases"),
            "8");
  auto leases = Open();
  EXPECT_EQ(leases->Heartbeat("a/1", kLease, {}).owned.size(), 8U);
  EXPECT_NE(RunExpectingError(schema_.conn(), "UPDATE " + settings + " SET partition_count = 16")
                .find("partition_count can change only while"),
            std::string::npos);
  leases->Leave("a/1");
  auto store = OpenStore();
  Enqueue(*store, 1);
  EXPECT_NE(RunExpectingError(schema_.conn(), "UPDATE " + settings + " SET partition_count = 16")
                .find("no relay is running (it is 8, asked 16)"),
            std::string::npos);
}

// The heartbeat's arrays come back as text; anything but a flat integer array is refused loudly.
TEST(PgNumberArrayTest, IntegerArraysParseAndAnythingElseIsAClearError) {
  using postgres::ParseNumberArray;
  EXPECT_EQ(ParseNumberArray("{}", "t"), std::vector<std::int64_t>{});
  EXPECT_EQ(ParseNumberArray("{7}", "t"), std::vector<std::int64_t>{7});
  EXPECT_EQ(ParseNumberArray("{0,-3,9000000000}", "t"),
            (std::vector<std::int64_t>{0, -3, 9000000000}));
  for (const char* bad : {"", "{", "1,2", "{1,,2}", "{1,}", "{,1}", "{a}", "{NULL}", "{1 ,2}",
                          "{{1}}", "{99999999999999999999}"}) {
    try {
      ParseNumberArray(bad, "heartbeat: owned");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const StoreError& error) {
      EXPECT_EQ(error.kind(), FailureKind::kPermanent);
      EXPECT_NE(std::string{error.what()}.find("heartbeat: owned: expected an integer array"),
                std::string::npos)
          << error.what();
    }
  }
  // The heartbeat's scalar columns likewise: a StoreError, never a bare std::invalid_argument.
  EXPECT_EQ(postgres::ParseInt64("-42", "t"), -42);
  for (const char* bad : {"", "x", "1.5", " 1", "99999999999999999999"}) {
    try {
      postgres::ParseInt64(bad, "heartbeat");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const StoreError& error) {
      EXPECT_NE(std::string{error.what()}.find("heartbeat: expected an integer"),
                std::string::npos);
    }
  }
  EXPECT_EQ(postgres::NumberArray(std::vector<int>{1, 2}), "{1,2}");
  EXPECT_EQ(postgres::NumberArray(std::vector<std::int64_t>{}), "{}");
}

}  // namespace
}  // namespace outbox::testing
