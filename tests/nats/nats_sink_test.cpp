// The NATS sink's own behaviour, beyond the contract suite: what a consumer receives (headers,
// subjects), JetStream deduplication by Nats-Msg-Id, expect_stream, the warning about a duplicate
// window shorter than the lease, a large window of pending acks, headers NATS cannot carry, the
// server's and the stream's size limits, authentication, and a server killed and restarted. On
// the shared server (streams of each test's own) and on nats-server processes of the tests' own
// (NatsServer); everything is read back with JetStreamClient, not through the sink.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <toml.hpp>
#include <vector>

#include "nats_test_support.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/nats.h"
#include "outbox/sink/nats_type.h"
#include "support/envelope_fields.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

Deadline In(milliseconds duration) { return SteadyClock::now() + duration; }

milliseconds Since(SteadyClock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start);
}

Envelope Make(const std::string& topic, std::string payload = R"({"n":1})") {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .created_at = std::chrono::system_clock::now()};
}

std::vector<Envelope> MakeBatch(const std::string& topic, std::size_t count) {
  std::vector<Envelope> batch;
  batch.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    batch.push_back(Make(topic, R"({"n":)" + std::to_string(i) + "}"));
  }
  return batch;
}

std::string Describe(const PublishOutcome& outcome) {
  return outcome.published() ? "published" : outcome.failure->Describe();
}

void ExpectAllPublished(const std::vector<PublishOutcome>& outcomes,
                        const std::vector<Envelope>& batch) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    EXPECT_TRUE(outcomes[i].published()) << i << ": " << Describe(outcomes[i]);
  }
}

// Publishes what is not published yet until all of it is, or `limit` passes (the sink may back
// off between connection attempts). The last outcome of each.
std::vector<PublishOutcome> PublishUntilAllPublished(Sink& sink, const std::vector<Envelope>& batch,
                                                     milliseconds limit = seconds{20}) {
  std::vector<PublishOutcome> outcomes(batch.size());
  std::vector<std::size_t> todo(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) todo[i] = i;
  const auto until = SteadyClock::now() + limit;
  while (!todo.empty()) {
    std::vector<Envelope> retry;
    retry.reserve(todo.size());
    for (const std::size_t i : todo) retry.push_back(batch[i]);
    const auto got = sink.Publish(retry, In(seconds{5}));
    std::vector<std::size_t> failed;
    for (std::size_t k = 0; k < todo.size(); ++k) {
      outcomes[todo[k]] = got.at(k);
      if (!got[k].published()) failed.push_back(todo[k]);
    }
    todo = std::move(failed);
    if (SteadyClock::now() >= until) break;
    if (!todo.empty()) std::this_thread::sleep_for(milliseconds{50});
  }
  return outcomes;
}

// Log lines, as a program's LogFn receives them.
class CapturedLog {
 public:
  LogFn Fn() {
    return [this](LogLevel level, std::string_view message) {
      const std::lock_guard lock(mutex_);
      lines_.emplace_back(level, std::string{message});
    };
  }
  // The warnings that contain `text`.
  std::vector<std::string> Warnings(const std::string& text) {
    const std::lock_guard lock(mutex_);
    std::vector<std::string> found;
    for (const auto& [level, line] : lines_) {
      if (level == LogLevel::kWarn && line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }
  std::string All() {
    const std::lock_guard lock(mutex_);
    std::string all;
    for (const auto& [level, line] : lines_) all += line + "\n";
    return all;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

// A stream of the test's own on the shared server, deleted at the end.
class OwnStream {
 public:
  explicit OwnStream(std::string_view prefix, milliseconds window = std::chrono::minutes{2},
                     std::int32_t max_msg_size = -1)
      : name_(UniqueName(prefix)), subject_("outbox.test." + name_) {
    client_.AddStream({.name = name_,
                       .subjects = {subject_, subject_ + ".>"},
                       .duplicate_window = window,
                       .max_msg_size = max_msg_size});
  }
  ~OwnStream() { client_.DeleteStream(name_); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const std::string& subject() const { return subject_; }
  JetStreamClient& client() { return client_; }

  nats::SinkOptions Options() const {
    nats::SinkOptions options;
    options.url = NatsUrl();
    return options;
  }

 private:
  JetStreamClient client_;
  std::string name_;
  std::string subject_;
};

TEST(NatsSinkTest, ConsumersReceiveTheDocumentedSubjectAndHeaders) {
  OwnStream stream("headers");
  nats::SinkOptions options = stream.Options();
  options.subject = stream.subject() + ".{type}";
  auto sink = nats::OpenSink(options);

  Envelope full = Make("orders", R"({"order":42})");
  full.type = "OrderPlaced";
  full.content_type = "application/json";
  full.stream_key = "order-42";
  full.stream_seq = 7;
  full.stream_prev_seq = 5;
  full.partition = 3;
  full.attempts = 2;
  full.database = "tenant-7";  // from a relay serving several databases
  full.headers = {{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                  {"correlation_id", "c-1"},
                  {"X-Custom", "custom value: with colon"},
                  {"type", "user-type"},           // the sink sets type: left out
                  {"content_type", "user/type"},   // the sink sets content_type: left out
                  {"Nats-Rollup", "all"},          // JetStream would act on it: left out
                  {"nats-msg-id", "forged"},       // any case
                  {"Nats-Expected-Stream", "X"}};  // not set by this sink: still left out
  // No type, no content type: the user's headers of those names stay.
  Envelope bare = Make("orders", "raw bytes");
  bare.content_type = "";
  bare.type = "Bare";
  bare.headers = {{"content_type", "user/type"}};
  const std::vector<Envelope> batch{full, bare};
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);

  stream.client().WaitForCount(stream.name(), 2, seconds{10});
  const auto stored = stream.client().ReadAll(stream.name());
  ASSERT_EQ(stored.size(), 2U);
  EXPECT_EQ(stored[0].subject, stream.subject() + ".OrderPlaced");
  EXPECT_EQ(stored[0].payload, full.payload);
  const std::string id = full.id.ToString();
  const std::map<std::string, std::string> expected = {
      {"Nats-Msg-Id", id},
      {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
      {"correlation_id", "c-1"},
      {"X-Custom", "custom value: with colon"},
      {"message_id", id},
      {"event_id", id},
      {"type", "OrderPlaced"},
      {"content_type", "application/json"},
      {"outbox-topic", "orders"},
      {"outbox-stream-key", "order-42"},
      {"outbox-stream-seq", "7"},
      {"outbox-stream-prev-seq", "5"},
      {"outbox-partition", "3"},
      {"outbox-attempts", "2"},
      {"outbox-target", "default"},
      {"outbox-database", "tenant-7"}};
  EXPECT_EQ(stored[0].headers, expected);

  EXPECT_EQ(stored[1].subject, stream.subject() + ".Bare");
  EXPECT_EQ(stored[1].payload, "raw bytes");
  const std::map<std::string, std::string> expected_bare = {{"Nats-Msg-Id", bare.id.ToString()},
                                                            {"message_id", bare.id.ToString()},
                                                            {"event_id", bare.id.ToString()},
                                                            {"content_type", "user/type"},
                                                            {"type", "Bare"},
                                                            {"outbox-topic", "orders"},
                                                            {"outbox-partition", "0"},
                                                            {"outbox-attempts", "0"},
                                                            {"outbox-target", "default"}};
  EXPECT_EQ(stored[1].headers, expected_bare);
}

// envelope = full (the default): event_id is the shared event id of a fanned-out copy, else the
// message's own id; the internal headers are still there.
TEST(NatsSinkTest, FullEnvelopeSendsTheEventIdAndTheInternalHeaders) {
  OwnStream stream("event-id");
  nats::SinkOptions options = stream.Options();
  options.subject = stream.subject();
  auto sink = nats::OpenSink(options);
  Envelope copy = Make("orders");
  SetEveryField(copy);  // event_id: a copy of a message written to several targets
  const Envelope single = Make("orders");
  const std::vector<Envelope> batch{copy, single};
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);

  stream.client().WaitForCount(stream.name(), 2, seconds{10});
  const auto stored = stream.client().ReadAll(stream.name());
  ASSERT_EQ(stored.size(), 2U);
  EXPECT_EQ(stored[0].Header("message_id"), copy.id.ToString());
  EXPECT_EQ(stored[0].Header("Nats-Msg-Id"), copy.id.ToString()) << "deduplicated per copy";
  ExpectTheFullEnvelope(stored[0].headers, copy);
  EXPECT_EQ(stored[1].Header("message_id"), single.id.ToString());
  ExpectTheFullEnvelope(stored[1].headers, single);
}

// envelope = external: the event and its context, nothing of how the outbox moved it.
TEST(NatsSinkTest, ExternalEnvelopeSendsNoOutboxHeaders) {
  OwnStream stream("external");
  nats::SinkOptions options = stream.Options();
  options.subject = stream.subject();
  options.envelope = EnvelopeStyle::kExternal;
  auto sink = nats::OpenSink(options);
  Envelope envelope = Make("orders", R"({"order":42})");
  SetEveryField(envelope);
  const std::vector<Envelope> batch{envelope};
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);

  stream.client().WaitForCount(stream.name(), 1, seconds{10});
  const auto stored = stream.client().ReadAll(stream.name());
  ASSERT_EQ(stored.size(), 1U);
  EXPECT_EQ(stored[0].payload, R"({"order":42})");
  const std::string id = envelope.id.ToString();
  const NameValues user_headers = UserHeadersSent();
  std::map<std::string, std::string> expected(user_headers.begin(), user_headers.end());
  expected.insert({{"Nats-Msg-Id", id},
                   {"message_id", id},
                   {"event_id", envelope.event_id->ToString()},
                   {"type", "OrderPlaced"},
                   {"content_type", "application/vnd.test+json"}});
  EXPECT_EQ(stored[0].headers, expected);

  // Published again (a lost ack): JetStream still deduplicates by Nats-Msg-Id.
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);
  EXPECT_EQ(stream.client().Count(stream.name()), 1U);
}

// A user header named like the event id (the stores refuse it; an old row may hold one) never
// stands in for the real one, in any case (NATS header names are case-sensitive on the wire, but
// many clients read them case-insensitively).
TEST(NatsSinkTest, UserHeaderNamedEventIdDoesNotOverrideIt) {
  OwnStream stream("forged-event-id");
  for (const EnvelopeStyle style : {EnvelopeStyle::kFull, EnvelopeStyle::kExternal}) {
    nats::SinkOptions options = stream.Options();
    options.subject = stream.subject();
    options.envelope = style;
    auto sink = nats::OpenSink(options);
    Envelope envelope = Make("orders");
    envelope.event_id = NewUuidV7();
    envelope.headers = ForgedEventIdHeaders();
    const std::vector<Envelope> batch{envelope};
    ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);
  }
  stream.client().WaitForCount(stream.name(), 2, seconds{10});
  const auto stored = stream.client().ReadAll(stream.name());
  ASSERT_EQ(stored.size(), 2U);
  for (const StoredMessage& message : stored) ExpectNoForgedEventId(message.headers);
}

TEST(NatsSinkTest, ASubjectThatIsNoNatsSubjectIsPermanent) {
  OwnStream stream("subjects");
  nats::SinkOptions options = stream.Options();
  options.subject = stream.subject() + ".{type}";
  auto sink = nats::OpenSink(options);
  std::vector<Envelope> batch = MakeBatch("t", 4);
  batch[0].type = "ok";
  batch[1].type.reset();  // "<subject>." : an empty last token
  batch[2].type = "a b";  // whitespace
  batch[3].type = "*";    // a wildcard
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 4U);
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  for (const std::size_t i : {1U, 2U, 3U}) {
    ASSERT_FALSE(outcomes[i].published()) << i;
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kPermanent) << i;
    EXPECT_NE(outcomes[i].failure->reason.find("subject"), std::string::npos)
        << outcomes[i].failure->reason;
  }
  EXPECT_EQ(stream.client().WaitForCount(stream.name(), 1, seconds{5}), 1U);
}

TEST(NatsSinkTest, HeadersNatsCannotCarryArePermanentAndNeverSent) {
  OwnStream stream("badheaders");
  auto sink = nats::OpenSink(stream.Options());
  std::vector<Envelope> batch = MakeBatch(stream.subject(), 5);
  batch[1].headers = {{"x-forged", "a\r\nNats-Rollup: all"}};
  batch[2].headers = {{"x-line", "first\nsecond"}};
  batch[3].headers = {{"bad:name", "v"}};
  batch[4].headers = {{"bad name", "v"}};
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), batch.size());
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  for (std::size_t i = 1; i < batch.size(); ++i) {
    ASSERT_FALSE(outcomes[i].published()) << i;
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kPermanent) << i;
    EXPECT_NE(outcomes[i].failure->reason.find("header"), std::string::npos)
        << outcomes[i].failure->reason;
  }
  std::this_thread::sleep_for(milliseconds{200});
  const auto stored = stream.client().ReadAll(stream.name());
  ASSERT_EQ(stored.size(), 1U);
  EXPECT_EQ(stored[0].Header("message_id"), batch[0].id.ToString());
}

// The same ids published again (a second relay, a republish after a lost ack) are acked as
// duplicates and stored once.
TEST(NatsSinkTest, DuplicatesWithinTheWindowAreStoredOnce) {
  OwnStream stream("dedup");
  const std::vector<Envelope> first = MakeBatch(stream.subject(), 200);
  auto sink = nats::OpenSink(stream.Options());
  ExpectAllPublished(sink->Publish(first, In(seconds{10})), first);

  std::vector<Envelope> again = first;  // a later attempt: same ids
  for (Envelope& envelope : again) ++envelope.attempts;
  const std::vector<Envelope> fresh = MakeBatch(stream.subject(), 50);
  again.insert(again.begin() + 100, fresh.begin(), fresh.end());
  auto other_sink = nats::OpenSink(stream.Options());
  ExpectAllPublished(other_sink->Publish(again, In(seconds{10})), again);
  ExpectAllPublished(sink->Publish(first, In(seconds{10})), first);

  EXPECT_EQ(stream.client().WaitForCount(stream.name(), 250, seconds{5}), 250U);
  std::this_thread::sleep_for(milliseconds{200});
  const auto stored = stream.client().ReadAll(stream.name());
  ASSERT_EQ(stored.size(), 250U);
  std::set<std::string> ids;
  for (const StoredMessage& message : stored) {
    ids.insert(message.Header("message_id").value_or(""));
    EXPECT_EQ(message.Header("outbox-attempts"), "0") << "a duplicate replaced the first copy";
  }
  EXPECT_EQ(ids.size(), 250U);
}

TEST(NatsSinkTest, ExpectStreamRefusesEveryOtherStream) {
  OwnStream stream("expect");
  nats::SinkOptions options = stream.Options();
  options.expect_stream = "NOT_" + stream.name();
  auto wrong = nats::OpenSink(options);
  const std::vector<Envelope> batch = MakeBatch(stream.subject(), 3);
  for (const PublishOutcome& outcome : wrong->Publish(batch, In(seconds{10}))) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kRejected);
    EXPECT_NE(outcome.failure->reason.find("expected stream does not match"), std::string::npos)
        << outcome.failure->reason;
    EXPECT_NE(outcome.failure->reason.find("10060"), std::string::npos) << outcome.failure->reason;
  }
  options.expect_stream = stream.name();
  auto right = nats::OpenSink(options);
  ExpectAllPublished(right->Publish(batch, In(seconds{10})), batch);
  EXPECT_EQ(stream.client().WaitForCount(stream.name(), 3, seconds{5}), 3U);
}

TEST(NatsSinkTest, NoStreamForTheSubjectIsRejectedNamingIt) {
  OwnStream stream("nostream");
  auto sink = nats::OpenSink(stream.Options());
  const std::vector<Envelope> batch = MakeBatch("outbox.nostream." + stream.name(), 1);
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 1U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kRejected);
  EXPECT_NE(outcomes[0].failure->reason.find("outbox.nostream." + stream.name()), std::string::npos)
      << outcomes[0].failure->reason;
}

// The warning goes through the program's log (SinkContext), once per stream, only when the
// stream keeps ids for less than the lease.
TEST(NatsSinkTest, WarnsOnceWhenAStreamsDuplicateWindowIsShorterThanTheLease) {
  OwnStream short_window("shortwindow", seconds{1});
  OwnStream equal_window("equalwindow", seconds{5});
  const auto settings = [](const std::string& body) {
    std::istringstream stream("[sinks.s]\ntype = \"nats\"\nurl = \"" + NatsUrl() + "\"\n" + body);
    const config::TomlValue root =
        toml::parse<toml::discard_comments, std::map, std::vector>(stream, "test.toml");
    return nats::Type().parse(config::Section{&root.at("sinks").at("s"), "sinks.s"}, "s",
                              [](const char*) -> const char* { return nullptr; });
  };
  CapturedLog log;
  auto sink = settings("")->Open({.log = log.Fn(), .lease = seconds{5}});
  std::vector<Envelope> batch = MakeBatch(short_window.subject(), 2);
  batch[1].topic = equal_window.subject();
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);
  const auto warnings = log.Warnings("duplicate_window");
  ASSERT_EQ(warnings.size(), 1U) << log.All();
  EXPECT_NE(warnings[0].find("'" + short_window.name() + "'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("1 s"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("lease of 5 s"), std::string::npos) << warnings[0];
  EXPECT_TRUE(log.Warnings(equal_window.name()).empty()) << log.All();
  // Checked once per stream.
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);
  EXPECT_EQ(log.Warnings("duplicate_window").size(), 1U) << log.All();

  // With expect_stream: at the first connect, before any ack names the stream.
  CapturedLog expect_log;
  auto expecting = settings("expect_stream = \"" + short_window.name() + "\"\n")
                       ->Open({.log = expect_log.Fn(), .lease = seconds{5}});
  const std::vector<Envelope> elsewhere = MakeBatch(equal_window.subject(), 1);
  const auto refused = expecting->Publish(elsewhere, In(seconds{10}));
  ASSERT_FALSE(refused.at(0).published());
  EXPECT_EQ(expect_log.Warnings(short_window.name()).size(), 1U) << expect_log.All();

  // No lease known (--check-config opens sinks so): no check.
  CapturedLog no_lease_log;
  auto no_lease = settings("")->Open({.log = no_lease_log.Fn()});
  ExpectAllPublished(no_lease->Publish(batch, In(seconds{10})), batch);
  EXPECT_TRUE(no_lease_log.Warnings("duplicate_window").empty()) << no_lease_log.All();

  // A stream named by expect_stream that does not exist.
  CapturedLog missing_log;
  auto missing = settings("expect_stream = \"NO_SUCH_STREAM_" + short_window.name() + "\"\n")
                     ->Open({.log = missing_log.Fn(), .lease = seconds{5}});
  missing->Publish(elsewhere, In(seconds{10}));
  EXPECT_EQ(missing_log.Warnings("does not exist").size(), 1U) << missing_log.All();
}

// 10,000 messages in one batch go out with max_pending acks outstanding, never one round trip per
// message; and a window of 1 still publishes every message.
TEST(NatsSinkTest, ManyPendingAcksInOneBatch) {
  OwnStream stream("window");
  auto sink = nats::OpenSink(stream.Options());
  const std::vector<Envelope> batch = MakeBatch(stream.subject(), 10000);
  const auto started = SteadyClock::now();
  ExpectAllPublished(sink->Publish(batch, In(seconds{30})), batch);
  const milliseconds took = Since(started);
  RecordProperty("publish_10000_ms", std::to_string(took.count()));
  std::printf("[ nats ] 10,000 messages in one batch (max_pending 1000): %lld ms\n",
              static_cast<long long>(took.count()));
  EXPECT_LT(took, seconds{10});
  EXPECT_EQ(stream.client().WaitForCount(stream.name(), 10000, seconds{10}), 10000U);

  nats::SinkOptions one = stream.Options();
  one.max_pending = 1;
  auto narrow = nats::OpenSink(one);
  const std::vector<Envelope> few = MakeBatch(stream.subject(), 300);
  ExpectAllPublished(narrow->Publish(few, In(seconds{30})), few);
  EXPECT_EQ(stream.client().WaitForCount(stream.name(), 10300, seconds{10}), 10300U);
}

TEST(NatsSinkTest, OverTheStreamsMaxMsgSizeIsPermanent) {
  OwnStream stream("maxmsg", std::chrono::minutes{2}, 1000);
  auto sink = nats::OpenSink(stream.Options());
  std::vector<Envelope> batch = MakeBatch(stream.subject(), 3);
  batch[1].payload.assign(2000, 'x');
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  ASSERT_FALSE(outcomes[1].published());
  EXPECT_EQ(outcomes[1].failure->kind, FailureKind::kPermanent) << Describe(outcomes[1]);
  EXPECT_NE(outcomes[1].failure->reason.find("10054"), std::string::npos)
      << outcomes[1].failure->reason;
  EXPECT_TRUE(outcomes[2].published()) << Describe(outcomes[2]);
}

// The server's max_payload (from its INFO) bounds payload and headers together; checked before
// sending.
TEST(NatsSinkTest, OverTheServersMaxPayloadIsPermanentWithoutSending) {
  NatsServer server("max_payload: 4096");
  JetStreamClient client(server.url());
  const std::string subject = "outbox.payload";
  client.AddStream({.name = "PAYLOAD", .subjects = {subject}});
  nats::SinkOptions options;
  options.url = server.url();
  auto sink = nats::OpenSink(options);
  std::vector<Envelope> batch = MakeBatch(subject, 4);
  batch[1].payload.assign(5000, 'x');  // over on its own
  batch[2].payload.assign(4000, 'y');  // over with the headers
  batch[3].payload.assign(3500, 'z');  // fits
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 4U);
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  for (const std::size_t i : {1U, 2U}) {
    ASSERT_FALSE(outcomes[i].published()) << i;
    EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kPermanent) << i;
    EXPECT_NE(outcomes[i].failure->reason.find("max_payload (4096)"), std::string::npos)
        << outcomes[i].failure->reason;
  }
  EXPECT_TRUE(outcomes[3].published()) << Describe(outcomes[3]);
  // The connection survived (a too-large publish would have made the server close it).
  const std::vector<Envelope> next = MakeBatch(subject, 2);
  ExpectAllPublished(sink->Publish(next, In(seconds{10})), next);
  EXPECT_EQ(client.WaitForCount("PAYLOAD", 4, seconds{5}), 4U);
}

TEST(NatsSinkTest, TokenAuthenticationAndNoSecretInReasons) {
  NatsServer server("authorization {\n  token: \"right-t0ken\"\n}");
  JetStreamClient client("nats://right-t0ken@127.0.0.1:" + std::to_string(server.port()));
  client.AddStream({.name = "AUTH", .subjects = {"outbox.auth"}});
  const std::vector<Envelope> batch = MakeBatch("outbox.auth", 3);

  nats::SinkOptions options;
  options.url = server.url();
  options.token = "right-t0ken";
  ExpectAllPublished(nats::OpenSink(options)->Publish(batch, In(seconds{10})), batch);
  options.token.clear();
  options.url = "nats://right-t0ken@127.0.0.1:" + std::to_string(server.port());
  ExpectAllPublished(nats::OpenSink(options)->Publish(batch, In(seconds{10})), batch);

  options.url = server.url();
  options.token = "wrong-t0ken";
  const auto started = SteadyClock::now();
  const auto outcomes = nats::OpenSink(options)->Publish(batch, In(seconds{10}));
  EXPECT_LT(Since(started), seconds{3});
  for (const PublishOutcome& outcome : outcomes) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_EQ(outcome.failure->reason.find("wrong-t0ken"), std::string::npos)
        << outcome.failure->reason;
    EXPECT_NE(outcome.failure->reason.find("nats://127.0.0.1:" + std::to_string(server.port())),
              std::string::npos)
        << outcome.failure->reason;
  }
  EXPECT_EQ(client.Count("AUTH"), 3U);
}

TEST(NatsSinkTest, UserAndPasswordFromTheUrl) {
  NatsServer server(
      "authorization {\n  users = [ { user: \"relay\", password: \"p@ss,w0rd\" } ]\n}");
  const std::string authority = "relay:p%40ss%2Cw0rd@127.0.0.1:" + std::to_string(server.port());
  JetStreamClient client("nats://relay:p@ss,w0rd@127.0.0.1:" + std::to_string(server.port()));
  client.AddStream({.name = "USERS", .subjects = {"outbox.users"}});
  const std::vector<Envelope> batch = MakeBatch("outbox.users", 2);
  nats::SinkOptions options;
  options.url = "nats://" + authority;
  ExpectAllPublished(nats::OpenSink(options)->Publish(batch, In(seconds{10})), batch);

  options.url = "nats://relay:wr0ng-pass@127.0.0.1:" + std::to_string(server.port());
  for (const PublishOutcome& outcome : nats::OpenSink(options)->Publish(batch, In(seconds{10}))) {
    ASSERT_FALSE(outcome.published());
    EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable);
    EXPECT_EQ(outcome.failure->reason.find("wr0ng"), std::string::npos) << outcome.failure->reason;
  }
}

// A subject the relay's user may not publish to: the server answers with an -ERR and no reply;
// the sink answers those messages at once (not at the deadline), unavailable (issue #40: a state
// of the destination, no attempt spent), and logs it once.
TEST(NatsSinkTest, PublishPermissionViolationsAreUnavailableAtOnce) {
  NatsServer server(
      "authorization {\n  users = [ { user: \"relay\", password: \"pw\", permissions: {\n"
      "    publish: { allow: [\"outbox.ok.>\", \"_INBOX.>\", \"$JS.API.>\"] },\n"
      "    subscribe: { allow: [\"_INBOX.>\"] } } } ]\n}");
  const std::string url = "nats://relay:pw@127.0.0.1:" + std::to_string(server.port());
  JetStreamClient client(url);
  client.AddStream({.name = "PERMS", .subjects = {"outbox.ok.>", "outbox.denied.>"}});
  nats::SinkOptions options;
  options.url = url;
  CapturedLog log;
  options.log = log.Fn();
  auto sink = nats::OpenSink(options);
  std::vector<Envelope> batch = MakeBatch("outbox.ok.a", 6);
  batch[1].topic = "outbox.denied.a";
  batch[4].topic = "outbox.denied.a";
  const auto started = SteadyClock::now();
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  EXPECT_LT(Since(started), seconds{3}) << "waited for the deadline";
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (i == 1 || i == 4) {
      ASSERT_FALSE(outcomes[i].published()) << i;
      EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable)
          << outcomes[i].failure->reason;
      EXPECT_NE(outcomes[i].failure->reason.find("outbox.denied.a"), std::string::npos)
          << outcomes[i].failure->reason;
    } else {
      EXPECT_TRUE(outcomes[i].published()) << i << ": " << Describe(outcomes[i]);
    }
  }
  EXPECT_EQ(log.Warnings("Permissions Violation").size(), 1U) << log.All();
  EXPECT_EQ(client.Count("PERMS"), 4U);
}

// A CA, and a server and a client certificate it signed (for 127.0.0.1), made with the openssl
// program in a directory of the test's own.
class TestCertificates {
 public:
  TestCertificates() {
    std::string pattern = "/tmp/outbox-nats-tls-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    const std::string script =
        "set -e; cd '" + dir_ +
        "'\n"
        "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\"; }\n"
        "key ca.key; openssl req -x509 -key ca.key -out ca.pem -days 2 -subj /CN=outbox-test-ca\n"
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext\n"
        "for who in server client; do key $who.key\n"
        "  openssl req -new -key $who.key -out $who.csr -subj /CN=$who\n"
        "  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile san.ext -out $who.pem; done\n";
    ChildProcess openssl({"/bin/sh", "-c", script}, dir_ + "/openssl.log");
    if (openssl.Wait(seconds{30}) != 0) throw std::runtime_error("openssl failed in " + dir_);
  }
  ~TestCertificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;

  [[nodiscard]] std::string File(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

// tls:// with the CA and a client certificate (the server verifies clients); refused (unavailable)
// without the client certificate, without the CA, or expecting another server name.
TEST(NatsSinkTest, TlsWithClientCertificates) {
  const TestCertificates certificates;
  NatsServer server("tls {\n  cert_file: \"" + certificates.File("server.pem") +
                    "\"\n  key_file: \"" + certificates.File("server.key") + "\"\n  ca_file: \"" +
                    certificates.File("ca.pem") + "\"\n  verify: true\n}");
  const std::string url = "tls://127.0.0.1:" + std::to_string(server.port());
  JetStreamClient client(url, {.ca_file = certificates.File("ca.pem"),
                               .cert_file = certificates.File("client.pem"),
                               .key_file = certificates.File("client.key")});
  client.AddStream({.name = "TLS", .subjects = {"outbox.tls"}});
  const std::vector<Envelope> batch = MakeBatch("outbox.tls", 3);

  nats::SinkOptions options;
  options.url = url;
  options.tls_ca_file = certificates.File("ca.pem");
  options.tls_cert_file = certificates.File("client.pem");
  options.tls_key_file = certificates.File("client.key");
  ExpectAllPublished(nats::OpenSink(options)->Publish(batch, In(seconds{10})), batch);
  // nats:// with TLS files: TLS all the same.
  nats::SinkOptions plain_scheme = options;
  plain_scheme.url = server.url();
  ExpectAllPublished(nats::OpenSink(plain_scheme)->Publish(batch, In(seconds{10})), batch);
  EXPECT_EQ(client.Count("TLS"), 3U);

  // Each refused: unavailable, saying why as far as libnats knows.
  const auto expect_unavailable = [&](nats::SinkOptions refused, const std::string& why) {
    const auto outcomes = nats::OpenSink(std::move(refused))->Publish(batch, In(seconds{10}));
    ASSERT_EQ(outcomes.size(), batch.size());
    for (const PublishOutcome& outcome : outcomes) {
      ASSERT_FALSE(outcome.published()) << why;
      EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << why;
      EXPECT_NE(outcome.failure->reason.find(why), std::string::npos) << outcome.failure->reason;
    }
  };
  nats::SinkOptions no_client_certificate = options;
  no_client_certificate.tls_cert_file.clear();
  no_client_certificate.tls_key_file.clear();
  expect_unavailable(no_client_certificate, "cannot connect to " + url);
  nats::SinkOptions no_ca = options;
  no_ca.tls_ca_file.clear();
  expect_unavailable(no_ca, "unable to get local issuer certificate");
  nats::SinkOptions other_name = options;
  other_name.tls_server_name = "nats.elsewhere.example";
  expect_unavailable(other_name, "hostname mismatch");
}

// A server killed (SIGKILL) and started again on the same port and store: unavailable at once
// (not at the deadline) while it is down, whether the sink was connected or not; then the same
// sink reconnects, and every message is in the stream once.
TEST(NatsSinkTest, ServerKilledThenRestartedIsUnavailableThenReconnects) {
  NatsServer server;
  JetStreamClient setup(server.url());
  setup.AddStream({.name = "RESTART", .subjects = {"outbox.restart"}, .file_storage = true});
  nats::SinkOptions options;
  options.url = server.url();
  auto sink = nats::OpenSink(options);
  const std::vector<Envelope> before = MakeBatch("outbox.restart", 100);
  ExpectAllPublished(sink->Publish(before, In(seconds{10})), before);

  server.Stop(SIGKILL);
  const std::vector<Envelope> during = MakeBatch("outbox.restart", 100);
  const auto fresh = nats::OpenSink(options);  // never connected
  for (Sink* publisher : {sink.get(), fresh.get()}) {
    const auto started = SteadyClock::now();
    const auto outcomes = publisher->Publish(during, In(seconds{10}));
    EXPECT_LT(Since(started), seconds{2}) << "Publish waited for its deadline";
    ASSERT_EQ(outcomes.size(), during.size());
    for (const PublishOutcome& outcome : outcomes) {
      ASSERT_FALSE(outcome.published());
      EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << outcome.failure->reason;
    }
  }
  // Within the backoff: no new attempt, answered at once, saying when the next one is.
  const auto again = sink->Publish(during, In(seconds{10}));
  ASSERT_FALSE(again.at(0).published());
  EXPECT_EQ(again[0].failure->kind, FailureKind::kUnavailable);

  server.Start();
  const auto started = SteadyClock::now();
  ExpectAllPublished(PublishUntilAllPublished(*sink, during), during);
  std::printf("[ nats ] reconnected and published %zu messages %lld ms after the restart\n",
              during.size(), static_cast<long long>(Since(started).count()));
  JetStreamClient reader(server.url());
  EXPECT_EQ(reader.WaitForCount("RESTART", 200, seconds{5}), 200U);
  std::set<std::string> ids;
  for (const StoredMessage& message : reader.ReadAll("RESTART")) {
    ids.insert(message.Header("message_id").value_or(""));
  }
  EXPECT_EQ(ids.size(), 200U);
}

// Stopped cleanly (SIGTERM) while a batch is in flight, then started again: the batch ends at
// once (what was sent and not acknowledged is outcome-unknown, the rest unavailable); published
// again after the restart, what the server had stored without acknowledging it is deduplicated
// (the ids survive the restart in the file store).
TEST(NatsSinkTest, ServerRestartedWithAcksOutstandingDeduplicatesTheRepublish) {
  NatsServer server;
  JetStreamClient setup(server.url());
  setup.AddStream({.name = "RESTART2", .subjects = {"outbox.restart2"}, .file_storage = true});
  nats::SinkOptions options;
  options.url = server.url();
  options.max_pending = 100000;
  auto sink = nats::OpenSink(options);
  const std::vector<Envelope> batch = MakeBatch("outbox.restart2", 20000);
  std::vector<PublishOutcome> outcomes;
  std::thread publisher([&] { outcomes = sink->Publish(batch, In(seconds{30})); });
  // Stop it mid-batch: once some of the batch is stored.
  const bool storing = [&] {
    const auto until = SteadyClock::now() + seconds{20};
    while (SteadyClock::now() < until) {
      if (setup.Count("RESTART2") >= 2000) return true;
      std::this_thread::sleep_for(milliseconds{1});
    }
    return false;
  }();
  const auto stopped = SteadyClock::now();
  server.Stop(SIGTERM);
  publisher.join();
  const milliseconds batch_ended = Since(stopped);
  ASSERT_TRUE(storing);
  std::size_t published = 0;
  std::size_t unknown = 0;
  std::size_t unavailable = 0;
  ASSERT_EQ(outcomes.size(), batch.size());
  for (const PublishOutcome& outcome : outcomes) {
    if (outcome.published()) {
      ++published;
    } else if (outcome.failure->kind == FailureKind::kOutcomeUnknown) {
      ++unknown;
    } else {
      EXPECT_EQ(outcome.failure->kind, FailureKind::kUnavailable) << outcome.failure->reason;
      ++unavailable;
    }
  }
  std::printf(
      "[ nats ] server stopped mid-batch: %zu published, %zu outcome unknown, %zu unavailable; "
      "the batch ended %lld ms after the stop\n",
      published, unknown, unavailable, static_cast<long long>(batch_ended.count()));
  EXPECT_LT(batch_ended, seconds{10});

  server.Start();
  JetStreamClient reader(server.url());
  // Stored but not known to be: what the republish must not store again.
  const std::uint64_t stored_before = reader.Count("RESTART2");
  std::printf("[ nats ] stored before the republish: %llu (%llu of them outcome-unknown)\n",
              static_cast<unsigned long long>(stored_before),
              static_cast<unsigned long long>(stored_before - published));
  EXPECT_GE(stored_before, published);
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch, seconds{60}), batch);
  EXPECT_EQ(reader.WaitForCount("RESTART2", batch.size(), seconds{10}), batch.size());
  std::this_thread::sleep_for(milliseconds{300});
  EXPECT_EQ(reader.Count("RESTART2"), batch.size()) << "duplicates in the stream";
}

}  // namespace
}  // namespace outbox::testing
