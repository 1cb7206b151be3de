// The inbox against a real PostgreSQL: effects exactly once under duplicates, reordering,
// races, handler failures; bounded cleanup; the consumer-side outbox.
#include "outbox/inbox/inbox.h"

#include <amqp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <random>
#include <thread>

#include "outbox/core/wire_names.h"
#include "outbox/inbox/rabbitmq.h"
#include "outbox/store/postgres.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using inbox::Delivery;
using inbox::GapPolicy;
using inbox::Inbox;
using inbox::Result;

amqp_bytes_t Bytes(std::string_view text) { return {text.size(), const_cast<char*>(text.data())}; }

class InboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Sql(schema_.conn(), "CREATE TABLE " + schema_.name() + ".effects (id uuid, note text)");
  }
  // The handler's side effect: one row per application, no unique key, so a double application
  // shows up as two rows.
  std::function<void(pg_conn*)> Apply(const Delivery& delivery, std::string note = "") {
    return [this, id = delivery.id.ToString(), note](pg_conn* conn) {
      Sql(conn, "INSERT INTO " + schema_.name() + ".effects VALUES ('" + id + "', '" + note + "')");
    };
  }
  // Processes one delivery in a transaction of its own.
  Result ProcessOnce(PGconn* conn, const Inbox& inbox, const Delivery& delivery) {
    Sql(conn, "BEGIN");
    const Result result = inbox.Process(conn, delivery, Apply(delivery));
    Sql(conn, "COMMIT");
    return result;
  }
  // The skipped seqs of every consumer and stream, e.g. "2-3,7-7".
  std::string Skipped() {
    return Scalar(schema_.conn(),
                  "SELECT coalesce(string_agg(first_seq || '-' || last_seq, ',' ORDER BY "
                  "stream_key, first_seq), '') FROM " +
                      schema_.name() + ".inbox_skipped");
  }
  std::string Effects(const std::string& where = "true") {
    return Scalar(schema_.conn(),
                  "SELECT count(*) FROM " + schema_.name() + ".effects WHERE " + where);
  }
  Inbox MakeInbox(std::string consumer, GapPolicy policy = GapPolicy::kRefuse) {
    return Inbox({.consumer = std::move(consumer), .schema = schema_.name(), .gap_policy = policy});
  }

  TestSchema schema_;
};

TEST_F(InboxTest, DuplicatesAndReorderingWithinStreamsApplyEachMessageOnce) {
  // 20 streams of 10 sequenced messages and 50 unsequenced ones; each delivered 1 to 5 times,
  // in random order; refused (out-of-order) deliveries come back later, as a broker would.
  std::mt19937 random(7);
  std::vector<Delivery> messages;
  for (int s = 0; s < 20; ++s) {
    for (int seq = 1; seq <= 10; ++seq) {
      messages.push_back({NewUuidV7(), "stream-" + std::to_string(s), seq});
    }
  }
  for (int i = 0; i < 50; ++i) messages.push_back({NewUuidV7(), std::nullopt, std::nullopt});
  std::vector<Delivery> deliveries;
  for (const auto& message : messages) {
    const int copies = 1 + static_cast<int>(random() % 5);
    for (int c = 0; c < copies; ++c) deliveries.push_back(message);
  }
  std::shuffle(deliveries.begin(), deliveries.end(), random);
  std::deque<Delivery> queue(deliveries.begin(), deliveries.end());

  const Inbox inbox = MakeInbox("billing");
  auto conn = Connect();
  int processed = 0, duplicates = 0, refused = 0;
  for (int step = 0; step < 100000 && !queue.empty(); ++step) {
    const Delivery delivery = queue.front();
    queue.pop_front();
    switch (ProcessOnce(conn.get(), inbox, delivery)) {
      case Result::kProcessed:
        ++processed;
        break;
      case Result::kDuplicate:
        ++duplicates;
        break;
      case Result::kOutOfOrder:
        ++refused;
        queue.push_back(delivery);  // redelivered later
        break;
      case Result::kInvalid:
        ADD_FAILURE() << "every delivery here is valid";
        break;
    }
  }
  ASSERT_TRUE(queue.empty());
  EXPECT_EQ(processed, static_cast<int>(messages.size()));
  EXPECT_EQ(processed + duplicates, static_cast<int>(deliveries.size()));
  EXPECT_GT(refused, 0) << "the shuffle should have produced gaps";
  EXPECT_EQ(Effects(), std::to_string(messages.size()));
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(DISTINCT id) FROM " + schema_.name() + ".effects"),
            std::to_string(messages.size()));
  // Streams use constant space: one mark each, at 10.
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT count(*) || ' ' || min(last_seq) || ' ' || max(last_seq) "
                   "FROM " +
                       schema_.name() + ".inbox_streams"),
            "20 10 10");
}

TEST_F(InboxTest, GapPolicyProcessAnywaySkipsTheMissingOnes) {
  const Inbox inbox = MakeInbox("lenient", GapPolicy::kProcessAnyway);
  auto conn = Connect();
  const Delivery first{NewUuidV7(), "s", 1}, second{NewUuidV7(), "s", 2},
      third{NewUuidV7(), "s", 3};
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, first), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, third), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, second), Result::kDuplicate);  // the price of a gap
  const Inbox strict = MakeInbox("strict");
  EXPECT_EQ(ProcessOnce(conn.get(), strict, third), Result::kOutOfOrder);
  EXPECT_EQ(Effects(), "2");
}

// A delivery with stream_prev_seq <= mark: the messages in between were abandoned, so it is
// processed; the seqs it passed are remembered, and a replay of each is processed exactly once.
TEST_F(InboxTest, AnAbandonedGapIsProcessedAndAReplayOfItOnce) {
  const Inbox inbox = MakeInbox("strict");
  auto conn = Connect();
  const Delivery one{NewUuidV7(), "s", 1}, two{NewUuidV7(), "s", 2}, three{NewUuidV7(), "s", 3},
      four{NewUuidV7(), "s", 4, 1}, five{NewUuidV7(), "s", 5};
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, one), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, four), Result::kProcessed);  // 2 and 3 abandoned
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, four), Result::kDuplicate);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, five), Result::kProcessed);
  EXPECT_EQ(Skipped(), "2-3");
  // An operator replays them, in any order, each delivered twice.
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, three), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, three), Result::kDuplicate);
  EXPECT_EQ(Skipped(), "2-2");
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, two), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, two), Result::kDuplicate);
  EXPECT_EQ(Skipped(), "");
  EXPECT_EQ(Effects(), "5");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT last_seq FROM " + schema_.name() + ".inbox_streams"),
            "5");
  // A stream whose first messages were abandoned: prev_seq 0.
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "t", 3, 0}), Result::kProcessed);
  EXPECT_EQ(Skipped(), "1-2");
  // Replays from the middle of a longer gap split it.
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "u", 10, 0}), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "u", 5}), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "u", 1}), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "u", 9}), Result::kProcessed);
  EXPECT_EQ(Skipped(), "1-2,2-4,6-8");
  // Another consumer of the same stream has its own mark and skipped seqs.
  EXPECT_EQ(ProcessOnce(conn.get(), MakeInbox("other"), three), Result::kOutOfOrder);
}

// Without stream_prev_seq, or with one above the mark, a predecessor is still coming: refused.
TEST_F(InboxTest, AGenuineGapIsStillRefused) {
  const Inbox inbox = MakeInbox("strict");
  auto conn = Connect();
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 1}), Result::kProcessed);
  const Delivery four_after_two{NewUuidV7(), "s", 4, 2};  // 3 abandoned, 2 still coming
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, four_after_two), Result::kOutOfOrder);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 4}), Result::kOutOfOrder);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 2}), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, four_after_two), Result::kProcessed);  // redelivered
  EXPECT_EQ(Skipped(), "3-3");
  EXPECT_EQ(Effects(), "3");
}

// What the mark has passed was processed (or remembered) already: when stream_prev_seq is below
// the mark, only the seqs above the mark are remembered. (The relay may abandon a message that
// did reach the consumer: its confirm was lost until max_attempts.)
TEST_F(InboxTest, OnlyTheSeqsAboveTheMarkAreRemembered) {
  const Inbox inbox = MakeInbox("strict");
  auto conn = Connect();
  std::vector<Delivery> first;
  for (std::int64_t seq = 1; seq <= 3; ++seq) first.push_back({NewUuidV7(), "s", seq});
  for (const auto& delivery : first) ProcessOnce(conn.get(), inbox, delivery);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 6, 1}), Result::kProcessed);
  EXPECT_EQ(Skipped(), "4-5");
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, first[1]), Result::kDuplicate);  // replay of 2
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 4}), Result::kProcessed);
  EXPECT_EQ(Effects(), "5");
}

// kProcessAnyway passes any gap; it remembers the seqs the delivery says were abandoned.
TEST_F(InboxTest, ProcessAnywayRemembersOnlyTheAbandonedSeqs) {
  const Inbox inbox = MakeInbox("lenient", GapPolicy::kProcessAnyway);
  auto conn = Connect();
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 1}), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 6, 3}), Result::kProcessed);
  EXPECT_EQ(Skipped(), "4-5");
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 2}), Result::kDuplicate);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 5}), Result::kProcessed);
  EXPECT_EQ(Effects(), "3");
}

TEST_F(InboxTest, ConsumersAreIndependent) {
  auto conn = Connect();
  const Delivery delivery{NewUuidV7(), std::nullopt, std::nullopt};
  EXPECT_EQ(ProcessOnce(conn.get(), MakeInbox("a"), delivery), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), MakeInbox("b"), delivery), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), MakeInbox("a"), delivery), Result::kDuplicate);
}

// Two consumers of one name receive the same message at once: exactly one applies it.
void Race(InboxTest* test, const Inbox& inbox, const Delivery& delivery,
          const std::function<void(pg_conn*)>& apply, std::vector<Result>& results) {
  std::vector<std::thread> racers;
  results.assign(2, Result::kOutOfOrder);
  for (std::size_t r = 0; r < 2; ++r) {
    racers.emplace_back([&, r] {
      auto conn = Connect();
      Sql(conn.get(), "BEGIN");
      results[r] = inbox.Process(conn.get(), delivery, [&](pg_conn* c) {
        apply(c);
        std::this_thread::sleep_for(std::chrono::milliseconds{200});  // hold the race open
      });
      Sql(conn.get(), "COMMIT");
    });
  }
  for (auto& racer : racers) racer.join();
  (void)test;
}

TEST_F(InboxTest, TwoConsumersRacingOnOneMessageApplyItOnce) {
  const Inbox inbox = MakeInbox("racers");
  for (const Delivery& delivery :
       {Delivery{NewUuidV7(), std::nullopt, std::nullopt}, Delivery{NewUuidV7(), "s", 1}}) {
    std::vector<Result> results;
    Race(this, inbox, delivery, Apply(delivery), results);
    std::sort(results.begin(), results.end());
    EXPECT_EQ(results, (std::vector<Result>{Result::kProcessed, Result::kDuplicate}));
    EXPECT_EQ(Effects("id = '" + delivery.id.ToString() + "'"), "1");
  }
}

// A handler that throws on a replay leaves the seq remembered; two consumers racing on one
// replay apply it once.
TEST_F(InboxTest, AReplayIsProcessedOnceUnderFailuresAndRaces) {
  const Inbox inbox = MakeInbox("racers");
  auto conn = Connect();
  ProcessOnce(conn.get(), inbox, {NewUuidV7(), "s", 4, 0});
  const Delivery replay{NewUuidV7(), "s", 2};
  Sql(conn.get(), "BEGIN");
  EXPECT_THROW(inbox.Process(conn.get(), replay,
                             [](pg_conn*) { throw std::runtime_error("handler failed"); }),
               std::runtime_error);
  Sql(conn.get(), "COMMIT");
  EXPECT_EQ(Skipped(), "1-3");
  std::vector<Result> results;
  Race(this, inbox, replay, Apply(replay), results);
  std::sort(results.begin(), results.end());
  EXPECT_EQ(results, (std::vector<Result>{Result::kProcessed, Result::kDuplicate}));
  EXPECT_EQ(Effects("id = '" + replay.id.ToString() + "'"), "1");
  EXPECT_EQ(Skipped(), "1-1,3-3");
}

TEST_F(InboxTest, AHandlerThatThrowsLeavesNoRecord) {
  const Inbox inbox = MakeInbox("fragile");
  auto conn = Connect();
  for (const Delivery& delivery :
       {Delivery{NewUuidV7(), std::nullopt, std::nullopt}, Delivery{NewUuidV7(), "s", 1}}) {
    Sql(conn.get(), "BEGIN");
    EXPECT_THROW(inbox.Process(conn.get(), delivery,
                               [&](pg_conn* c) {
                                 Apply(delivery, "partial")(c);
                                 throw std::runtime_error("handler failed");
                               }),
                 std::runtime_error);
    // The caller may still commit its other work: the handler's writes and the record are gone.
    EXPECT_EQ(PQtransactionStatus(conn.get()), PQTRANS_INTRANS);
    Sql(conn.get(), "COMMIT");
    EXPECT_EQ(Effects("note = 'partial'"), "0");
    EXPECT_EQ(ProcessOnce(conn.get(), inbox, delivery), Result::kProcessed);
  }
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".inbox_messages"),
            "1");
}

TEST_F(InboxTest, CleanupRemovesOnlyRecordsOlderThanTheWindowInChunks) {
  const Inbox inbox = MakeInbox("old");
  const Inbox other = MakeInbox("other");
  auto conn = Connect();
  for (int i = 0; i < 10; ++i)
    ProcessOnce(conn.get(), inbox, {NewUuidV7(), std::nullopt, std::nullopt});
  ProcessOnce(conn.get(), other, {NewUuidV7(), std::nullopt, std::nullopt});
  // Age 6 of "old"'s records, and "other"'s, by two hours.
  Sql(schema_.conn(), "UPDATE " + schema_.name() +
                          ".inbox_messages SET processed_at = now() - "
                          "interval '2 hours' WHERE message_id IN (SELECT message_id FROM " +
                          schema_.name() +
                          ".inbox_messages WHERE consumer = 'old' ORDER BY "
                          "message_id LIMIT 6) OR consumer = 'other'");
  EXPECT_EQ(inbox.Cleanup(conn.get(), std::chrono::hours{1}, 4), 4);  // bounded chunk
  EXPECT_EQ(inbox.Cleanup(conn.get(), std::chrono::hours{1}, 4), 2);
  EXPECT_EQ(inbox.Cleanup(conn.get(), std::chrono::hours{1}, 4), 0);
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT string_agg(consumer || ':' || n, ',' ORDER BY consumer) "
                   "FROM (SELECT consumer, count(*) AS n FROM " +
                       schema_.name() + ".inbox_messages GROUP BY consumer) c"),
            "old:4,other:1");  // only this consumer's old records went
  EXPECT_THROW(inbox.Cleanup(conn.get(), std::chrono::seconds{-1}, 4), std::invalid_argument);
  EXPECT_THROW(inbox.Cleanup(conn.get(), std::chrono::hours{1}, 0), std::invalid_argument);
}

TEST_F(InboxTest, AHandlerEnqueuesOutgoingMessagesInTheSameTransaction) {
  const Inbox inbox = MakeInbox("relay-on");
  const postgres::Writer writer{schema_.name()};
  auto conn = Connect();
  const auto forward = [&](pg_conn* c) {
    NewMessage next;
    next.topic = "invoices";
    next.payload = R"({"for":"order-42"})";
    writer.Enqueue(c, next);
  };
  const Delivery kept{NewUuidV7(), std::nullopt, std::nullopt};
  Sql(conn.get(), "BEGIN");
  EXPECT_EQ(inbox.Process(conn.get(), kept, forward), Result::kProcessed);
  Sql(conn.get(), "COMMIT");
  const Delivery dropped{NewUuidV7(), std::nullopt, std::nullopt};
  Sql(conn.get(), "BEGIN");
  EXPECT_EQ(inbox.Process(conn.get(), dropped, forward), Result::kProcessed);
  Sql(conn.get(), "ROLLBACK");  // neither the record nor the outgoing message survive
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT count(*) FROM " + schema_.name() + ".messages WHERE topic = 'invoices'"),
            "1");
  Sql(conn.get(), "BEGIN");
  EXPECT_EQ(inbox.Process(conn.get(), dropped, forward), Result::kProcessed);
  Sql(conn.get(), "COMMIT");
}

TEST_F(InboxTest, BadInputIsRefused) {
  EXPECT_THROW(MakeInbox(""), std::invalid_argument);
  EXPECT_THROW(Inbox({.consumer = "c", .schema = "Bad Schema"}), std::invalid_argument);
  const Inbox inbox = MakeInbox("c");
  auto conn = Connect();
  const Delivery delivery{NewUuidV7(), std::nullopt, std::nullopt};
  EXPECT_THROW(inbox.Process(conn.get(), delivery, [](pg_conn*) {}), std::logic_error);
}

// Sequence numbers out of range, or unreadable headers: kInvalid, nothing runs, nothing is
// recorded, nothing is thrown, whatever the gap policy; the transaction stays usable.
TEST_F(InboxTest, InvalidSequenceNumbersAreRefusedWithoutARecord) {
  auto conn = Connect();
  const auto id = NewUuidV7();
  const std::vector<Delivery> invalid{
      {id, "s", 0},
      {id, "s", -1},
      {id, "s", std::numeric_limits<std::int64_t>::min()},
      {id, "s", inbox::kMaxStreamSeq + 1},
      {id, "s", std::numeric_limits<std::int64_t>::max()},
      {id, std::nullopt, -1},  // a seq without a key is still a bad seq
      {id, "s", 5, 5},         // stream_prev_seq must be below stream_seq
      {id, "s", 5, -1},
      {id, "s", std::nullopt, 0},  // stream_prev_seq without stream_seq
      {.id = id, .stream_key = "s", .malformed = "header outbox-stream-seq is not an integer"},
      {.id = id, .malformed = "header outbox-stream-key is not a string"},
  };
  for (const GapPolicy policy : {GapPolicy::kRefuse, GapPolicy::kProcessAnyway}) {
    const Inbox inbox = MakeInbox("strict", policy);
    for (const Delivery& delivery : invalid) {
      EXPECT_NE(inbox::Validate(delivery), "");
      Sql(conn.get(), "BEGIN");
      bool ran = false;
      EXPECT_EQ(inbox.Process(conn.get(), delivery, [&](pg_conn*) { ran = true; }),
                Result::kInvalid);
      EXPECT_FALSE(ran);
      Sql(conn.get(), "COMMIT");
    }
  }
  EXPECT_EQ(inbox::Validate(invalid[1]),
            "stream_seq -1 is out of range (1 to 4611686018427387904)");
  EXPECT_EQ(inbox::Validate(invalid[6]),
            "stream_prev_seq 5 is out of range (0 to stream_seq - 1 = 4)");
  EXPECT_EQ(inbox::Validate(invalid[9]), "header outbox-stream-seq is not an integer");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT (SELECT count(*) FROM " + schema_.name() +
                                       ".inbox_streams) + (SELECT count(*) FROM " + schema_.name() +
                                       ".inbox_messages)"),
            "0");
  // The bounds themselves are valid.
  const Inbox lenient = MakeInbox("lenient", GapPolicy::kProcessAnyway);
  EXPECT_EQ(ProcessOnce(conn.get(), lenient, {NewUuidV7(), "s", 1}), Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), lenient, {NewUuidV7(), "s", inbox::kMaxStreamSeq}),
            Result::kProcessed);
  EXPECT_EQ(ProcessOnce(conn.get(), lenient, {NewUuidV7(), "s", inbox::kMaxStreamSeq}),
            Result::kDuplicate);
  EXPECT_EQ(Effects(), "2");
}

// One consumer fed copies of a stream by two targets: stream_seq counts per (target, stream), so
// each target's copies have their own mark and each copy's effect is applied once.
TEST_F(InboxTest, CopiesOfAStreamFromTwoTargetsAreEachAppliedOnce) {
  auto conn = Connect();
  const Inbox inbox = MakeInbox("both");
  std::vector<Delivery> deliveries;
  for (const char* target : {"primary", "partner"}) {
    for (std::int64_t seq = 1; seq <= 3; ++seq) {
      deliveries.push_back({.id = NewUuidV7(),
                            .stream_key = "order-7",
                            .stream_seq = seq,
                            .target = std::string{target}});
    }
  }
  for (const Delivery& delivery : deliveries) {
    EXPECT_EQ(ProcessOnce(conn.get(), inbox, delivery), Result::kProcessed);
  }
  for (const Delivery& delivery : deliveries) {
    EXPECT_EQ(ProcessOnce(conn.get(), inbox, delivery), Result::kDuplicate);
  }
  EXPECT_EQ(Effects(), "6");
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT string_agg(target || '=' || last_seq, ',' ORDER BY "
                   "target) FROM " +
                       schema_.name() + ".inbox_streams"),
            "partner=3,primary=3");
  // The origin (the database a relay names) keeps marks apart too.
  Delivery other{.id = NewUuidV7(),
                 .stream_key = "order-7",
                 .stream_seq = 1,
                 .target = "primary",
                 .origin = "tenant-2"};
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, other), Result::kProcessed);
}

// A mark made before the marks were kept per target (schema 14 and older: target '') is adopted by
// the first delivery that names a target, with its skipped seqs: nothing is applied again.
TEST_F(InboxTest, AnOldMarkIsAdoptedByTheFirstTargetThatComes) {
  auto conn = Connect();
  const Inbox inbox = MakeInbox("upgraded");
  const Delivery old_style{.id = NewUuidV7(), .stream_key = "s", .stream_seq = 1};
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, old_style), Result::kProcessed);
  Delivery gap{.id = NewUuidV7(), .stream_key = "s", .stream_seq = 5, .stream_prev_seq = 1};
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, gap), Result::kProcessed);  // 2-4 skipped
  EXPECT_EQ(Skipped(), "2-4");
  const auto with_target = [](Delivery delivery) {
    delivery.target = "default";
    return delivery;
  };
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, with_target(gap)), Result::kDuplicate);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, with_target({NewUuidV7(), "s", 3})),
            Result::kProcessed);  // a replay of a skipped seq, once
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, with_target({NewUuidV7(), "s", 3})), Result::kDuplicate);
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, with_target({NewUuidV7(), "s", 6})), Result::kProcessed);
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT string_agg(target || ':' || last_seq, ',') FROM " +
                                       schema_.name() + ".inbox_streams"),
            "default:6");
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT string_agg(target || ':' || first_seq || '-' || "
                   "last_seq, ',' ORDER BY first_seq) FROM " +
                       schema_.name() + ".inbox_skipped"),
            "default:2-2,default:4-4");
  // A second target starts a mark of its own.
  Delivery partner{.id = NewUuidV7(), .stream_key = "s", .stream_seq = 1, .target = "partner"};
  EXPECT_EQ(ProcessOnce(conn.get(), inbox, partner), Result::kProcessed);
  EXPECT_EQ(Effects(), "5");
}

// The upgrade itself: marks and skipped seqs written by schema 14 survive migration 15 and are
// honoured (none processed again), through the script a DBA would apply.
TEST(InboxUpgradeTest, MarksOfSchema14SurviveTheMigration) {
  auto conn = Connect();
  const std::string schema = "t_upgrade_" + std::to_string(std::random_device{}() % 1000000);
  struct Drop {
    PGconn* conn;
    std::string schema;
    ~Drop() {
      PgResult dropped{PQexec(conn, ("DROP SCHEMA IF EXISTS " + schema + " CASCADE").c_str())};
    }
  } drop{conn.get(), schema};
  std::string script = postgres::MigrationScript(schema, 0);
  script.erase(script.find("-- version 15:"));
  Sql(conn.get(), "BEGIN");
  Sql(conn.get(), script);
  Sql(conn.get(), "COMMIT");
  ASSERT_EQ(Scalar(conn.get(), "SELECT max(version) FROM " + schema + ".schema_version"), "14");
  Sql(conn.get(), "INSERT INTO " + schema +
                      ".inbox_streams (consumer, stream_key, last_seq) VALUES ('c', 's', 9)");
  Sql(conn.get(), "INSERT INTO " + schema +
                      ".inbox_skipped (consumer, stream_key, first_seq, last_seq) VALUES ('c', "
                      "'s', 3, 4)");
  Sql(conn.get(), "BEGIN");
  Sql(conn.get(), postgres::MigrationScript(schema, 14));
  Sql(conn.get(), "COMMIT");
  const Inbox inbox({.consumer = "c", .schema = schema});
  const auto process = [&](std::int64_t seq) {
    Sql(conn.get(), "BEGIN");
    const Result result = inbox.Process(
        conn.get(), {.id = NewUuidV7(), .stream_key = "s", .stream_seq = seq, .target = "default"},
        [](pg_conn*) {});
    Sql(conn.get(), "COMMIT");
    return result;
  };
  EXPECT_EQ(process(9), Result::kDuplicate);
  EXPECT_EQ(process(2), Result::kDuplicate);
  EXPECT_EQ(process(3), Result::kProcessed);  // skipped before the upgrade, replayed after
  EXPECT_EQ(process(3), Result::kDuplicate);
  EXPECT_EQ(process(10), Result::kProcessed);
  EXPECT_EQ(process(12), Result::kOutOfOrder);
}

// outbox.inbox_begin from SQL, as a consumer in another language calls it: its answers, and a
// clear error (SQLSTATE 22023 naming the argument) for what the caller got wrong.
TEST_F(InboxTest, TheSqlFunctionAnswersAndRefusesBadArguments) {
  auto conn = Connect();
  const std::string fn = schema_.name() + ".inbox_begin";
  const auto begin = [&](const std::string& args) {
    return Scalar(conn.get(), "SELECT " + fn + "(" + args + ")");
  };
  const std::string id = "'" + NewUuidV7().ToString() + "'";
  EXPECT_EQ(begin("'py', " + id), "process");
  EXPECT_EQ(begin("'py', " + id), "duplicate");
  EXPECT_EQ(begin("consumer => 'py', message_id => gen_random_uuid(), stream_key => 'k', "
                  "stream_seq => 1, target => 'default'"),
            "process");
  EXPECT_EQ(begin("consumer => 'py', message_id => gen_random_uuid(), stream_key => 'k', "
                  "stream_seq => 3, target => 'default'"),
            "gap");
  EXPECT_EQ(begin("consumer => 'py', message_id => gen_random_uuid(), stream_key => 'k', "
                  "stream_seq => 3, target => 'default', gap_policy => 'process'"),
            "process");
  EXPECT_EQ(begin("'py', gen_random_uuid(), 'k', 0"), "invalid");
  EXPECT_EQ(begin("'py', gen_random_uuid(), 'k', 5, 5"), "invalid");
  EXPECT_EQ(begin("'py', gen_random_uuid(), NULL, NULL, 1"), "invalid");
  const auto refused = [&](const std::string& sql) {
    PgResult result{PQexec(conn.get(), sql.c_str())};
    const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
    return std::string{state != nullptr ? state : "ok"} + ": " +
           PQresultErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY);
  };
  EXPECT_EQ(refused("SELECT " + fn + "(NULL, gen_random_uuid())"),
            "22023: outbox.inbox_begin: consumer must not be empty");
  EXPECT_EQ(refused("SELECT " + fn + "('', gen_random_uuid())"),
            "22023: outbox.inbox_begin: consumer must not be empty");
  EXPECT_EQ(refused("SELECT " + fn + "('py', NULL)"),
            "22023: outbox.inbox_begin: message_id must not be null");
  EXPECT_EQ(refused("SELECT " + fn + "('py', gen_random_uuid(), gap_policy => 'skip')"),
            "22023: outbox.inbox_begin: gap_policy must be 'refuse' or 'process', got 'skip'");
  const std::string cleanup = "SELECT " + schema_.name() + ".inbox_cleanup";
  EXPECT_EQ(refused(cleanup + "('py', interval '-1 s', 10)"),
            "22023: outbox.inbox_cleanup: retention must not be negative, got -00:00:01");
  EXPECT_EQ(refused(cleanup + "('py', interval '1 h', 0)"),
            "22023: outbox.inbox_cleanup: max_rows must be at least 1, got 0");
  EXPECT_EQ(Scalar(conn.get(), cleanup + "('py', interval '0 s', 10)"), "1");
}

TEST(InboxAmqpTest, ReadsTheDeliveryAndRejectsForeignMessages) {
  amqp_basic_properties_t properties{};
  std::string error;
  EXPECT_FALSE(inbox::FromAmqp(properties, &error).has_value());
  EXPECT_EQ(error, "the message has no message_id property");
  properties._flags = AMQP_BASIC_MESSAGE_ID_FLAG;
  properties.message_id = amqp_cstring_bytes("order-42");
  EXPECT_FALSE(inbox::FromAmqp(properties, &error).has_value());
  EXPECT_EQ(error, "message_id 'order-42' is not a UUID");
  const std::string id = NewUuidV7().ToString();
  properties.message_id = amqp_cstring_bytes(id.c_str());
  amqp_table_entry_t entries[2]{};
  entries[0].key = Bytes(wire::kStreamKeyHeader);
  entries[0].value.kind = AMQP_FIELD_KIND_UTF8;
  entries[0].value.value.bytes = amqp_cstring_bytes("order-42");
  entries[1].key = Bytes(wire::kStreamSeqHeader);
  entries[1].value.kind = AMQP_FIELD_KIND_I64;
  entries[1].value.value.i64 = 7;
  properties.headers = {2, entries};
  properties._flags |= AMQP_BASIC_HEADERS_FLAG;
  const auto delivery = inbox::FromAmqp(properties);
  ASSERT_TRUE(delivery.has_value());
  EXPECT_EQ(delivery->id.ToString(), id);
  EXPECT_EQ(delivery->stream_key, "order-42");
  EXPECT_EQ(delivery->stream_seq, 7);
  EXPECT_EQ(delivery->malformed, "");
  EXPECT_FALSE(delivery->stream_prev_seq.has_value());
  EXPECT_FALSE(delivery->target.has_value());
  // Any integer type, or a decimal string.
  entries[1].value.kind = AMQP_FIELD_KIND_I32;
  entries[1].value.value.i32 = -1;
  EXPECT_EQ(inbox::FromAmqp(properties)->stream_seq, -1);  // readable: Process says kInvalid
  entries[1].value.kind = AMQP_FIELD_KIND_UTF8;
  entries[1].value.value.bytes = amqp_cstring_bytes("8");
  EXPECT_EQ(inbox::FromAmqp(properties)->stream_seq, 8);
  // Present but unreadable: a delivery (its id is fine) that is malformed, so kInvalid.
  for (const char* text : {"7x", "", "9223372036854775808"}) {
    entries[1].value.value.bytes = amqp_cstring_bytes(text);
    const auto bad = inbox::FromAmqp(properties);
    ASSERT_TRUE(bad.has_value()) << text;
    EXPECT_EQ(bad->malformed, "header outbox-stream-seq is not an integer") << text;
    EXPECT_EQ(inbox::Validate(*bad), bad->malformed);
  }
  entries[1].value.kind = AMQP_FIELD_KIND_U64;
  entries[1].value.value.u64 = std::uint64_t{1} << 63U;
  EXPECT_EQ(inbox::FromAmqp(properties)->malformed, "header outbox-stream-seq is not an integer");
  entries[1].value.kind = AMQP_FIELD_KIND_F64;
  entries[1].value.value.f64 = 7.0;
  EXPECT_EQ(inbox::FromAmqp(properties)->malformed, "header outbox-stream-seq is not an integer");
  entries[1].value.kind = AMQP_FIELD_KIND_I64;
  entries[1].value.value.i64 = 7;
  // outbox-stream-prev-seq, after abandoned messages.
  amqp_table_entry_t with_prev[3]{entries[0], entries[1], {}};
  with_prev[2].key = Bytes(wire::kStreamPrevSeqHeader);
  with_prev[2].value.kind = AMQP_FIELD_KIND_I64;
  with_prev[2].value.value.i64 = 4;
  properties.headers = {3, with_prev};
  EXPECT_EQ(inbox::FromAmqp(properties)->stream_prev_seq, 4);
  with_prev[2].value.value.i64 = 0;
  EXPECT_EQ(inbox::FromAmqp(properties)->stream_prev_seq, 0);
  with_prev[2].value.kind = AMQP_FIELD_KIND_UTF8;
  with_prev[2].value.value.bytes = amqp_cstring_bytes("four");
  EXPECT_EQ(inbox::FromAmqp(properties)->malformed,
            "header outbox-stream-prev-seq is not an integer");
  // outbox-target: the marks are kept per target.
  with_prev[2].key = Bytes(wire::kTargetHeader);
  with_prev[2].value.value.bytes = amqp_cstring_bytes("partner");
  EXPECT_EQ(inbox::FromAmqp(properties)->target, "partner");
  with_prev[2].value.kind = AMQP_FIELD_KIND_I32;
  EXPECT_EQ(inbox::FromAmqp(properties)->malformed, "header outbox-target is not a string");
  // outbox-database: a relay serving several databases names the one; the marks are kept per
  // database too (the origin).
  with_prev[2].key = Bytes(wire::kDatabaseHeader);
  with_prev[2].value.kind = AMQP_FIELD_KIND_UTF8;
  with_prev[2].value.value.bytes = amqp_cstring_bytes("tenant-7");
  EXPECT_EQ(inbox::FromAmqp(properties)->origin, "tenant-7");
  with_prev[2].value.kind = AMQP_FIELD_KIND_I32;
  EXPECT_EQ(inbox::FromAmqp(properties)->malformed, "header outbox-database is not a string");
  properties.headers = {2, entries};
  entries[0].value.kind = AMQP_FIELD_KIND_I64;
  entries[0].value.value.i64 = 42;
  EXPECT_EQ(inbox::FromAmqp(properties)->malformed, "header outbox-stream-key is not a string");
}

}  // namespace
}  // namespace outbox::testing
