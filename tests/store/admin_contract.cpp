// The Admin contract (outbox/store/admin.h) against every store: list filters and pagination,
// show, replay, abandon, purge, the backlog by topic, and bad input.
#include "admin_contract.h"

#include <algorithm>
#include <map>

namespace outbox::testing {
namespace {

std::vector<MessageId> Concat(std::vector<MessageId> a, const std::vector<MessageId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

TEST_P(AdminContractTest, ListFiltersByStatusTopicStreamTargetAgeAndIds) {
  const auto orders = Enqueue(3, "orders", "order-1");
  const auto other_order = Enqueue(2, "orders", "order-2");
  const auto clicks = Enqueue(4, "clicks", std::nullopt, "kafka");
  const auto rejected = std::vector<MessageId>{orders[0], clicks[1]};
  Abandon(rejected);
  harness_->Backdate({clicks[2], orders[1]}, std::chrono::hours{2});

  EXPECT_EQ(ListAll({}).size(), 9U);
  MessageFilter filter;
  filter.status = MessageStatus::kAbandoned;
  EXPECT_EQ(ListAll(filter), rejected);
  filter = {};
  filter.topic = "orders";
  EXPECT_EQ(ListAll(filter), Concat(orders, other_order));
  filter.stream_key = "order-2";
  EXPECT_EQ(ListAll(filter), other_order);
  filter = {};
  filter.target = "kafka";
  EXPECT_EQ(ListAll(filter), clicks);
  filter.status = MessageStatus::kPending;
  EXPECT_EQ(ListAll(filter), (std::vector<MessageId>{clicks[0], clicks[2], clicks[3]}));
  filter = {};
  filter.older_than = std::chrono::hours{1};
  EXPECT_EQ(ListAll(filter), Concat({orders[1]}, {clicks[2]}));
  filter.older_than = std::chrono::hours{3};
  EXPECT_TRUE(ListAll(filter).empty());
  EXPECT_EQ(ListAll(ById({other_order[1], clicks[3]})), Concat({other_order[1]}, {clicks[3]}));
  EXPECT_TRUE(ListAll(ById({})).empty()) << "an empty id list matches nothing";
  filter = {};
  filter.topic = "orders' OR '1'='1";  // bound, never spliced into the statement
  EXPECT_TRUE(ListAll(filter).empty());

  // What a row says.
  filter = ById({orders[0]});
  const auto page = admin_->List(filter, 10);
  ASSERT_EQ(page.messages.size(), 1U);
  const auto& row = page.messages[0];
  EXPECT_EQ(row.topic, "orders");
  EXPECT_EQ(row.stream_key, "order-1");
  EXPECT_EQ(row.stream_seq, 1);
  EXPECT_EQ(row.target, "default");
  EXPECT_EQ(row.status, MessageStatus::kAbandoned);
  EXPECT_EQ(row.attempts, 1);
  EXPECT_EQ(row.last_error, "rejected: NOT_FOUND - no queue");
  EXPECT_EQ(row.payload_bytes, 7);  // {"n":0}
  EXPECT_FALSE(row.lease_owner.has_value());
  EXPECT_FALSE(page.more);
  EXPECT_GE(page.database_now, row.created_at);
  EXPECT_GT(row.created_at, page.database_now - std::chrono::minutes{10});
}

// Issue #24: every copy of a message written to several targets shows the same event id, and a
// filter by event id finds them all (and, for a message written to one target, itself).
TEST_P(AdminContractTest, TheCopiesOfOneEventShareItsIdAndAreFoundByIt) {
  NewMessage fanned;
  fanned.topic = "orders";
  fanned.stream_key = "order-7";
  fanned.payload = R"({"n":7})";
  fanned.targets = {"default", "partner", "audit"};
  const auto fanned_event = store_->Enqueue(std::span{&fanned, 1});
  const auto single = Enqueue(2, "orders", "order-7");
  ASSERT_EQ(fanned_event.size(), 1U);

  const auto all = admin_->List({}, 100);
  ASSERT_EQ(all.messages.size(), 5U);
  std::map<std::string, int> copies_per_target;
  for (const auto& message : all.messages) {
    if (message.event_id == fanned_event[0]) {
      ++copies_per_target[message.target];
    } else {
      EXPECT_EQ(message.event_id, message.id) << "a single-target message is its own event";
    }
  }
  EXPECT_EQ(copies_per_target,
            (std::map<std::string, int>{{"audit", 1}, {"default", 1}, {"partner", 1}}));

  MessageFilter by_event;
  by_event.event_id = fanned_event[0];
  const auto copies = admin_->List(by_event, 100);
  ASSERT_EQ(copies.messages.size(), 3U);
  for (const auto& message : copies.messages) EXPECT_EQ(message.event_id, fanned_event[0]);
  EXPECT_EQ(admin_->Show(copies.messages[1].id)->summary.event_id, fanned_event[0]);
  by_event.target = "partner";
  EXPECT_EQ(admin_->List(by_event, 100).messages.size(), 1U) << "criteria combine";

  by_event = {};
  by_event.event_id = single[1];
  const auto itself = admin_->List(by_event, 100);
  ASSERT_EQ(itself.messages.size(), 1U);
  EXPECT_EQ(itself.messages[0].id, single[1]);

  // An operation given the event id reaches every copy: abandon them all, dry run.
  by_event.event_id = fanned_event[0];
  EXPECT_EQ(admin_->Abandon(by_event, "test", /*dry_run=*/true).count, 3);
}

TEST_P(AdminContractTest, PagesCoverEveryMatchingMessageExactlyOnce) {
  std::vector<MessageId> all;
  for (int i = 0; i < 4; ++i) all = Concat(all, Enqueue(5, "t", "k" + std::to_string(i)));
  const std::vector<MessageId> abandoned{all[3], all[4], all[9], all[17]};
  Abandon(abandoned);

  // 20 messages, pages of 5, 6 and 7: the last page's `more` is false even when it is full.
  for (const int limit : {5, 6, 7, 20, 21}) {
    std::vector<MessageId> seen;
    std::optional<MessageId> after;
    int pages = 0;
    for (;;) {
      const auto page = admin_->List({}, limit, after);
      ++pages;
      ASSERT_LE(page.messages.size(), static_cast<std::size_t>(limit));
      for (const auto& message : page.messages) seen.push_back(message.id);
      if (!page.more) break;
      ASSERT_EQ(page.messages.size(), static_cast<std::size_t>(limit));
      after = page.messages.back().id;
      ASSERT_LT(pages, 100);
    }
    EXPECT_EQ(seen, all) << "limit " << limit;
    EXPECT_EQ(pages, (20 + limit - 1) / limit) << "limit " << limit;
  }

  // Pages of a filtered listing, with messages written between pages.
  MessageFilter pending;
  pending.status = MessageStatus::kPending;
  auto first = admin_->List(pending, 10);
  ASSERT_TRUE(first.more);
  const auto late = Enqueue(2, "t");
  auto second = admin_->List(pending, 10, first.messages.back().id);
  EXPECT_FALSE(second.more);
  std::vector<MessageId> seen = Concat(Ids(first), Ids(second));
  std::vector<MessageId> expected;
  for (const auto& id : Concat(all, late)) {
    if (std::find(abandoned.begin(), abandoned.end(), id) == abandoned.end()) {
      expected.push_back(id);
    }
  }
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(admin_->List({}, 5, all.back()).messages.size(), 2U);  // only the late ones
}

TEST_P(AdminContractTest, ShowReturnsTheWholeMessage) {
  NewMessage message;
  message.topic = "bin";
  message.payload = std::string("\x00\x01\xff", 3);
  message.content_type = "application/octet-stream";
  message.type = "Blob";
  message.headers = {{"traceparent", "00-abc-01"}, {"tenant_id", "7"}};
  const auto id = store_->Enqueue(std::span<const NewMessage>{&message, 1}).at(0);

  const auto detail = admin_->Show(id);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->summary.id, id);
  EXPECT_EQ(detail->summary.type, "Blob");
  EXPECT_EQ(detail->payload, message.payload);
  EXPECT_EQ(detail->summary.payload_bytes, 3);
  EXPECT_EQ(detail->content_type, "application/octet-stream");
  EXPECT_EQ(detail->headers, message.headers);
  EXPECT_EQ(detail->summary.status, MessageStatus::kPending);
  EXPECT_FALSE(detail->abandoned_at.has_value());
  EXPECT_FALSE(detail->published_at.has_value());
  EXPECT_GE(detail->database_now, detail->summary.created_at);

  EXPECT_FALSE(admin_->Show(NewUuidV7()).has_value());
}

TEST_P(AdminContractTest, ReplayKeepsTheIdAndMakesTheMessageClaimableWithAttemptsReset) {
  const auto ids = Enqueue(3, "orders", "order-9");
  Abandon({ids[0]});
  ASSERT_EQ(Column(ids[0], "status"), "abandoned");
  // The stream's later messages went on without it (abandoned does not block its stream).
  MessageFilter filter = ById({ids[0], ids[1]});
  const auto result = admin_->Replay(filter, /*dry_run=*/false);
  EXPECT_EQ(result.count, 1);
  EXPECT_EQ(result.ids, std::vector<MessageId>{ids[0]}) << "the pending one is not replayed";

  const auto detail = admin_->Show(ids[0]);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->summary.status, MessageStatus::kPending);
  EXPECT_EQ(detail->summary.attempts, 0);
  EXPECT_EQ(detail->summary.last_error,
            "replayed by operator; was: rejected: NOT_FOUND - no queue");
  EXPECT_FALSE(detail->abandoned_at.has_value());
  EXPECT_LE(detail->summary.available_at, detail->database_now);
  EXPECT_EQ(Column(ids[0], "stream_seq"), "1");

  ClaimRequest request;
  request.owner = "relay-2";
  const auto batch = store_->Claim(request);
  ASSERT_EQ(batch.size(), 3U);
  EXPECT_EQ(batch[0].id, ids[0]) << "same id, still first in its stream";
  EXPECT_EQ(batch[0].attempts, 0);
  EXPECT_EQ(batch[0].stream_seq, 1);

  // Replaying again finds nothing to do: it is processing now.
  EXPECT_EQ(admin_->Replay(ById({ids[0]}), false).count, 0);
}

TEST_P(AdminContractTest, ReplayAlsoRetriesFailedMessagesNow) {
  auto patient = OpenStore(/*max_attempts=*/5);
  const auto ids = Enqueue(2, "t");
  Reject(*patient, {ids[0]});
  ASSERT_EQ(Column(ids[0], "status"), "failed");
  ClaimRequest request;
  request.owner = "relay";
  ASSERT_EQ(store_->Claim(request).size(), 1U) << "the failed one waits an hour";
  MessageFilter failed;
  failed.status = MessageStatus::kFailed;
  EXPECT_EQ(admin_->Replay(failed, false).ids, std::vector<MessageId>{ids[0]});
  const auto batch = store_->Claim(request);
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, ids[0]);
  EXPECT_EQ(batch[0].attempts, 0);
}

TEST_P(AdminContractTest, ReplayAndAbandonNeverTouchAProcessingRow) {
  const auto ids = Enqueue(3, "orders");
  Abandon({ids[0]});
  // Replayed, then claimed: processing under a lease.
  ASSERT_EQ(admin_->Replay(ById({ids[0]}), false).count, 1);
  const Envelope leased = Lease(ids[0]);
  const std::string before = harness_->Snapshot();

  MessageFilter topic;
  topic.topic = "orders";
  EXPECT_EQ(admin_->Replay(ById({ids[0]}), false).count, 0);
  EXPECT_EQ(admin_->Replay(topic, false).count, 0);
  EXPECT_EQ(admin_->Abandon(ById({ids[0]}), "stop", false).count, 0);
  EXPECT_EQ(harness_->Snapshot(), before);
  const auto abandoned = admin_->Abandon(topic, "stop", false);
  EXPECT_EQ(abandoned.ids, (std::vector<MessageId>{ids[1], ids[2]}));
  EXPECT_EQ(Column(ids[0], "status"), "processing");
  EXPECT_EQ(Column(ids[0], "lease_owner"), "busy-relay");

  // The relay still settles it.
  const LeasedId settled[] = {LeasedId::Of(leased)};
  EXPECT_EQ(store_->Complete("busy-relay", settled).settled, 1);
}

TEST_P(AdminContractTest, DryRunsChangeNothing) {
  const auto ids = Enqueue(4, "t", "k");
  Abandon({ids[0], ids[2]});
  const std::string before = harness_->Snapshot();

  MessageFilter abandoned;
  abandoned.status = MessageStatus::kAbandoned;
  const auto would_replay = admin_->Replay(abandoned, /*dry_run=*/true);
  EXPECT_EQ(would_replay.count, 2);
  EXPECT_EQ(would_replay.ids, (std::vector<MessageId>{ids[0], ids[2]}));
  MessageFilter stream;
  stream.stream_key = "k";
  const auto would_abandon = admin_->Abandon(stream, "no", /*dry_run=*/true);
  EXPECT_EQ(would_abandon.ids, (std::vector<MessageId>{ids[1], ids[3]}));
  EXPECT_EQ(harness_->Snapshot(), before);

  // And the real runs do what the dry runs said.
  EXPECT_EQ(admin_->Replay(abandoned, false).ids, would_replay.ids);
  MessageFilter pending_only = stream;
  pending_only.ids = std::vector<MessageId>{ids[1], ids[3]};
  EXPECT_EQ(admin_->Abandon(pending_only, "no", false).ids, would_abandon.ids);
}

TEST_P(AdminContractTest, AbandonRecordsTheReasonAndTheMessagesAreNoLongerClaimable) {
  const auto keep = Enqueue(2, "orders");
  const auto doomed = Enqueue(3, "poison", std::nullopt, "legacy");
  MessageFilter filter;
  filter.target = "legacy";
  const auto result = admin_->Abandon(filter, "consumer retired'; DROP TABLE x; --", false);
  EXPECT_EQ(result.ids, doomed);
  for (const auto& id : doomed) {
    EXPECT_EQ(Column(id, "status"), "abandoned");
    EXPECT_EQ(Column(id, "last_error"),
              "abandoned by operator: consumer retired'; DROP TABLE x; --");
    EXPECT_NE(Column(id, "abandoned_at"), "<null>");
  }
  ClaimRequest request;
  request.owner = "relay";
  const auto batch = store_->Claim(request);
  ASSERT_EQ(batch.size(), 2U);
  EXPECT_EQ(batch[0].id, keep[0]);
  EXPECT_EQ(batch[1].id, keep[1]);
}

TEST_P(AdminContractTest, ReplayAndAbandonWorkThroughManyChunks) {
  const int count = Admin::kChangeChunk * 2 + 17;
  const auto ids = Enqueue(count, "bulk");
  MessageFilter bulk;
  bulk.topic = "bulk";
  const auto abandoned = admin_->Abandon(bulk, "bulk", false);
  EXPECT_EQ(abandoned.count, count);
  EXPECT_EQ(abandoned.ids, ids);
  EXPECT_EQ(admin_->Replay(bulk, true).count, count);
  const auto replayed = admin_->Replay(bulk, false);
  EXPECT_EQ(replayed.count, count);
  EXPECT_EQ(replayed.ids, ids);
  MessageFilter pending = bulk;
  pending.status = MessageStatus::kPending;
  const auto page = admin_->List(pending, Admin::kMaxListLimit);
  EXPECT_EQ(page.messages.size(), static_cast<std::size_t>(count));
  EXPECT_TRUE(std::all_of(page.messages.begin(), page.messages.end(),
                          [](const MessageSummary& message) { return message.attempts == 0; }));
}

TEST_P(AdminContractTest, PurgeDeletesWhatIsPastItsRetentionInChunks) {
  auto keeping = OpenStore(1, /*published_retention=*/std::chrono::hours{1});
  const auto published = Enqueue(7, "done");
  ClaimRequest request;
  request.owner = "relay";
  std::vector<LeasedId> leased;
  for (const auto& envelope : keeping->Claim(request)) leased.push_back(LeasedId::Of(envelope));
  ASSERT_EQ(keeping->Complete("relay", leased).settled, 7);
  const auto abandoned = Enqueue(3, "bad");
  Abandon(abandoned);
  const auto pending = Enqueue(2, "waiting");

  RetentionPolicy retention;
  retention.published = std::chrono::hours{1};
  retention.abandoned = std::chrono::hours{1};
  EXPECT_EQ(admin_->Purge(retention, 2), 0) << "everything is younger than its retention";
  retention.published = std::chrono::seconds{0};
  retention.abandoned = std::chrono::seconds{0};
  EXPECT_EQ(admin_->Purge(retention, 2), 10);
  EXPECT_EQ(ListAll({}), pending);
  EXPECT_EQ(admin_->Purge(retention, 2), 0);
}

TEST_P(AdminContractTest, CountByTopicGroupsTheMessagesThatAreNotPublished) {
  auto keeping = OpenStore(1, /*published_retention=*/std::chrono::hours{1});
  const auto done = Enqueue(4, "orders");
  ClaimRequest request;
  request.owner = "relay";
  std::vector<LeasedId> leased;
  for (const auto& envelope : keeping->Claim(request)) leased.push_back(LeasedId::Of(envelope));
  ASSERT_EQ(keeping->Complete("relay", leased).settled, 4);  // published rows are not counted

  const auto orders = Enqueue(3, "orders");
  const auto clicks = Enqueue(2, "clicks", std::nullopt, "kafka");
  Abandon({orders[0]});
  Lease(clicks[0]);
  const auto counts = admin_->CountByTopic(std::chrono::seconds{5});
  ASSERT_TRUE(counts.has_value());
  const auto series = [](const std::vector<TopicCount>& groups) {
    std::vector<std::string> lines;
    for (const auto& group : groups) {
      lines.push_back(std::string{MessageStatusName(group.status)} + " " + group.target + " " +
                      group.topic + " " + std::to_string(group.messages));
    }
    return lines;
  };
  // Largest first, ties by status name.
  EXPECT_EQ(series(*counts), (std::vector<std::string>{
                                 "pending default orders 2",
                                 "abandoned default orders 1",
                                 "pending kafka clicks 1",
                                 "processing kafka clicks 1",
                             }));
}

TEST_P(AdminContractTest, CountByTopicSumsTheSmallerGroupsPerStatus) {
  // 55 pending topics of 1..55 messages and 3 abandoned ones of 1 message: the 50 largest
  // pending groups stay, the 5 smallest (1..5, 15 messages) and all abandoned fold into _other.
  int total = 0;
  for (int topic = 1; topic <= 55; ++topic) {
    Enqueue(topic, "topic-" + std::to_string(topic));
    total += topic;
  }
  std::vector<MessageId> lonely;
  for (int topic = 0; topic < 3; ++topic)
    lonely.push_back(Enqueue(1, "lonely-" + std::to_string(topic))[0]);
  Abandon(lonely);
  const auto counts = admin_->CountByTopic(std::chrono::seconds{5});
  ASSERT_TRUE(counts.has_value());
  ASSERT_EQ(counts->size(), static_cast<std::size_t>(Admin::kTopicGroups + 2));
  EXPECT_EQ(counts->front().topic, "topic-55");
  EXPECT_EQ(counts->front().messages, 55);
  std::int64_t sum = 0;
  std::map<std::string, std::int64_t> other;
  for (const auto& group : *counts) {
    sum += group.messages;
    if (group.topic == Admin::kOtherTopics) {
      EXPECT_EQ(group.target, Admin::kOtherTopics);
      other[std::string{MessageStatusName(group.status)}] = group.messages;
    }
  }
  EXPECT_EQ(sum, total + 3) << "every message is in one series";
  EXPECT_EQ(other, (std::map<std::string, std::int64_t>{{"abandoned", 3}, {"pending", 15}}));
  for (std::size_t i = 1; i < counts->size(); ++i) {
    EXPECT_GE((*counts)[i - 1].messages, (*counts)[i].messages) << "largest first";
  }
}

TEST_P(AdminContractTest, SkipActsOnlyOnHeldMessagesAndNeedsASelection) {
  const auto ids = Enqueue(2, "orders", "order-1");
  Abandon({ids[0]});  // this store's targets continue: it holds nothing
  EXPECT_EQ(admin_->Skip(ById(ids), /*dry_run=*/true).count, 0);
  EXPECT_EQ(admin_->Skip(ById(ids), false).count, 0);
  EXPECT_EQ(Column(ids[0], "status"), "abandoned");
  MessageFilter held;
  held.held = true;
  EXPECT_TRUE(admin_->List(held, 10).messages.empty());
  EXPECT_THROW(admin_->Skip(MessageFilter{}, false), std::invalid_argument);
  MessageFilter pending;
  pending.status = MessageStatus::kPending;
  try {
    admin_->Skip(pending, false);
    FAIL() << "skip accepted a pending filter";
  } catch (const std::invalid_argument& error) {
    EXPECT_STREQ(error.what(), "skip: acts only on abandoned messages, not on pending ones");
  }
}

TEST_P(AdminContractTest, BadFiltersAndArgumentsThrowInvalidArgument) {
  const auto message_of = [](const auto& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "<no std::invalid_argument>";
  };
  EXPECT_EQ(message_of([] { ParseMessageStatus("done"); }),
            "unknown status 'done' (expected one of pending, processing, failed, published, "
            "abandoned)");
  EXPECT_EQ(ParseMessageStatus("failed"), MessageStatus::kFailed);
  EXPECT_EQ(MessageStatusName(MessageStatus::kAbandoned), "abandoned");

  MessageFilter unknown;
  unknown.status = static_cast<MessageStatus>(9);
  EXPECT_EQ(message_of([&] { admin_->List(unknown, 10); }), "list: unknown status 9");
  MessageFilter negative;
  negative.older_than = std::chrono::seconds{-5};
  EXPECT_EQ(message_of([&] { admin_->List(negative, 10); }),
            "list: older_than must not be negative, got -5 s");
  EXPECT_EQ(message_of([&] { admin_->Replay(negative, true); }),
            "replay: older_than must not be negative, got -5 s");
  for (const int limit : {0, -1, Admin::kMaxListLimit + 1}) {
    EXPECT_EQ(message_of([&] { admin_->List({}, limit); }),
              "list: limit must be between 1 and 10000, got " + std::to_string(limit));
  }
  MessageFilter empty_topic;
  empty_topic.topic = "";
  EXPECT_EQ(message_of([&] { admin_->List(empty_topic, 10); }), "list: topic must not be empty");

  EXPECT_EQ(message_of([&] { admin_->Replay({}, false); }),
            "replay: refusing to act on every message; select by ids or a filter");
  EXPECT_EQ(message_of([&] { admin_->Abandon({}, "why", true); }),
            "abandon: refusing to act on every message; select by ids or a filter");
  MessageFilter pending;
  pending.status = MessageStatus::kPending;
  EXPECT_EQ(message_of([&] { admin_->Replay(pending, false); }),
            "replay: acts only on abandoned and failed messages, not on pending ones");
  MessageFilter processing;
  processing.status = MessageStatus::kProcessing;
  EXPECT_EQ(message_of([&] { admin_->Abandon(processing, "why", false); }),
            "abandon: acts only on pending and failed messages, not on processing ones");
  EXPECT_EQ(message_of([&] { admin_->Abandon(ById({NewUuidV7()}), "", false); }),
            "abandon: a reason is required");

  RetentionPolicy retention;
  retention.abandoned = std::chrono::seconds{-1};
  EXPECT_EQ(message_of([&] { admin_->Purge(retention, 10); }),
            "purge: retention must not be negative");
  EXPECT_EQ(message_of([&] { admin_->Purge({}, 0); }), "purge: chunk must be >= 1");
  EXPECT_EQ(message_of([&] { admin_->CountByTopic(std::chrono::milliseconds{0}); }),
            "count by topic: timeout must be at least 1 ms, got 0 ms");
}

// WAL mode's state (Admin::Wal, for `outboxctl status`): a store without WAL mode has none; one
// with it reads a fresh outbox as delivering to the table, with no slot made yet.
TEST_P(AdminContractTest, WalModeIsAbsentOrTableDeliveryWithoutASlotOnAFreshOutbox) {
  const std::optional<WalStatus> wal = admin_->Wal();
  if (!wal) return;
  EXPECT_EQ(wal->delivery, "table");
  EXPECT_EQ(wal->wal_topics, 0);
  EXPECT_FALSE(wal->slot.has_value());
  EXPECT_FALSE(wal->state.exists);
  EXPECT_FALSE(wal->owner.has_value());
}

}  // namespace
}  // namespace outbox::testing
