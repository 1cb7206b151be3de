// The Redis sink's own behaviour, beyond the contract suite: what an entry holds, deduplication
// (the script's atomicity included), MAXLEN, a large pipeline, and the failure classes with the
// server states that produce them for real: WRONGTYPE on the shared server; AUTH and ACL users,
// maxmemory (OOM), a read-only replica (READONLY), a busy script (BUSY), a flushed script cache
// (NOSCRIPT), killed connections and a killed server on redis-server processes of the tests' own.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dedup_script.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/redis.h"
#include "redis_test_support.h"
#include "support/envelope_fields.h"
#include "support/free_port.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

// What a sink logged.
class LogCapture {
 public:
  LogFn Fn() {
    return [this](LogLevel level, std::string_view message) {
      const std::lock_guard lock(mutex_);
      lines_.emplace_back(level, std::string{message});
    };
  }
  // The lines at `level` that contain `text`.
  std::vector<std::string> Find(LogLevel level, const std::string& text) const {
    const std::lock_guard lock(mutex_);
    std::vector<std::string> found;
    for (const auto& [at, line] : lines_) {
      if (at == level && line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }
  std::string All() const {
    const std::lock_guard lock(mutex_);
    std::string all;
    for (const auto& [level, line] : lines_) all += line + "\n";
    return all;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

std::string Describe(const PublishOutcome& outcome) {
  return outcome.published() ? "published" : outcome.failure->Describe();
}

void ExpectAllPublished(const std::vector<PublishOutcome>& outcomes,
                        const std::vector<Envelope>& batch) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id) << i;
    EXPECT_TRUE(outcomes[i].published()) << i << ": " << Describe(outcomes[i]);
  }
}

// Publishes what is not published yet, as the relay would, until all is or `limit` passes.
bool PublishUntilAllPublished(Sink& sink, std::vector<Envelope> batch,
                              milliseconds limit = milliseconds{15000}) {
  const auto until = SteadyClock::now() + limit;
  while (!batch.empty()) {
    const auto outcomes = sink.Publish(batch, In(milliseconds{3000}));
    std::vector<Envelope> left;
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (!outcomes[i].published()) left.push_back(batch[i]);
    }
    batch = std::move(left);
    if (batch.empty()) return true;
    if (SteadyClock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds{50});
  }
  return true;
}

std::vector<std::string> EntryIds(const std::vector<StreamEntry>& entries) {
  std::vector<std::string> ids;
  ids.reserve(entries.size());
  for (const StreamEntry& entry : entries) ids.push_back(entry.Field("id").value_or("<none>"));
  return ids;
}

std::vector<std::string> Ids(const std::vector<Envelope>& batch) {
  std::vector<std::string> ids;
  ids.reserve(batch.size());
  for (const Envelope& envelope : batch) ids.push_back(envelope.id.ToString());
  return ids;
}

class RedisSinkTest : public ::testing::Test {
 protected:
  void TearDown() override { client_.DeletePrefix(prefix_); }

  // Options for the shared server, with this test's dedup prefix and the log captured.
  redis::SinkOptions Options(const std::string& url = RedisUrl()) {
    redis::SinkOptions options;
    options.url = url;
    options.dedup_prefix = prefix_ + "dedup:";
    options.connect_timeout = milliseconds{2000};
    options.log = logs_.Fn();
    return options;
  }
  std::string Key(const std::string& stem) const { return prefix_ + stem; }
  std::string DedupKey(const Envelope& envelope) const {
    return prefix_ + "dedup:" + envelope.id.ToString();
  }

  std::string prefix_ = UniqueKey("sink") + ":";
  RedisClient client_;
  LogCapture logs_;
};

TEST_F(RedisSinkTest, EntryHoldsTheDocumentedFieldsAndBytes) {
  auto options = Options();
  options.stream = prefix_ + "{topic}.{target}.{type}";
  auto sink = redis::OpenSink(std::move(options));
  Envelope full = MakeEnvelope("orders", std::string("\x00\x01\xff\xfe\x80 not utf-8 \x00", 17));
  full.content_type = "application/octet-stream";
  full.type = "OrderPlaced";
  full.target = "audit";
  full.stream_key = "order-42";
  full.stream_seq = 7;
  full.stream_prev_seq = 5;
  full.partition = 11;
  full.attempts = 2;
  full.database = "tenant-7";  // from a relay serving several databases
  full.headers = {{"traceparent", "00-abc-def-01"},
                  {"correlation_id", "c-1"},
                  {"custom", std::string("v\xc3\x28\x00", 4)},
                  // Named like the sink's own fields: left out.
                  {"id", "not-the-id"},
                  {"payload", "not-the-payload"},
                  {"type", "not-the-type"},
                  {"content_type", "text/plain"}};
  Envelope bare = MakeEnvelope("orders", "");
  bare.content_type.clear();
  bare.target = "audit";
  const std::vector<Envelope> batch = {full, bare};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto typed = client_.ReadStream(prefix_ + "orders.audit.OrderPlaced");
  ASSERT_EQ(typed.size(), 1U);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"id", full.id.ToString()},
      {"event_id", full.id.ToString()},
      {"payload", full.payload},
      {"content_type", "application/octet-stream"},
      {"type", "OrderPlaced"},
      {"outbox-topic", "orders"},
      {"outbox-stream-key", "order-42"},
      {"outbox-stream-seq", "7"},
      {"outbox-stream-prev-seq", "5"},
      {"outbox-partition", "11"},
      {"outbox-attempts", "2"},
      {"outbox-target", "audit"},
      {"outbox-database", "tenant-7"},
      {"correlation_id", "c-1"},
      {"custom", std::string("v\xc3\x28\x00", 4)},
      {"traceparent", "00-abc-def-01"}};
  EXPECT_EQ(typed[0].fields, expected);

  // No type: {type} expands to "", and the entry has neither type nor content_type.
  const auto untyped = client_.ReadStream(prefix_ + "orders.audit.");
  ASSERT_EQ(untyped.size(), 1U);
  const std::vector<std::pair<std::string, std::string>> minimal = {
      {"id", bare.id.ToString()}, {"event_id", bare.id.ToString()}, {"payload", ""},
      {"outbox-topic", "orders"}, {"outbox-partition", "0"},        {"outbox-attempts", "0"},
      {"outbox-target", "audit"}};
  EXPECT_EQ(untyped[0].fields, minimal);
}

// envelope = full (the default): event_id is the shared event id of a fanned-out copy, else the
// message's own id; the internal fields are still there.
TEST_F(RedisSinkTest, FullEnvelopeWritesTheEventIdAndTheInternalFields) {
  auto options = Options();
  options.stream = Key("event-id");
  auto sink = redis::OpenSink(std::move(options));
  Envelope copy = MakeEnvelope("orders");
  SetEveryField(copy);  // event_id: a copy of a message written to several targets
  const Envelope single = MakeEnvelope("orders");
  const std::vector<Envelope> batch = {copy, single};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto entries = client_.ReadStream(Key("event-id"));
  ASSERT_EQ(entries.size(), 2U);
  EXPECT_EQ(entries[0].Field("id"), copy.id.ToString());
  ExpectTheFullEnvelope(entries[0].fields, copy);
  EXPECT_EQ(entries[1].Field("id"), single.id.ToString());
  ExpectTheFullEnvelope(entries[1].fields, single);
  // Each copy is deduplicated by its own id.
  EXPECT_TRUE(client_.Exists(DedupKey(copy)));
}

// envelope = external: the event and its context, nothing of how the outbox moved it.
TEST_F(RedisSinkTest, ExternalEnvelopeWritesNoOutboxFields) {
  auto options = Options();
  options.stream = Key("external");
  options.envelope = EnvelopeStyle::kExternal;
  auto sink = redis::OpenSink(std::move(options));
  Envelope envelope = MakeEnvelope("orders", R"({"order":42})");
  SetEveryField(envelope);
  const std::vector<Envelope> batch = {envelope};
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto entries = client_.ReadStream(Key("external"));
  ASSERT_EQ(entries.size(), 1U);
  NameValues expected = {{"id", envelope.id.ToString()},
                         {"event_id", envelope.event_id->ToString()},
                         {"payload", R"({"order":42})"},
                         {"content_type", "application/vnd.test+json"},
                         {"type", "OrderPlaced"}};
  const NameValues user_headers = UserHeadersSent();
  expected.insert(expected.end(), user_headers.begin(), user_headers.end());
  EXPECT_EQ(entries[0].fields, expected);

  // Published again (a lost reply): still deduplicated by the message id.
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  EXPECT_EQ(client_.ReadStream(Key("external")).size(), 1U);
}

// A user header named like the event id (the stores refuse it; an old row may hold one) never
// stands in for the real one, in any case.
TEST_F(RedisSinkTest, UserHeaderNamedEventIdDoesNotOverrideIt) {
  for (const EnvelopeStyle style : {EnvelopeStyle::kFull, EnvelopeStyle::kExternal}) {
    auto options = Options();
    options.stream = Key("forged-event-id");
    options.envelope = style;
    auto sink = redis::OpenSink(std::move(options));
    Envelope envelope = MakeEnvelope("orders");
    envelope.event_id = NewUuidV7();
    envelope.headers = ForgedEventIdHeaders();
    const std::vector<Envelope> batch = {envelope};
    ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  }
  const auto entries = client_.ReadStream(Key("forged-event-id"));
  ASSERT_EQ(entries.size(), 2U);
  for (const StreamEntry& entry : entries) ExpectNoForgedEventId(entry.fields);
}

TEST_F(RedisSinkTest, TheSameIdsTwiceMakeOneEntryEachAndReturnTheFirstEntry) {
  auto options = Options();
  options.stream = Key("dedup");
  options.dedup_window = std::chrono::minutes{5};
  auto sink = redis::OpenSink(std::move(options));
  const auto batch = MakeEnvelopes("t", 5);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);

  const auto entries = client_.ReadStream(Key("dedup"));
  EXPECT_EQ(EntryIds(entries), Ids(batch));
  ASSERT_EQ(entries.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    // The dedup key holds the entry id, for the window.
    EXPECT_EQ(client_.Get(DedupKey(batch[i])), entries[i].entry_id);
    const auto ttl = client_.Ok({"PTTL", DedupKey(batch[i])})->integer;
    EXPECT_GT(ttl, 4 * 60 * 1000);
    EXPECT_LE(ttl, 5 * 60 * 1000);
    // The second publish found the first entry (the script's answer, logged at debug level).
    EXPECT_EQ(logs_
                  .Find(LogLevel::kDebug, batch[i].id.ToString() + " was on stream '" +
                                              Key("dedup") + "' already, as entry " +
                                              entries[i].entry_id + " (deduplicated)")
                  .size(),
              1U)
        << logs_.All();
  }
}

// The script itself: {entry id, 1} when it adds, {the same entry id, 0} after.
TEST_F(RedisSinkTest, TheScriptReturnsTheRememberedEntryId) {
  const std::string stream = Key("script");
  const std::string seen = Key("script-seen:m1");
  const std::vector<std::string> eval = {"EVAL", std::string{redis::kDedupScript},
                                         "2",    stream,
                                         seen,   "60000",
                                         "",     "id",
                                         "m1",   "payload",
                                         "x"};
  const auto first = client_.Ok(eval);
  ASSERT_EQ(first->type, REDIS_REPLY_ARRAY);
  ASSERT_EQ(first->elements, 2U);
  const std::string entry{first->element[0]->str, first->element[0]->len};
  EXPECT_EQ(first->element[1]->integer, 1);
  const auto second = client_.Ok(eval);
  ASSERT_EQ(second->elements, 2U);
  EXPECT_EQ(std::string(second->element[0]->str, second->element[0]->len), entry);
  EXPECT_EQ(second->element[1]->integer, 0);
  EXPECT_EQ(client_.Length(stream), 1);
  EXPECT_EQ(client_.Get(seen), entry);

  // With MAXLEN ~.
  std::vector<std::string> trimmed = eval;
  trimmed[4] = Key("script-seen:m2");
  trimmed[6] = "10";
  EXPECT_EQ(client_.Ok(trimmed)->element[1]->integer, 1);
  EXPECT_EQ(client_.Length(stream), 2);
}

TEST_F(RedisSinkTest, WithoutDedupTheSameIdsAreAddedAgain) {
  auto options = Options();
  options.stream = Key("no-dedup");
  options.dedup = false;
  auto sink = redis::OpenSink(std::move(options));
  const auto batch = MakeEnvelopes("t", 5);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  auto twice = Ids(batch);
  const auto again = Ids(batch);
  twice.insert(twice.end(), again.begin(), again.end());
  EXPECT_EQ(EntryIds(client_.ReadStream(Key("no-dedup"))), twice);
  for (const Envelope& envelope : batch) EXPECT_FALSE(client_.Exists(DedupKey(envelope)));
}

// Past the window the id is forgotten: published again, it is a second entry.
TEST_F(RedisSinkTest, PastTheDedupWindowTheMessageIsAddedAgain) {
  auto options = Options();
  options.stream = Key("window");
  options.dedup_window = milliseconds{1000};
  auto sink = redis::OpenSink(std::move(options));
  const auto batch = MakeEnvelopes("t", 1);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  EXPECT_EQ(client_.Length(Key("window")), 1);
  EXPECT_LE(client_.Ok({"PTTL", DedupKey(batch[0])})->integer, 1000);
  ASSERT_TRUE(WaitUntil([&] { return !client_.Exists(DedupKey(batch[0])); }, milliseconds{5000}));
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  EXPECT_EQ(EntryIds(client_.ReadStream(Key("window"))), Ids({batch[0], batch[0]}));
}

// A key of another type at the stream's name: WRONGTYPE, rejected for that message only, and the
// script leaves no dedup key behind (Redis does not undo a script's earlier writes).
TEST_F(RedisSinkTest, WrongTypeIsRejectedAndLeavesNoDedupKey) {
  const std::string text_key = Key("text");
  client_.Ok({"SET", text_key, "a string"});
  for (const bool dedup : {true, false}) {
    auto options = Options();
    options.stream = prefix_ + "{topic}";
    options.dedup = dedup;
    auto sink = redis::OpenSink(std::move(options));
    std::vector<Envelope> batch = {MakeEnvelope("good"), MakeEnvelope("text"),
                                   MakeEnvelope("good")};
    const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
    ASSERT_EQ(outcomes.size(), 3U);
    EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
    EXPECT_TRUE(outcomes[2].published()) << Describe(outcomes[2]);
    ASSERT_FALSE(outcomes[1].published());
    EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kRejected);
    EXPECT_NE(outcomes[1].failure->reason.find("WRONGTYPE"), std::string::npos)
        << outcomes[1].failure->reason;
    EXPECT_NE(outcomes[1].failure->reason.find(text_key), std::string::npos)
        << outcomes[1].failure->reason;
    EXPECT_FALSE(client_.Exists(DedupKey(batch[1])));
    EXPECT_EQ(client_.Get(text_key), "a string");
  }
  EXPECT_EQ(client_.Length(Key("good")), 4);
}

TEST_F(RedisSinkTest, MaxLenTrimsTheStreamApproximately) {
  for (const bool dedup : {true, false}) {
    const std::string stream = Key(dedup ? "trimmed-dedup" : "trimmed");
    auto options = Options();
    options.stream = stream;
    options.max_len = 100;
    options.dedup = dedup;
    auto sink = redis::OpenSink(std::move(options));
    for (int round = 0; round < 10; ++round) {
      const auto batch = MakeEnvelopes("t", 100);
      ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
    }
    // MAXLEN ~ trims whole nodes (stream-node-max-entries, 100 by default): about 100, never
    // fewer.
    const auto length = client_.Length(stream);
    EXPECT_GE(length, 100) << stream;
    EXPECT_LT(length, 300) << stream;
  }
}

TEST_F(RedisSinkTest, TenThousandMessagesInOneBatch) {
  auto options = Options();
  options.stream = Key("big");
  auto sink = redis::OpenSink(std::move(options));
  auto batch = MakeEnvelopes("t", 10000);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    batch[i].stream_key = "s" + std::to_string(i % 50);
    batch[i].stream_seq = static_cast<std::int64_t>(i / 50 + 1);
  }
  const auto started = SteadyClock::now();
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{60000})), batch);
  const auto elapsed = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - started);
  RecordProperty("publish_ms", std::to_string(elapsed.count()));
  std::printf("[ redis ] 10,000 messages in one batch (dedup on, pipeline 1000): %lld ms\n",
              static_cast<long long>(elapsed.count()));
  EXPECT_EQ(EntryIds(client_.ReadStream(Key("big"))), Ids(batch));
}

TEST_F(RedisSinkTest, NothingListeningIsUnavailableAtOnce) {
  auto sink = redis::OpenSink(Options("redis://127.0.0.1:" + std::to_string(FreePort())));
  const auto batch = MakeEnvelopes("t", 3);
  for (int round = 0; round < 2; ++round) {
    const auto started = SteadyClock::now();
    const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
    EXPECT_LT(SteadyClock::now() - started, milliseconds{1000});
    ASSERT_EQ(outcomes.size(), 3U);
    for (const auto& outcome : outcomes) {
      ASSERT_FALSE(outcome.published());
      EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
      EXPECT_NE(outcome.failure->reason.find("cannot connect to 127.0.0.1:"), std::string::npos)
          << outcome.failure->reason;
    }
    // The second call comes within the backoff: no new attempt.
    if (round == 1) {
      EXPECT_NE(outcomes[0].failure->reason.find("next attempt in"), std::string::npos)
          << outcomes[0].failure->reason;
    }
  }
}

// ---- On servers of the tests' own ----

TEST(RedisOwnServerTest, AclUserAuthenticatesAndAWrongPasswordIsAClearFailure) {
  RedisServer server;
  server.Client().Ok({"ACL", "SETUSER", "relay", "on", ">s3cret-Pw", "~*", "&*", "+@all"});
  LogCapture logs;
  redis::SinkOptions options;
  options.url = "redis://relay:s3cret-Pw@127.0.0.1:" + std::to_string(server.port());
  options.stream = "acl";
  auto sink = redis::OpenSink(options);
  const auto batch = MakeEnvelopes("t", 3);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  EXPECT_EQ(server.Client().Length("acl"), 3);

  options.url = "redis://relay:Wr0ng-Pw@127.0.0.1:" + std::to_string(server.port());
  options.log = logs.Fn();
  auto refused = redis::OpenSink(options);
  const auto outcomes = refused->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 3U);
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_NE(outcome.failure->reason.find("AUTH as user 'relay'"), std::string::npos)
        << outcome.failure->reason;
    EXPECT_NE(outcome.failure->reason.find("WRONGPASS"), std::string::npos)
        << outcome.failure->reason;
    EXPECT_EQ(outcome.failure->reason.find("Wr0ng-Pw"), std::string::npos);
  }
  EXPECT_EQ(logs.Find(LogLevel::kWarn, "WRONGPASS").size(), 1U) << logs.All();
  EXPECT_EQ(logs.All().find("Wr0ng-Pw"), std::string::npos) << logs.All();
  EXPECT_EQ(server.Client().Length("acl"), 3);
}

// Issue #40: a key the ACL denies the relay's user (NOPERM) is a state of the destination: those
// messages are unavailable (no attempt spent), the others written; once the ACL allows the key,
// they go.
TEST(RedisOwnServerTest, NopermIsUnavailableForThatKeyOnly) {
  RedisServer server;
  server.Client().Ok(
      {"ACL", "SETUSER", "relay", "on", ">s3cret-Pw", "~ok:*", "~outbox:*", "&*", "+@all"});
  redis::SinkOptions options;
  options.url = "redis://relay:s3cret-Pw@127.0.0.1:" + std::to_string(server.port());
  options.stream = "{topic}";
  auto sink = redis::OpenSink(options);
  auto batch = MakeEnvelopes("ok:a", 4);
  batch[1].topic = "denied:a";
  batch[3].topic = "denied:a";
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), 4U);
  for (const std::size_t i : {1U, 3U}) {
    ASSERT_FALSE(outcomes[i].published()) << i;
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable) << outcomes[i].failure->reason;
    EXPECT_NE(outcomes[i].failure->reason.find("NOPERM"), std::string::npos)
        << outcomes[i].failure->reason;
    EXPECT_NE(outcomes[i].failure->reason.find("denied:a"), std::string::npos)
        << outcomes[i].failure->reason;
  }
  EXPECT_TRUE(outcomes[0].published());
  EXPECT_TRUE(outcomes[2].published());
  EXPECT_EQ(server.Client().Length("ok:a"), 2);

  server.Client().Ok({"ACL", "SETUSER", "relay", "~denied:*"});
  const std::vector<Envelope> again{batch[1], batch[3]};
  ExpectAllPublished(sink->Publish(again, In(milliseconds{5000})), again);
  EXPECT_EQ(server.Client().Length("denied:a"), 2);
}

TEST(RedisOwnServerTest, PasswordOnlyAndADatabase) {
  RedisServer server({"--requirepass", "pw-only"});
  redis::SinkOptions options;
  options.url = "redis://:pw-only@127.0.0.1:" + std::to_string(server.port()) + "/3";
  options.stream = "db3";
  auto sink = redis::OpenSink(options);
  const auto batch = MakeEnvelopes("t", 2);
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{5000})), batch);
  auto client = server.Client("", "pw-only");
  EXPECT_EQ(client.Length("db3"), 0);  // not in db 0
  client.Ok({"SELECT", "3"});
  EXPECT_EQ(client.Length("db3"), 2);
  EXPECT_TRUE(client.Exists("outbox:dedup:" + batch[0].id.ToString()));

  // Without the password: NOAUTH, unavailable.
  options.url = "redis://127.0.0.1:" + std::to_string(server.port());
  const auto outcomes = redis::OpenSink(options)->Publish(batch, In(milliseconds{5000}));
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable);
  EXPECT_NE(outcomes[0].failure->reason.find("NOAUTH"), std::string::npos)
      << outcomes[0].failure->reason;
}

TEST(RedisOwnServerTest, UnixSocket) {
  RedisServer server;
  redis::SinkOptions options;
  options.url = "unix://" + server.dir() + "/redis.sock";
  options.stream = "over-unix";
  const auto batch = MakeEnvelopes("t", 3);
  ExpectAllPublished(redis::OpenSink(options)->Publish(batch, In(milliseconds{5000})), batch);
  EXPECT_EQ(server.Client().Length("over-unix"), 3);
}

// maxmemory reached (noeviction): OOM, unavailable (no attempt spent), logged once, nothing of the
// failed messages on the server (no entry, no dedup key); published once there is room.
TEST(RedisOwnServerTest, OutOfMemoryIsUnavailableAndLogged) {
  RedisServer server({"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
  LogCapture logs;
  redis::SinkOptions options;
  options.url = server.url();
  options.stream = "full";
  options.log = logs.Fn();
  auto sink = redis::OpenSink(options);
  std::vector<Envelope> failed;
  std::size_t published = 0;
  for (int round = 0; round < 200 && failed.empty(); ++round) {
    auto batch = MakeEnvelopes("t", 10);
    for (Envelope& envelope : batch) envelope.payload.assign(std::size_t{64} * 1024, 'x');
    const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
    ASSERT_EQ(outcomes.size(), batch.size());
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].published()) {
        ++published;
        continue;
      }
      EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable)
          << outcomes[i].failure->Describe();
      EXPECT_FALSE(outcomes[i].failure->treatment().spends_attempt);
      failed.push_back(batch[i]);
    }
  }
  ASSERT_FALSE(failed.empty()) << "maxmemory never reached";
  auto client = server.Client();
  EXPECT_EQ(client.Length("full"), static_cast<std::int64_t>(published));
  for (const Envelope& envelope : failed) {
    EXPECT_FALSE(client.Exists("outbox:dedup:" + envelope.id.ToString()));
  }
  const auto lines = logs.Find(LogLevel::kError, "out of memory");
  ASSERT_EQ(lines.size(), 1U) << logs.All();
  EXPECT_NE(lines[0].find("OOM"), std::string::npos) << lines[0];

  client.Ok({"CONFIG", "SET", "maxmemory", "0"});
  EXPECT_TRUE(PublishUntilAllPublished(*sink, failed));
  EXPECT_EQ(client.Length("full"), static_cast<std::int64_t>(published + failed.size()));
}

// The server killed (SIGKILL): unavailable at once, with nothing listening; started again on the
// same port, the same sink reconnects.
TEST(RedisOwnServerTest, ServerKilledAndStartedAgain) {
  RedisServer server;
  redis::SinkOptions options;
  options.url = server.url();
  options.stream = "restarts";
  auto sink = redis::OpenSink(options);
  const auto first = MakeEnvelopes("t", 5);
  ExpectAllPublished(sink->Publish(first, In(milliseconds{5000})), first);

  server.Kill();
  const auto second = MakeEnvelopes("t", 5);
  const auto started = SteadyClock::now();
  const auto outcomes = sink->Publish(second, In(milliseconds{5000}));
  EXPECT_LT(SteadyClock::now() - started, milliseconds{1000}) << "not at once";
  ASSERT_EQ(outcomes.size(), second.size());
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << outcome.failure->Describe();
  }

  server.Start();
  EXPECT_TRUE(PublishUntilAllPublished(*sink, second));
  // No persistence: only what was published after the restart.
  EXPECT_EQ(EntryIds(server.Client().ReadStream("restarts")), Ids(second));
}

// A connection closed by the server while idle (CLIENT KILL, a timeout) is made anew before the
// next batch is sent: its messages are published, not outcome-unknown.
TEST(RedisOwnServerTest, ConnectionClosedWhileIdleIsMadeAnew) {
  RedisServer server;
  redis::SinkOptions options;
  options.url = server.url();
  options.stream = "idle";
  auto sink = redis::OpenSink(options);
  const auto first = MakeEnvelopes("t", 2);
  ExpectAllPublished(sink->Publish(first, In(milliseconds{5000})), first);
  auto client = server.Client();
  EXPECT_GE(client.Ok({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"})->integer, 1);
  std::this_thread::sleep_for(milliseconds{50});
  const auto second = MakeEnvelopes("t", 3);
  ExpectAllPublished(sink->Publish(second, In(milliseconds{5000})), second);
  EXPECT_EQ(client.Length("idle"), 5);
}

// A read-only replica: READONLY, unavailable, and nothing more of the batch is sent.
TEST(RedisOwnServerTest, ReadOnlyReplicaIsUnavailable) {
  RedisServer primary;
  RedisServer replica({"--replicaof", "127.0.0.1", std::to_string(primary.port())});
  for (const bool dedup : {true, false}) {
    redis::SinkOptions options;
    options.url = replica.url();
    options.stream = "replicated";
    options.dedup = dedup;
    const auto batch = MakeEnvelopes("t", 20);
    const auto outcomes = redis::OpenSink(options)->Publish(batch, In(milliseconds{5000}));
    ASSERT_EQ(outcomes.size(), batch.size());
    ASSERT_FALSE(outcomes[0].published());
    EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable);
    EXPECT_NE(outcomes[0].failure->reason.find("READONLY"), std::string::npos)
        << outcomes[0].failure->reason;
    for (const auto& outcome : outcomes) {
      ASSERT_FALSE(outcome.published());
      EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << outcome.failure->Describe();
    }
  }
  EXPECT_EQ(primary.Client().Ok({"EXISTS", "replicated"})->integer, 0);
}

// A script running past busy-reply-threshold: BUSY, unavailable; published once it is killed.
TEST(RedisOwnServerTest, BusyServerIsUnavailable) {
  RedisServer server({"--busy-reply-threshold", "100"});
  redis::SinkOptions options;
  options.url = server.url();
  options.stream = "busy";
  auto sink = redis::OpenSink(options);
  const auto warm = MakeEnvelopes("t", 1);
  ExpectAllPublished(sink->Publish(warm, In(milliseconds{5000})), warm);

  auto busy = server.Client();
  busy.Send({"EVAL", "while true do end", "0"});
  auto admin = server.Client();
  ASSERT_TRUE(WaitUntil([&] { return admin.Command({"PING"})->type == REDIS_REPLY_ERROR; },
                        milliseconds{5000}));
  const auto batch = MakeEnvelopes("t", 5);
  const auto outcomes = sink->Publish(batch, In(milliseconds{5000}));
  ASSERT_EQ(outcomes.size(), batch.size());
  for (const auto& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << outcome.failure->Describe();
  }
  EXPECT_NE(outcomes[0].failure->reason.find("BUSY"), std::string::npos)
      << outcomes[0].failure->reason;
  admin.Ok({"SCRIPT", "KILL"});
  EXPECT_TRUE(PublishUntilAllPublished(*sink, batch));
  EXPECT_EQ(admin.Length("busy"), 6);
}

// SCRIPT FLUSH between batches: NOSCRIPT, the script is loaded again, and the batch goes out in
// order without a failure.
TEST(RedisOwnServerTest, AFlushedScriptIsLoadedAgain) {
  RedisServer server;
  LogCapture logs;
  redis::SinkOptions options;
  options.url = server.url();
  options.stream = "flushed";
  options.log = logs.Fn();
  auto sink = redis::OpenSink(options);
  const auto first = MakeEnvelopes("t", 3);
  ExpectAllPublished(sink->Publish(first, In(milliseconds{5000})), first);
  auto client = server.Client();
  client.Ok({"SCRIPT", "FLUSH"});
  const auto second = MakeEnvelopes("t", 500);
  ExpectAllPublished(sink->Publish(second, In(milliseconds{5000})), second);
  auto all = Ids(first);
  const auto more = Ids(second);
  all.insert(all.end(), more.begin(), more.end());
  EXPECT_EQ(EntryIds(client.ReadStream("flushed")), all);
  EXPECT_EQ(logs.Find(LogLevel::kInfo, "NOSCRIPT").size(), 1U) << logs.All();
}

}  // namespace
}  // namespace outbox::testing
