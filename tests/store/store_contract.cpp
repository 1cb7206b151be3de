#include "store_contract.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

RetryPolicy FastRetry(int max_attempts = 3) {
  RetryPolicy policy;
  policy.initial_delay = milliseconds{1};
  policy.max_delay = milliseconds{4};
  policy.max_attempts = max_attempts;
  return policy;
}

NewMessage Message(std::string topic, std::optional<std::string> stream_key = std::nullopt,
                   std::string payload = R"({"n":1})") {
  NewMessage message;
  message.topic = std::move(topic);
  message.stream_key = std::move(stream_key);
  message.payload = std::move(payload);
  return message;
}

ClaimRequest Request(std::string owner, int max = 100, milliseconds lease = milliseconds{30000}) {
  ClaimRequest request;
  request.owner = std::move(owner);
  request.max_messages = max;
  request.lease_duration = lease;
  return request;
}

std::vector<LeasedId> Leases(const std::vector<Envelope>& batch) {
  std::vector<LeasedId> leases;
  for (const auto& envelope : batch) leases.push_back(LeasedId::Of(envelope));
  return leases;
}

std::unique_ptr<Store> OpenFresh(StoreHarness* harness, const RetryPolicy& retry = FastRetry(),
                                 const RetentionPolicy& retention = {}) {
  harness->Reset();
  return harness->Open(retry, retention);
}

TEST_P(StoreContractTest, EnqueuedMessagesAreClaimedWithAllFields) {
  auto store = OpenFresh(GetParam());
  NewMessage message = Message("orders", "order-42", R"({"id":42})");
  message.type = "OrderPlaced";
  message.headers = {{"correlation_id", "c-1"}, {"x-tenant", "t\xc3\xa9"}};
  message.targets = {"rabbit"};
  const auto ids = store->Enqueue(std::span{&message, 1});
  ASSERT_EQ(ids.size(), 1U);
  EXPECT_EQ(ids[0].version(), 7);

  const auto batch = store->Claim(Request("relay-a"));
  ASSERT_EQ(batch.size(), 1U);
  const Envelope& got = batch[0];
  EXPECT_EQ(got.id, ids[0]);
  EXPECT_EQ(got.topic, "orders");
  EXPECT_EQ(got.stream_key, "order-42");
  EXPECT_EQ(got.stream_seq, 1);
  EXPECT_EQ(got.type, "OrderPlaced");
  EXPECT_EQ(got.payload, R"({"id":42})");
  EXPECT_EQ(got.content_type, "application/json");
  EXPECT_EQ(got.headers, message.headers);
  EXPECT_EQ(got.target, "rabbit");
  EXPECT_EQ(got.attempts, 0);
  EXPECT_GT(got.lease_epoch, 0);
  EXPECT_LT(std::chrono::abs(got.created_at - std::chrono::system_clock::now()),
            std::chrono::seconds{60});
  // Leased: nobody else gets it.
  EXPECT_TRUE(store->Claim(Request("relay-b")).empty());
}

TEST_P(StoreContractTest, BinaryPayloadsSurviveUnchanged) {
  auto store = OpenFresh(GetParam());
  NewMessage message = Message("blobs");
  message.payload = std::string("\x00\x01\xff\xfe zero\x00inside", 16);
  message.content_type = "application/octet-stream";
  store->Enqueue(std::span{&message, 1});
  const auto batch = store->Claim(Request("relay"));
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].payload, message.payload);
  EXPECT_EQ(batch[0].content_type, "application/octet-stream");
}

TEST_P(StoreContractTest, ClaimsOldestFirstInBatches) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages;
  for (int i = 0; i < 25; ++i) messages.push_back(Message("t", std::nullopt, std::to_string(i)));
  const auto ids = store->Enqueue(messages);
  std::vector<MessageId> claimed;
  for (int round = 0; round < 3; ++round) {
    for (const auto& envelope : store->Claim(Request("relay", 10))) claimed.push_back(envelope.id);
  }
  EXPECT_EQ(claimed, ids);
}

TEST_P(StoreContractTest, CompleteRemovesAndIsFencedByOwnerAndEpoch) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages{Message("t"), Message("t"), Message("t")};
  store->Enqueue(messages);
  const auto batch = store->Claim(Request("relay-a"));
  ASSERT_EQ(batch.size(), 3U);

  // Another owner, or a stale epoch, settles nothing.
  auto wrong_owner = store->Complete("relay-b", Leases(batch));
  EXPECT_EQ(wrong_owner.settled, 0);
  EXPECT_EQ(wrong_owner.lease_lost.size(), 3U);
  auto stale = Leases(batch);
  stale[0].lease_epoch -= 1;
  const auto partly = store->Complete("relay-a", stale);
  EXPECT_EQ(partly.settled, 2);
  ASSERT_EQ(partly.lease_lost.size(), 1U);
  EXPECT_EQ(partly.lease_lost[0], batch[0].id);
  // Completing again is harmless (idempotent for retries after an unknown outcome).
  const auto leases = Leases(batch);
  const auto again = store->Complete("relay-a", std::span{leases}.subspan(1));
  EXPECT_EQ(again.settled, 0);

  const auto stats = store->Stats();
  EXPECT_EQ(stats.processing, 1);
  EXPECT_EQ(stats.published, 0);  // deleted on publish by default
}

TEST_P(StoreContractTest, AClaimRoundSettlesTheLastBatchFirstAndSaysWhenTheNextRetryIsDue) {
  RetryPolicy slow = FastRetry();
  slow.initial_delay = milliseconds{60000};
  slow.max_delay = milliseconds{60000};
  slow.jitter = 0;
  auto store = OpenFresh(GetParam(), slow);
  std::vector<NewMessage> messages{Message("t"), Message("t", "s"), Message("t"), Message("t")};
  const auto ids = store->Enqueue(messages);
  const auto first = store->Claim(Request("relay-a", 2));
  ASSERT_EQ(first.size(), 2U);

  // The first batch is settled in the round that claims the next; a lease that is not the
  // caller's (a stale epoch) is reported lost, not settled.
  ClaimRequest request = Request("relay-a", 1);
  request.complete = Leases(first);
  request.complete[0].lease_epoch += 1;
  const auto round = store->ClaimRound(request);
  EXPECT_EQ(round.completed.settled, 1);
  ASSERT_EQ(round.completed.lease_lost.size(), 1U);
  EXPECT_EQ(round.completed.lease_lost[0], first[0].id);
  ASSERT_EQ(round.messages.size(), 1U);
  EXPECT_EQ(round.messages[0].id, ids[2]);
  EXPECT_FALSE(round.next_due) << "something was claimed";
  EXPECT_EQ(store->Stats().processing, 2) << "the settled one is gone (deleted when published)";
  const auto first_leases = Leases(first);
  EXPECT_EQ(store->Complete("relay-a", std::span{first_leases}.first(1)).settled, 1);

  // Its retry waits a minute: a claim that finds nothing says when it is due.
  const FailedMessage failed =
      FailedMessage::Of(round.messages[0], Failure{FailureKind::kRejected, "no route"});
  ASSERT_EQ(store->Fail("relay-a", std::span{&failed, 1}).settled, 1);
  const auto last = store->Claim(Request("relay-a"));
  ASSERT_EQ(last.size(), 1U);
  const auto idle = store->ClaimRound(Request("relay-a"));
  EXPECT_TRUE(idle.messages.empty());
  ASSERT_TRUE(idle.next_due);
  EXPECT_GT(*idle.next_due, milliseconds{50000});
  EXPECT_LE(*idle.next_due, milliseconds{60000});
  // Not for a paused target (it would not be claimed when due), and nothing without a retry.
  ClaimRequest paused = Request("relay-a");
  paused.paused_targets = {round.messages[0].target};
  EXPECT_FALSE(store->ClaimRound(paused).next_due);
  const auto settle_last = Leases(last);
  EXPECT_EQ(store->Complete("relay-a", settle_last).settled, 1);
}

TEST_P(StoreContractTest, PublishedRowsAreKeptWhenRetentionSaysSo) {
  RetentionPolicy retention;
  retention.published = std::chrono::seconds{3600};
  auto store = OpenFresh(GetParam(), FastRetry(), retention);
  std::vector<NewMessage> messages{Message("t"), Message("t")};
  store->Enqueue(messages);
  const auto batch = store->Claim(Request("relay"));
  EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 2);
  EXPECT_EQ(store->Stats().published, 2);
  EXPECT_TRUE(store->Claim(Request("relay")).empty());
  // Purge keeps them until their retention passes.
  EXPECT_EQ(store->Purge(retention, 100), 0);
  EXPECT_EQ(store->Purge(RetentionPolicy{.published = std::chrono::seconds{0},
                                         .abandoned = std::chrono::seconds{0}},
                         1),
            1);  // bounded chunk
  EXPECT_EQ(store->Stats().published, 1);
}

TEST_P(StoreContractTest, ExpiredLeaseIsReclaimedAndOldOwnerIsFenced) {
  auto store = OpenFresh(GetParam());
  NewMessage message = Message("t");
  store->Enqueue(std::span{&message, 1});
  const auto first = store->Claim(Request("relay-a", 10, milliseconds{50}));
  ASSERT_EQ(first.size(), 1U);
  EXPECT_EQ(store->ReclaimExpired({}), 0);  // not expired yet
  std::this_thread::sleep_for(milliseconds{120});
  EXPECT_EQ(store->ReclaimExpired({}), 1);
  const auto second = store->Claim(Request("relay-b"));
  ASSERT_EQ(second.size(), 1U);
  EXPECT_EQ(second[0].id, first[0].id);
  EXPECT_GT(second[0].lease_epoch, first[0].lease_epoch);

  // The paused first owner wakes up: its completion, renewal and failure are all refused.
  EXPECT_EQ(store->Complete("relay-a", Leases(first)).lease_lost.size(), 1U);
  EXPECT_EQ(store->Renew("relay-a", Leases(first), milliseconds{1000}).settled, 0);
  const FailedMessage failed = FailedMessage::Of(first[0], Failure{FailureKind::kRejected, "late"});
  EXPECT_EQ(store->Fail("relay-a", std::span{&failed, 1}).settled, 0);
  // Even under the same owner name (a restarted relay), the old epoch is fenced.
  EXPECT_EQ(store->Complete("relay-b", Leases(first)).settled, 0);
  EXPECT_EQ(store->Complete("relay-b", Leases(second)).settled, 1);
}

TEST_P(StoreContractTest, AnExpiredLeaseStillInFlightIsNotReclaimed) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages{Message("t"), Message("t")};
  store->Enqueue(messages);
  const auto batch = store->Claim(Request("relay", 10, milliseconds{50}));
  ASSERT_EQ(batch.size(), 2U);
  std::this_thread::sleep_for(milliseconds{120});
  ReclaimRequest request;
  request.owner = "relay";
  request.in_flight = {batch[0].id};  // the relay is still publishing this one
  EXPECT_EQ(store->ReclaimExpired(request), 1);
  EXPECT_EQ(store->ReclaimExpired(request), 0);
  EXPECT_EQ(store->Complete("relay", Leases({batch[0]})).settled, 1);
  EXPECT_EQ(store->Complete("relay", Leases({batch[1]})).lease_lost.size(), 1U);
}

// After a claim whose reply was lost, the relay gives back its own unexpired leases (all but
// those in flight) and nobody else's; the next claim then starts from the stream's head again.
TEST_P(StoreContractTest, OwnUnexpiredLeasesAreGivenBackOnlyWhenAsked) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages{Message("t", "s"), Message("t", "s"), Message("t", "o")};
  store->Enqueue(messages);
  const auto mine = store->Claim(Request("relay", 2, milliseconds{60000}));
  ASSERT_EQ(mine.size(), 2U);
  const auto theirs = store->Claim(Request("other", 1, milliseconds{60000}));
  ASSERT_EQ(theirs.size(), 1U);

  ReclaimRequest request;
  request.owner = "relay";
  EXPECT_EQ(store->ReclaimExpired(request), 0) << "nothing has expired";
  request.own_unexpired = true;
  request.in_flight = {mine[1].id};
  EXPECT_EQ(store->ReclaimExpired(request), 1) << "only the relay's lease not in flight";
  EXPECT_EQ(store->Complete("relay", Leases({mine[0]})).lease_lost.size(), 1U);
  EXPECT_EQ(store->Complete("relay", Leases({mine[1]})).settled, 1);
  EXPECT_EQ(store->Complete("other", Leases({theirs[0]})).settled, 1);
  const auto again = store->Claim(Request("relay", 10, milliseconds{60000}));
  ASSERT_EQ(again.size(), 1U);
  EXPECT_EQ(again[0].id, mine[0].id);
}

// A message of topic "t" for `target`.
NewMessage ForTarget(std::string target, std::optional<std::string> stream) {
  NewMessage message = Message("t", std::move(stream));
  message.targets = {std::move(target)};
  return message;
}

// A paused target's messages are not claimed; every other message is, the other targets'
// messages of the same stream included (a stream is ordered per target: issue #24).
TEST_P(StoreContractTest, PausedTargetsAreNotClaimedAndHoldBackOnlyThemselves) {
  auto store = OpenFresh(GetParam());
  const auto to = ForTarget;
  std::vector<NewMessage> messages{
      to("dead", "s"),             // 0: paused
      to("default", "s"),          // 1: same stream, another target: free
      to("default", "other"),      // 2: free
      to("dead", std::nullopt),    // 3: paused
      to("default", std::nullopt)  // 4: free
  };
  const auto ids = store->Enqueue(messages);
  ClaimRequest request = Request("relay");
  request.paused_targets = {"dead"};
  const auto batch = store->Claim(request);
  std::vector<MessageId> claimed;
  for (const auto& envelope : batch) claimed.push_back(envelope.id);
  EXPECT_EQ(claimed, (std::vector<MessageId>{ids[1], ids[2], ids[4]}));
  EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 3);
  EXPECT_TRUE(store->Claim(request).empty());

  // Resumed: in stream order, nothing spent.
  const auto rest = store->Claim(Request("relay"));
  claimed.clear();
  for (const auto& envelope : rest) {
    claimed.push_back(envelope.id);
    EXPECT_EQ(envelope.attempts, 0);
  }
  EXPECT_EQ(claimed, (std::vector<MessageId>{ids[0], ids[3]}));
}

// Claims made while a target is paused may move past its messages (PostgreSQL's claim cursor
// does): once the target resumes, they are claimed, oldest first, in their stream's order.
TEST_P(StoreContractTest, APausedTargetsMessagesAreClaimedWhenItResumesAfterManyClaims) {
  auto store = OpenFresh(GetParam());
  const auto to = ForTarget;
  const std::vector<NewMessage> waiting{to("dead", "s"), to("dead", std::nullopt)};
  const auto dead = store->Enqueue(waiting);
  ClaimRequest paused = Request("relay");
  paused.paused_targets = {"dead"};
  for (int round = 0; round < 4; ++round) {
    const std::vector<NewMessage> filler{to("default", "s"), to("default", std::nullopt)};
    store->Enqueue(filler);
    const auto batch = store->Claim(paused);
    ASSERT_EQ(batch.size(), 2U) << "round " << round;
    for (const auto& envelope : batch) EXPECT_EQ(envelope.target, "default");
    EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 2);
  }
  const std::vector<NewMessage> later{to("dead", "s")};
  const auto behind = store->Enqueue(later);
  EXPECT_TRUE(store->Claim(paused).empty());

  const auto resumed = store->Claim(Request("relay"));
  std::vector<MessageId> claimed;
  for (const auto& envelope : resumed) claimed.push_back(envelope.id);
  EXPECT_EQ(claimed, (std::vector<MessageId>{dead[0], dead[1], behind[0]}));
  ASSERT_EQ(resumed.size(), 3U);
  EXPECT_EQ(resumed[0].stream_seq, 1);
  EXPECT_EQ(resumed[2].stream_seq, 2) << "stream_seq counts per target";
}

// Issue #24: a message written to several targets is one message per target, each with its own
// id and stream_seq (per target and stream), all with the first copy's id as their event id.
TEST_P(StoreContractTest, AMessageForSeveralTargetsIsOneCopyPerTargetWithOneEventId) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages;
  for (int i = 1; i <= 2; ++i) {
    NewMessage message = Message("orders", "order-1", R"({"n":)" + std::to_string(i) + "}");
    message.type = "OrderPlaced";
    message.headers = {{"correlation_id", "c-" + std::to_string(i)}};
    message.targets = {"partner", "default"};
    messages.push_back(std::move(message));
  }
  messages.push_back(ForTarget("default", "order-1"));  // one target: its own event id
  const auto event_ids = store->Enqueue(messages);
  ASSERT_EQ(event_ids.size(), 3U);

  const auto batch = store->Claim(Request("relay"));
  ASSERT_EQ(batch.size(), 5U);
  std::map<std::string, std::vector<const Envelope*>> by_target;
  std::set<MessageId> ids;
  for (const auto& envelope : batch) {
    by_target[envelope.target].push_back(&envelope);
    ids.insert(envelope.id);
  }
  EXPECT_EQ(ids.size(), 5U) << "every copy has an id of its own";
  ASSERT_EQ(by_target["partner"].size(), 2U);
  ASSERT_EQ(by_target["default"].size(), 3U);
  for (std::size_t i = 0; i < 2; ++i) {
    const Envelope& partner = *by_target["partner"][i];
    const Envelope& internal = *by_target["default"][i];
    EXPECT_EQ(partner.id, event_ids[i]) << "the event id is the first target's copy's id";
    ASSERT_TRUE(partner.event_id.has_value());
    ASSERT_TRUE(internal.event_id.has_value());
    EXPECT_EQ(*partner.event_id, event_ids[i]);
    EXPECT_EQ(*internal.event_id, event_ids[i]);
    EXPECT_EQ(partner.stream_seq, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(internal.stream_seq, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(partner.payload, internal.payload);
    EXPECT_EQ(partner.type, internal.type);
    EXPECT_EQ(partner.headers, internal.headers);
    EXPECT_EQ(partner.topic, "orders");
  }
  const Envelope& single = *by_target["default"][2];
  EXPECT_EQ(single.id, event_ids[2]);
  EXPECT_FALSE(single.event_id.has_value());
  EXPECT_EQ(single.EventId(), single.id);
  EXPECT_EQ(single.stream_seq, 3) << "the default target's stream went on from its own seqs";
}

// Issue #24: a target whose message waits for its retry holds back its own later messages of the
// stream, not the other targets' copies.
TEST_P(StoreContractTest, AFailedCopyHoldsBackOnlyItsOwnTargetsStream) {
  RetryPolicy slow = FastRetry();
  slow.initial_delay = std::chrono::seconds{60};
  slow.max_delay = std::chrono::seconds{60};
  auto store = OpenFresh(GetParam(), slow);
  std::vector<NewMessage> messages;
  for (int i = 1; i <= 3; ++i) {
    NewMessage message = Message("t", "s", R"({"n":)" + std::to_string(i) + "}");
    message.targets = {"a", "b"};
    messages.push_back(std::move(message));
  }
  store->Enqueue(messages);
  // All six claimed; a's first fails (its retry is a minute away), b's first is published, the
  // rest goes back unpublished.
  const auto all = store->Claim(Request("relay"));
  ASSERT_EQ(all.size(), 6U);
  std::vector<LeasedId> back;
  for (const auto& envelope : all) {
    if (envelope.stream_seq != 1) {
      back.push_back(LeasedId::Of(envelope));
    } else if (envelope.target == "a") {
      const FailedMessage failed =
          FailedMessage::Of(envelope, Failure{FailureKind::kRejected, "nack"});
      EXPECT_EQ(store->Fail("relay", std::span{&failed, 1}).settled, 1);
    } else {
      const LeasedId done = LeasedId::Of(envelope);
      EXPECT_EQ(store->Complete("relay", std::span{&done, 1}).settled, 1);
    }
  }
  EXPECT_EQ(store->Release("relay", back).settled, 4);
  const auto rest = store->Claim(Request("relay"));
  std::vector<std::pair<std::string, std::int64_t>> claimed;
  for (const auto& envelope : rest) claimed.emplace_back(envelope.target, *envelope.stream_seq);
  EXPECT_EQ(claimed, (std::vector<std::pair<std::string, std::int64_t>>{{"b", 2}, {"b", 3}}))
      << "a's seqs 2 and 3 wait for a's 1; b's go";
}

TEST_P(StoreContractTest, RenewKeepsTheLease) {
  auto store = OpenFresh(GetParam());
  NewMessage message = Message("t");
  store->Enqueue(std::span{&message, 1});
  const auto batch = store->Claim(Request("relay", 10, milliseconds{100}));
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(store->Renew("relay", Leases(batch), milliseconds{60000}).settled, 1);
  std::this_thread::sleep_for(milliseconds{200});
  EXPECT_EQ(store->ReclaimExpired({}), 0);
  EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 1);
}

TEST_P(StoreContractTest, ReleaseGivesMessagesBackWithoutSpendingAttempts) {
  auto store = OpenFresh(GetParam());
  NewMessage message = Message("t");
  store->Enqueue(std::span{&message, 1});
  const auto batch = store->Claim(Request("relay"));
  EXPECT_EQ(store->Release("relay", Leases(batch)).settled, 1);
  const auto again = store->Claim(Request("relay"));
  ASSERT_EQ(again.size(), 1U);
  EXPECT_EQ(again[0].attempts, 0);
}

TEST_P(StoreContractTest, RejectionsFollowTheRetryPolicyAndEndAbandoned) {
  auto store = OpenFresh(GetParam(), FastRetry(3));
  NewMessage message = Message("t");
  store->Enqueue(std::span{&message, 1});
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::vector<Envelope> batch;
    for (int i = 0; i < 200 && batch.empty(); ++i) {  // the retry delay is a few milliseconds
      batch = store->Claim(Request("relay"));
      if (batch.empty()) std::this_thread::sleep_for(milliseconds{2});
    }
    ASSERT_EQ(batch.size(), 1U) << "attempt " << attempt;
    EXPECT_EQ(batch[0].attempts, attempt - 1);
    const FailedMessage failed = FailedMessage::Of(
        batch[0], Failure{FailureKind::kRejected, "no route " + std::to_string(attempt)});
    EXPECT_EQ(store->Fail("relay", std::span{&failed, 1}).settled, 1);
  }
  std::this_thread::sleep_for(milliseconds{20});
  EXPECT_TRUE(store->Claim(Request("relay")).empty());
  const auto stats = store->Stats();
  EXPECT_EQ(stats.abandoned, 1);
  EXPECT_EQ(stats.pending + stats.failed + stats.processing, 0);
}

TEST_P(StoreContractTest, PermanentFailuresAbandonAtOnceAndOutagesSpendNothing) {
  auto store = OpenFresh(GetParam(), FastRetry(3));
  std::vector<NewMessage> messages{Message("t"), Message("t")};
  store->Enqueue(messages);
  auto batch = store->Claim(Request("relay"));
  ASSERT_EQ(batch.size(), 2U);
  const std::vector<FailedMessage> failures{
      FailedMessage::Of(batch[0], Failure{FailureKind::kPermanent, "message too large"}),
      FailedMessage::Of(batch[1], Failure{FailureKind::kUnavailable, "connection refused"})};
  EXPECT_EQ(store->Fail("relay", failures).settled, 2);
  EXPECT_EQ(store->Stats().abandoned, 1);
  // An outage many times longer than max_attempts abandons nothing.
  for (int i = 0; i < 10; ++i) {
    batch = store->Claim(Request("relay"));
    ASSERT_EQ(batch.size(), 1U);
    EXPECT_EQ(batch[0].attempts, 0);
    const FailedMessage outage =
        FailedMessage::Of(batch[0], Failure{FailureKind::kOutcomeUnknown, "no confirm"});
    EXPECT_EQ(store->Fail("relay", std::span{&outage, 1}).settled, 1);
  }
  EXPECT_EQ(store->Stats().abandoned, 1);
}

TEST_P(StoreContractTest, AFailedMessageHoldsBackOnlyItsOwnStream) {
  RetryPolicy slow = FastRetry(5);
  slow.initial_delay = milliseconds{60000};
  slow.max_delay = milliseconds{60000};
  auto store = OpenFresh(GetParam(), slow);
  std::vector<NewMessage> messages{Message("t", "a"), Message("t", "a"), Message("t", "b"),
                                   Message("t", "b")};
  const auto ids = store->Enqueue(messages);
  auto batch = store->Claim(Request("relay", 1));
  ASSERT_EQ(batch.size(), 1U);
  ASSERT_EQ(batch[0].id, ids[0]);  // a#1
  // While a#1 is leased by "relay", another owner must not take a#2; b flows.
  auto next = store->Claim(Request("other", 10));
  ASSERT_EQ(next.size(), 2U);
  EXPECT_EQ(next[0].id, ids[2]);
  EXPECT_EQ(next[1].id, ids[3]);
  // a#1 fails with a long backoff: a#2 waits, for every owner.
  const FailedMessage failed = FailedMessage::Of(batch[0], Failure{FailureKind::kRejected, "nack"});
  store->Fail("relay", std::span{&failed, 1});
  EXPECT_TRUE(store->Claim(Request("relay", 10)).empty());
  EXPECT_TRUE(store->Claim(Request("other", 10)).empty());
  EXPECT_EQ(store->Stats().failed, 1);
}

// A destination that asked to wait (an HTTP endpoint's 429 with Retry-After) holds its message
// back without spending an attempt, and the rest of its stream, given back with no delay (not
// sent behind it), waits behind it like behind a rejected message; other streams flow.
TEST_P(StoreContractTest, AMessageWaitingForRetryAfterHoldsBackItsStream) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages{Message("t", "a"), Message("t", "a"), Message("t", "a"),
                                   Message("t", "b")};
  const auto ids = store->Enqueue(messages);
  auto batch = store->Claim(Request("relay", 10));
  ASSERT_EQ(batch.size(), 4U);
  const Failure wait{FailureKind::kUnavailable, "the endpoint asked to wait", milliseconds{60000}};
  const Failure behind{FailureKind::kOutcomeUnknown, "not sent: an earlier message failed"};
  const std::vector<FailedMessage> failed{
      FailedMessage::Of(batch[0], wait), FailedMessage::Of(batch[1], behind),
      FailedMessage::Of(batch[2], behind), FailedMessage::Of(batch[3], behind)};
  EXPECT_EQ(store->Fail("relay", failed).settled, 4);
  const auto next = store->Claim(Request("relay", 10));
  ASSERT_EQ(next.size(), 1U);
  EXPECT_EQ(next[0].id, ids[3]);  // b; a#2 and a#3 wait for a#1
  EXPECT_TRUE(store->Claim(Request("other", 10)).empty());
  const StoreStats stats = store->Stats();
  EXPECT_EQ(stats.failed, 1);  // a#1, until it is due
  EXPECT_EQ(stats.pending, 2);
}

TEST_P(StoreContractTest, AnOwnerMayClaimBehindItsOwnLeases) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages{Message("t", "a"), Message("t", "a")};
  const auto ids = store->Enqueue(messages);
  ASSERT_EQ(store->Claim(Request("relay", 1)).size(), 1U);
  EXPECT_TRUE(store->Claim(Request("other", 10)).empty());
  const auto next = store->Claim(Request("relay", 10));  // pipelining: the next batch
  ASSERT_EQ(next.size(), 1U);
  EXPECT_EQ(next[0].id, ids[1]);
}

TEST_P(StoreContractTest, AnAbandonedMessageNoLongerHoldsBackItsStream) {
  auto store = OpenFresh(GetParam(), FastRetry(1));
  std::vector<NewMessage> messages{Message("t", "a"), Message("t", "a")};
  const auto ids = store->Enqueue(messages);
  auto batch = store->Claim(Request("relay", 1));
  ASSERT_EQ(batch.size(), 1U);
  const FailedMessage failed = FailedMessage::Of(batch[0], Failure{FailureKind::kRejected, "nack"});
  store->Fail("relay", std::span{&failed, 1});  // max_attempts 1: abandoned
  const auto next = store->Claim(Request("relay", 10));
  ASSERT_EQ(next.size(), 1U);
  EXPECT_EQ(next[0].id, ids[1]);
  EXPECT_EQ(next[0].stream_seq, 2);
}

// A claimed message carries stream_prev_seq only when the message just before it in its stream
// was abandoned: the seq of the latest earlier message that was not, 0 if none. Published rows,
// deleted or kept, are not abandoned; other streams, unkeyed and unsequenced messages get none.
TEST_P(StoreContractTest, ClaimSetsStreamPrevSeqOnlyAfterAbandonedPredecessors) {
  for (const auto published : {std::chrono::seconds{0}, std::chrono::seconds{3600}}) {
    SCOPED_TRACE("published retention " + std::to_string(published.count()) + " s");
    auto store = OpenFresh(GetParam(), FastRetry(1), RetentionPolicy{.published = published});
    NewMessage unsequenced = Message("t", "e");
    unsequenced.sequenced = false;
    // a1 published, a2 a3 abandoned; c1 abandoned; d1 abandoned, d2 published, d3 abandoned;
    // e (unsequenced) abandoned.
    std::vector<NewMessage> first{Message("t", "a"), Message("t", "a"), Message("t", "a"),
                                  Message("t", "c"), Message("t", "d"), Message("t", "d"),
                                  Message("t", "d"), unsequenced};
    store->Enqueue(first);
    const auto batch = store->Claim(Request("relay"));
    ASSERT_EQ(batch.size(), first.size());
    for (const auto& envelope : batch) EXPECT_FALSE(envelope.stream_prev_seq.has_value());
    std::vector<LeasedId> done;
    std::vector<FailedMessage> failed;
    for (const auto& envelope : batch) {
      if ((envelope.stream_key == "a" && envelope.stream_seq == 1) ||
          (envelope.stream_key == "d" && envelope.stream_seq == 2)) {
        done.push_back(LeasedId::Of(envelope));
      } else {
        failed.push_back(FailedMessage::Of(envelope, Failure{FailureKind::kRejected, "nack"}));
      }
    }
    EXPECT_EQ(store->Complete("relay", done).settled, 2);
    EXPECT_EQ(store->Fail("relay", failed).settled, 6);  // max_attempts 1: abandoned
    ASSERT_EQ(store->Stats().abandoned, 6);

    std::vector<NewMessage> second{Message("t", "a"), Message("t", "a"), Message("t", "b"),
                                   Message("t", "c"), Message("t", "d"), Message("t"),
                                   unsequenced};
    store->Enqueue(second);
    std::map<std::string, std::optional<std::int64_t>> prev;  // "a4" -> stream_prev_seq
    for (const auto& envelope : store->Claim(Request("relay"))) {
      prev[envelope.stream_key.value_or("-") +
           (envelope.stream_seq ? std::to_string(*envelope.stream_seq) : "")] =
          envelope.stream_prev_seq;
    }
    EXPECT_EQ(prev, (std::map<std::string, std::optional<std::int64_t>>{
                        {"a4", 1},  // after a3 and a2, abandoned; a1 was published
                        {"a5", std::nullopt},
                        {"b1", std::nullopt},
                        {"c2", 0},  // the stream's first message was abandoned
                        {"d4", 2},  // d3 abandoned, d2 published
                        {"-", std::nullopt},
                        {"e", std::nullopt}}));
  }
}

TEST_P(StoreContractTest, StatsCountByStatus) {
  auto store = OpenFresh(GetParam());
  std::vector<NewMessage> messages(5, Message("t"));
  store->Enqueue(messages);
  auto stats = store->Stats();
  EXPECT_EQ(stats.pending, 5);
  ASSERT_TRUE(stats.oldest_pending_age.has_value());
  EXPECT_LT(*stats.oldest_pending_age, milliseconds{60000});
  EXPECT_EQ(stats.active_leases, 0);
  store->Claim(Request("relay-a", 2));
  store->Claim(Request("relay-b", 1));
  stats = store->Stats();
  EXPECT_EQ(stats.pending, 2);
  EXPECT_EQ(stats.processing, 3);
  EXPECT_EQ(stats.active_leases, 2);
  EXPECT_FALSE(stats.counts_estimated);
}

TEST_P(StoreContractTest, BadArgumentsAreRefused) {
  auto store = OpenFresh(GetParam());
  EXPECT_THROW(store->Claim(Request("")), std::invalid_argument);
  EXPECT_THROW(store->Claim(Request("relay", 0)), std::invalid_argument);
  EXPECT_THROW(store->Claim(Request("relay", 10, milliseconds{0})), std::invalid_argument);
  EXPECT_THROW(store->Purge({}, 0), std::invalid_argument);
  NewMessage bad = Message("");
  EXPECT_THROW(store->Enqueue(std::span{&bad, 1}), InvalidMessage);
  bad = Message("t");
  bad.headers = {{"message_id", "forged"}};
  EXPECT_THROW(store->Enqueue(std::span{&bad, 1}), InvalidMessage);
  EXPECT_EQ(store->Stats().pending, 0);  // nothing half-written
}

}  // namespace
}  // namespace outbox::testing
