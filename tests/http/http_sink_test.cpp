// The HTTP webhook sink's own behaviour (sink/http.h), beyond the contract suite, against
// webhook_receiver.py (no mock of libcurl): what an endpoint receives (every header, the Standard
// Webhooks signature checked by the receiver's own HMAC, the payload's bytes, the URL with its
// placeholders percent-encoded), how each answer is classified, Retry-After per host, one request
// in flight per stream, max_in_flight per host, connection failures and timeouts, what is refused
// before sending, basic authentication from the URL, PUT, a proxy; TLS (HttpSinkTlsTest, against
// a receiver serving HTTPS with certificates that openssl makes at run time: a CA of the test's
// own trusted, an untrusted server certificate, an endpoint that requires a client certificate,
// http:// and https:// at the wrong kind of port).
//
// What arrived is read back from the receiver's record, never through the sink. Concurrency is
// judged from the receiver's clock: a request is on the wire at least from its arrival (t) to the
// moment its answer was decided (answered_t), so two requests whose intervals overlap were in
// flight together, and a request that arrived after another's answered_t was sent after that
// answer.
//
// Most tests use the binary's shared receiver (it checks SharedSecret()) with destinations of
// their own; those that need another secret or host start receivers of their own.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "http_test_support.h"
#include "outbox/core/failure.h"
#include "outbox/core/uuid.h"
#include "outbox/sink/http.h"
#include "support/envelope_fields.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

// How long a test waits for the receiver to record what the sink was told it accepted.
constexpr milliseconds kRecordWait{10000};

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

Envelope MakeInStream(const std::string& topic, const std::string& stream, std::int64_t seq) {
  Envelope envelope = Make(topic, R"({"seq":)" + std::to_string(seq) + "}");
  envelope.stream_key = stream;
  envelope.stream_seq = seq;
  return envelope;
}

std::string Describe(const PublishOutcome& outcome) {
  return outcome.published() ? "published" : outcome.failure->Describe();
}

// The failure's kind; nullopt when published.
std::optional<FailureKind> KindOf(const PublishOutcome& outcome) {
  if (outcome.published()) return std::nullopt;
  return outcome.failure->kind;
}

std::string ReasonOf(const PublishOutcome& outcome) {
  return outcome.published() ? std::string{} : outcome.failure->reason;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<PublishOutcome> Publish(webhook::SinkOptions options,
                                    const std::vector<Envelope>& batch,
                                    milliseconds limit = seconds{10}) {
  const auto sink = webhook::OpenSink(std::move(options));
  return sink->Publish(batch, In(limit));
}

void ExpectAllPublished(const std::vector<PublishOutcome>& outcomes,
                        const std::vector<Envelope>& batch) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    EXPECT_TRUE(outcomes[i].published()) << i << ": " << Describe(outcomes[i]);
  }
}

// Publishes what is not published yet until all of it is, or `limit` passes. The last outcome
// of each.
std::vector<PublishOutcome> PublishUntilAllPublished(Sink& sink, const std::vector<Envelope>& batch,
                                                     milliseconds limit = seconds{10}) {
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

// The options of a sink that sends to `receiver`'s /hooks/{topic}, over HTTP/1.1, signing with
// `secrets`.
webhook::SinkOptions OptionsFor(const WebhookReceiver& receiver,
                                std::vector<std::string> secrets = {}) {
  webhook::SinkOptions options;
  options.url = receiver.BaseUrl() + "/hooks/{topic}";
  options.secrets = std::move(secrets);
  options.connect_timeout = milliseconds{5000};
  options.request_timeout = milliseconds{10000};
  options.http_version = webhook::HttpVersion::kHttp1;
  return options;
}

// The shared receiver's options: signed with the secret it checks.
webhook::SinkOptions SharedOptions() { return OptionsFor(SharedReceiver(), {SharedSecret()}); }

// A destination of the test's own on a receiver, removed at the end.
class Destination {
 public:
  explicit Destination(std::string_view prefix, const std::string& behaviour = "{}",
                       WebhookReceiver& receiver = SharedReceiver())
      : receiver_(receiver), name_(UniqueDestination(prefix)) {
    receiver_.CreateDestination(name_, behaviour);
  }
  // A destination of exactly this name.
  Destination(WebhookReceiver& receiver, std::string name, const std::string& behaviour = "{}")
      : receiver_(receiver), name_(std::move(name)) {
    receiver_.CreateDestination(name_, behaviour);
  }
  ~Destination() { receiver_.RemoveDestination(name_); }
  Destination(const Destination&) = delete;
  Destination& operator=(const Destination&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  std::vector<ReceivedRequest> Requests() { return receiver_.Requests(name_); }
  // Waits until it has `count` requests (at most kRecordWait), then returns all of them.
  std::vector<ReceivedRequest> WaitFor(std::size_t count) {
    return receiver_.WaitForRequests(name_, count, kRecordWait);
  }

 private:
  WebhookReceiver& receiver_;
  std::string name_;
};

// The request of message `id` among `requests` (the last one, when it came more than once).
std::optional<ReceivedRequest> RequestOf(const std::vector<ReceivedRequest>& requests,
                                         const MessageId& id) {
  std::optional<ReceivedRequest> found;
  for (const ReceivedRequest& request : requests) {
    if (request.id == id.ToString()) found = request;
  }
  return found;
}

// Whether the two requests were on the wire at the same time (receiver's clock).
bool Overlap(const ReceivedRequest& a, const ReceivedRequest& b) {
  return a.t < b.answered_t && b.t < a.answered_t;
}

// The most requests among `requests` that were on the wire at the same time.
std::size_t MostAtOnce(const std::vector<ReceivedRequest>& requests) {
  std::size_t most = 0;
  for (const ReceivedRequest& at : requests) {
    std::size_t now = 0;
    for (const ReceivedRequest& other : requests) {
      if (other.t <= at.t && at.t < other.answered_t) ++now;
    }
    most = std::max(most, now);
  }
  return most;
}

// A loopback port nobody listens on (bound, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||  // NOLINT: the socket API
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {  // NOLINT
    close(fd);
    throw std::runtime_error("bind failed");
  }
  close(fd);
  return ntohs(address.sin_port);
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

// --- What an endpoint receives ------------------------------------------------------------------

TEST(HttpSinkTest, EveryDocumentedHeaderWithItsValue) {
  Destination destination("headers");
  webhook::SinkOptions options = SharedOptions();
  options.headers = {{"Authorization", "Bearer static-token"}, {"X-Static", "static value"}};

  Envelope full = Make(destination.name(), R"({"order":42})");
  full.type = "OrderPlaced";
  full.content_type = "application/json; charset=utf-8";
  full.stream_key = "order-42";
  full.stream_seq = 7;
  full.stream_prev_seq = 5;
  full.partition = 3;
  full.attempts = 2;
  full.database = "tenant-7";  // from a relay serving several databases
  full.headers = {
      {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
      {"correlation_id", "c-1"},
      {"X-Custom", "custom value: with colon"},
      {"X-Empty", ""},
      // Set by the sink or reserved by HTTP: left out, whatever their case.
      {"Content-Type", "text/forged"},
      {"content-length", "1"},
      {"Host", "forged.example"},
      {"Transfer-Encoding", "chunked"},
      {"Connection", "close"},
      {"Keep-Alive", "timeout=1"},
      {"Upgrade", "h2c"},
      {"TE", "trailers"},
      {"Trailer", "X-Forged"},
      {"Expect", "100-continue"},
      {"Proxy-Authorization", "Basic Zm9yZ2Vk"},
      {"webhook-id", "forged"},
      {"Webhook-Timestamp", "1"},
      {"WEBHOOK-SIGNATURE", "v1,forged"},
      {"outbox-topic", "forged"},
      {"Outbox-Attempts", "99"},
  };
  // Nothing optional set; an empty content type.
  Envelope bare = Make(destination.name(), "plain");
  bare.content_type = "";
  const std::vector<Envelope> batch{full, bare};
  const auto before =
      std::chrono::duration_cast<seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  ExpectAllPublished(Publish(options, batch), batch);
  const auto after =
      std::chrono::duration_cast<seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();

  const auto requests = destination.WaitFor(2);
  ASSERT_EQ(requests.size(), 2U);
  const auto got = RequestOf(requests, full.id);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->method, "POST");
  EXPECT_EQ(got->path, "/hooks/" + destination.name());
  EXPECT_EQ(got->signature_ok, std::optional<bool>{true});
  EXPECT_EQ(got->status, std::optional<int>{200});
  EXPECT_EQ(got->payload, full.payload);

  const std::string id = full.id.ToString();
  const std::map<std::string, std::string> expected = {
      {"content-type", "application/json; charset=utf-8"},
      {"webhook-id", id},
      {"event_id", id},
      {"outbox-topic", destination.name()},
      {"outbox-type", "OrderPlaced"},
      {"outbox-stream-key", "order-42"},
      {"outbox-stream-seq", "7"},
      {"outbox-stream-prev-seq", "5"},
      {"outbox-partition", "3"},
      {"outbox-attempts", "2"},
      {"outbox-target", "default"},
      {"outbox-database", "tenant-7"},
      {"authorization", "Bearer static-token"},
      {"x-static", "static value"},
      {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
      {"correlation_id", "c-1"},
      {"x-custom", "custom value: with colon"},
      {"x-empty", ""},
      {"content-length", std::to_string(full.payload.size())},
      {"host", "127.0.0.1:" + std::to_string(SharedReceiver().port())},
  };
  for (const auto& [name, value] : expected) {
    EXPECT_EQ(got->Header(name), std::optional<std::string>{value}) << name;
  }
  // When this attempt was sent, in seconds since the epoch.
  const std::string timestamp = got->Header("webhook-timestamp").value_or("");
  ASSERT_FALSE(timestamp.empty());
  const std::int64_t sent_at = std::stoll(timestamp);
  EXPECT_GE(sent_at, before);
  EXPECT_LE(sent_at, after);
  // Signed as Standard Webhooks say (the receiver checked it with Python's hmac; the same value).
  EXPECT_EQ(got->Header("webhook-signature"),
            std::optional<std::string>{webhook::Sign({SharedSecret()}, id, sent_at, full.payload)});
  EXPECT_EQ(got->Header("user-agent").value_or("").rfind("outbox/", 0), 0U);

  // In the documented order: the sink's own, then the configured ones, then the envelope's.
  const std::vector<std::string> order = {"content-type",      "webhook-id",
                                          "webhook-timestamp", "webhook-signature",
                                          "event_id",          "outbox-topic",
                                          "outbox-type",       "outbox-stream-key",
                                          "outbox-stream-seq", "outbox-stream-prev-seq",
                                          "outbox-partition",  "outbox-attempts",
                                          "outbox-target",     "outbox-database",
                                          "authorization",     "x-static"};
  // Nothing else: no reserved header of the envelope's, nothing the sink does not document.
  std::set<std::string> allowed(order.begin(), order.end());
  allowed.insert({"traceparent", "correlation_id", "x-custom", "x-empty", "content-length", "host",
                  "user-agent", "accept"});
  for (const std::string& name : got->header_names) {
    EXPECT_TRUE(allowed.contains(name))
        << "unexpected header " << name << ": " << got->Header(name).value_or("");
  }

  const auto position = [&got](const std::string& name) {
    const auto found = std::find(got->header_names.begin(), got->header_names.end(), name);
    return static_cast<std::size_t>(found - got->header_names.begin());
  };
  for (std::size_t i = 1; i < order.size(); ++i) {
    EXPECT_LT(position(order[i - 1]), position(order[i])) << order[i - 1] << " / " << order[i];
  }
  for (const std::string envelope_header :
       {"traceparent", "correlation_id", "x-custom", "x-empty"}) {
    EXPECT_LT(position("x-static"), position(envelope_header)) << envelope_header;
  }

  // The bare envelope: no type, no stream headers; its empty content type is sent empty (not
  // libcurl's form default).
  const auto plain = RequestOf(requests, bare.id);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->payload, "plain");
  EXPECT_EQ(plain->Header("content-type"), std::optional<std::string>{""});
  EXPECT_EQ(plain->Header("webhook-id"), std::optional<std::string>{bare.id.ToString()});
  EXPECT_EQ(plain->Header("event_id"), std::optional<std::string>{bare.id.ToString()});
  EXPECT_EQ(plain->Header("outbox-partition"), std::optional<std::string>{"0"});
  EXPECT_EQ(plain->Header("outbox-attempts"), std::optional<std::string>{"0"});
  for (const std::string absent : {"outbox-type", "outbox-stream-key", "outbox-stream-seq",
                                   "outbox-stream-prev-seq", "outbox-database"}) {
    EXPECT_FALSE(plain->Header(absent).has_value()) << absent;
  }
  EXPECT_EQ(plain->signature_ok, std::optional<bool>{true});
}

// envelope = full (the default): event_id is the shared event id of a fanned-out copy, else the
// message's own id; the internal headers (and outbox-type) are still there.
TEST(HttpSinkTest, FullEnvelopeSendsTheEventIdAndTheInternalHeaders) {
  Destination destination("event-id");
  Envelope copy = Make(destination.name());
  SetEveryField(copy);  // event_id: a copy of a message written to several targets
  const Envelope single = Make(destination.name());
  const std::vector<Envelope> batch{copy, single};
  ExpectAllPublished(Publish(SharedOptions(), batch), batch);

  const auto requests = destination.WaitFor(2);
  const auto first = RequestOf(requests, copy.id);
  const auto second = RequestOf(requests, single.id);
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(first->Header("webhook-id"), std::optional<std::string>{copy.id.ToString()});
  EXPECT_EQ(first->Header("outbox-type"), std::optional<std::string>{"OrderPlaced"});
  EXPECT_FALSE(first->Header("type").has_value());
  ExpectTheFullEnvelope(first->headers, copy);
  ExpectTheFullEnvelope(second->headers, single);
  EXPECT_EQ(first->signature_ok, std::optional<bool>{true});
  EXPECT_EQ(second->signature_ok, std::optional<bool>{true});
}

// envelope = external: the event and its context, nothing of how the outbox moved it; the type
// as `type`, the Standard Webhooks headers as always.
TEST(HttpSinkTest, ExternalEnvelopeSendsNoOutboxHeaders) {
  Destination destination("external");
  webhook::SinkOptions options = SharedOptions();
  options.envelope = EnvelopeStyle::kExternal;
  options.headers = {{"Authorization", "Bearer static-token"}};
  Envelope envelope = Make(destination.name(), R"({"order":42})");
  SetEveryField(envelope);
  // The sink sends the type as `type`: the envelope's header of that name (any case) is left
  // out, like the reserved ones.
  envelope.headers.emplace("Type", "forged");
  // No type: no `type` header of the sink's, and the user's header of that name is kept.
  Envelope untyped = Make(destination.name(), "plain");
  untyped.headers = {{"type", "user-type"}};
  const std::vector<Envelope> batch{envelope, untyped};
  ExpectAllPublished(Publish(options, batch), batch);

  const auto requests = destination.WaitFor(2);
  const auto got = RequestOf(requests, envelope.id);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->payload, R"({"order":42})");
  EXPECT_EQ(got->signature_ok, std::optional<bool>{true});
  const std::map<std::string, std::string> expected = {
      {"content-type", "application/vnd.test+json"},
      {"webhook-id", envelope.id.ToString()},
      {"type", "OrderPlaced"},
      {"authorization", "Bearer static-token"}};
  for (const auto& [name, value] : expected) {
    EXPECT_EQ(got->Header(name), std::optional<std::string>{value}) << name;
  }
  // got->headers holds each (lower-case) name that came, got->header_names each time it came.
  ExpectTheExternalEnvelope(got->headers, envelope);
  EXPECT_EQ(std::count(got->header_names.begin(), got->header_names.end(), "event_id"), 1);
  EXPECT_TRUE(got->Header("webhook-timestamp").has_value());
  EXPECT_TRUE(got->Header("webhook-signature").has_value());
  EXPECT_EQ(std::count(got->header_names.begin(), got->header_names.end(), "type"), 1);

  const auto plain = RequestOf(requests, untyped.id);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->Header("type"), std::optional<std::string>{"user-type"});
  EXPECT_EQ(plain->Header("event_id"), std::optional<std::string>{untyped.id.ToString()});
  for (const std::string& name : plain->header_names) {
    EXPECT_FALSE(name.starts_with("outbox-")) << name;
  }
}

// A user header named like the event id (the stores refuse it; an old row may hold one) never
// stands in for the real one, in any case (HTTP header names are case-insensitive).
TEST(HttpSinkTest, UserHeaderNamedEventIdDoesNotOverrideIt) {
  Destination destination("forged-event-id");
  std::vector<Envelope> batch;
  for (const EnvelopeStyle style : {EnvelopeStyle::kFull, EnvelopeStyle::kExternal}) {
    webhook::SinkOptions options = SharedOptions();
    options.envelope = style;
    Envelope envelope = Make(destination.name());
    envelope.event_id = NewUuidV7();
    envelope.headers = ForgedEventIdHeaders();
    const std::vector<Envelope> one{envelope};
    ExpectAllPublished(Publish(options, one), one);
    batch.push_back(envelope);
  }
  const auto requests = destination.WaitFor(2);
  for (const Envelope& envelope : batch) {
    const auto got = RequestOf(requests, envelope.id);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->Header("event_id"), std::optional<std::string>{envelope.event_id->ToString()});
    EXPECT_EQ(std::count(got->header_names.begin(), got->header_names.end(), "event_id"), 1);
    EXPECT_FALSE(got->Header("message_id").has_value());
    ExpectNoForgedEventId(got->headers);
  }
}

TEST(HttpSinkTest, ARequestSignedWithAnotherSecretIsRefusedAsTheHostsProblem) {
  Destination destination("wrong-secret");
  webhook::SinkOptions options = SharedOptions();
  options.secrets = {NewSecret()};
  const std::vector<Envelope> batch{Make(destination.name())};
  const auto outcomes = Publish(options, batch);
  ASSERT_EQ(outcomes.size(), 1U);
  // 401 refuses the relay itself (issue #40): the host's problem, no attempt spent.
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kUnavailable) << Describe(outcomes[0]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[0]), "HTTP 401")) << Describe(outcomes[0]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[0]), "refuses the relay")) << Describe(outcomes[0]);
  const auto requests = destination.WaitFor(1);
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_EQ(requests[0].signature_ok, std::optional<bool>{false});
  EXPECT_EQ(requests[0].status, std::optional<int>{401});

  // Unsigned: refused the same way.
  options.secrets.clear();
  const auto unsigned_outcomes = Publish(options, batch);
  EXPECT_EQ(KindOf(unsigned_outcomes.at(0)), FailureKind::kUnavailable)
      << Describe(unsigned_outcomes[0]);
  const auto unsigned_requests = destination.WaitFor(2);
  ASSERT_EQ(unsigned_requests.size(), 2U);
  EXPECT_FALSE(unsigned_requests[1].Header("webhook-signature").has_value());
}

TEST(HttpSinkTest, TwoSecretsSignTwiceAndAReceiverWithTheNewOneAccepts) {
  const std::string old_secret = NewSecret();
  const std::string new_secret = NewSecret();
  WebhookReceiver receiver({new_secret});
  Destination destination("rotation", "{}", receiver);
  const std::vector<Envelope> batch{Make(destination.name(), R"({"rotated":true})")};
  ExpectAllPublished(Publish(OptionsFor(receiver, {old_secret, new_secret}), batch), batch);

  const auto requests = destination.WaitFor(1);
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_EQ(requests[0].signature_ok, std::optional<bool>{true});
  const std::string header = requests[0].Header("webhook-signature").value_or("");
  const std::string id = batch[0].id.ToString();
  const std::int64_t timestamp = std::stoll(requests[0].timestamp.value_or("0"));
  const std::string first = webhook::Sign({old_secret}, id, timestamp, batch[0].payload);
  const std::string second = webhook::Sign({new_secret}, id, timestamp, batch[0].payload);
  EXPECT_EQ(header, first + " " + second);
  EXPECT_EQ(first.rfind("v1,", 0), 0U);
  EXPECT_EQ(second.rfind("v1,", 0), 0U);
  EXPECT_NE(first, second);

  // With only the old secret, that receiver refuses.
  Destination refused("rotation-old", "{}", receiver);
  const std::vector<Envelope> old_only{Make(refused.name())};
  EXPECT_EQ(KindOf(Publish(OptionsFor(receiver, {old_secret}), old_only).at(0)),
            FailureKind::kUnavailable);
  EXPECT_EQ(refused.WaitFor(1).at(0).signature_ok, std::optional<bool>{false});
}

TEST(HttpSinkTest, PayloadBytesArriveUnchanged) {
  Destination destination("payload");
  std::string every_byte;
  for (int round = 0; round < 1200; ++round) {  // 300 KiB: more than one socket buffer
    for (int byte = 0; byte < 256; ++byte) every_byte.push_back(static_cast<char>(byte));
  }
  const std::vector<std::string> payloads = {
      std::string{"nul\0inside\0", 11},
      "\xff\xfe\xfd invalid UTF-8 \xc3\x28",
      "\r\n\r\nPOST /hooks/x HTTP/1.1\r\n\r\n",
      "",
      R"({"unicode":"héllo ✓"})",
      every_byte,
  };
  std::vector<Envelope> batch;
  for (const std::string& payload : payloads) {
    batch.push_back(Make(destination.name(), payload));
    batch.back().content_type = "application/octet-stream";
  }
  ExpectAllPublished(Publish(SharedOptions(), batch), batch);
  const auto requests = destination.WaitFor(batch.size());
  ASSERT_EQ(requests.size(), batch.size());
  for (const Envelope& envelope : batch) {
    const auto got = RequestOf(requests, envelope.id);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->payload.size(), envelope.payload.size());
    EXPECT_TRUE(got->payload == envelope.payload)
        << "payload of " << envelope.payload.size() << " bytes changed";
    EXPECT_EQ(got->Header("content-length"),
              std::optional<std::string>{std::to_string(envelope.payload.size())});
    EXPECT_EQ(got->signature_ok, std::optional<bool>{true});  // signed over these very bytes
  }
}

TEST(HttpSinkTest, PlaceholdersArePercentEncodedAndCannotChangeThePath) {
  webhook::SinkOptions options = SharedOptions();
  options.url = SharedReceiver().BaseUrl() + "/hooks/{topic}?from=outbox";
  const std::string unique = UniqueDestination("enc");
  const std::vector<std::string> topics = {
      unique + "/a/b",
      unique + "?x=1&y=2",
      unique + " with spaces",
      unique + "#fragment",
      unique + "%41",
      unique + "+plus",
      unique + "/../../_control/healthz",
      unique + "é",
      "..",
      ".",
  };
  std::vector<std::unique_ptr<Destination>> destinations;
  std::vector<Envelope> batch;
  for (const std::string& topic : topics) {
    destinations.push_back(std::make_unique<Destination>(SharedReceiver(), topic));
    batch.push_back(Make(topic));
  }
  ExpectAllPublished(Publish(options, batch), batch);
  for (std::size_t i = 0; i < topics.size(); ++i) {
    const auto requests = destinations[i]->WaitFor(1);
    ASSERT_EQ(requests.size(), 1U) << topics[i];
    // A topic of dots only is a dot segment unless its dots are encoded too.
    const std::string encoded = topics[i] == "."    ? "%2E"
                                : topics[i] == ".." ? "%2E%2E"
                                                    : PercentEncode(topics[i]);
    EXPECT_EQ(requests[0].path, "/hooks/" + encoded + "?from=outbox");
    // (The receiver reads header values as Latin-1: only ASCII ones compare as they are.)
    if (!topics[i].ends_with("é")) {
      EXPECT_EQ(requests[0].Header("outbox-topic"), std::optional<std::string>{topics[i]});
    }
  }

  // {target} and {type} too ({type} is "" when unset).
  Destination typed("typed");
  options.url = SharedReceiver().BaseUrl() + "/hooks/{topic}?target={target}&type={type}";
  Envelope with_type = Make(typed.name());
  with_type.target = "a&b=c";
  with_type.type = "Order/Placed";
  Envelope without_type = Make(typed.name());
  const std::vector<Envelope> typed_batch{with_type, without_type};
  ExpectAllPublished(Publish(options, typed_batch), typed_batch);
  const auto requests = typed.WaitFor(2);
  ASSERT_EQ(requests.size(), 2U);
  EXPECT_EQ(RequestOf(requests, with_type.id)->path,
            "/hooks/" + typed.name() + "?target=a%26b%3Dc&type=Order%2FPlaced");
  EXPECT_EQ(RequestOf(requests, without_type.id)->path,
            "/hooks/" + typed.name() + "?target=default&type=");
}

// RFC 3986's remove_dot_segments (5.2.4) on a path, as a proxy or server normalising it does
// (without decoding %2E: that is the point).
std::string RemoveDotSegments(std::string_view path) {
  std::vector<std::string_view> kept;
  std::size_t at = 1;  // after the leading '/'
  while (at <= path.size()) {
    const std::size_t slash = std::min(path.find('/', at), path.size());
    const std::string_view segment = path.substr(at, slash - at);
    if (segment == "..") {
      if (!kept.empty()) kept.pop_back();
    } else if (segment != ".") {
      kept.push_back(segment);
    }
    at = slash + 1;
  }
  std::string out;
  for (const std::string_view segment : kept) out += "/" + std::string{segment};
  return out;
}

// Issue #39 (4): http://host/hooks/{topic}/tail with topic ".." was sent as /hooks/../tail, which
// proxies normalise to /tail. Every topic's request now stays under /hooks/ however its path is
// normalised: "." and ".." are sent as %2E and %2E%2E, '/' as %2F.
TEST(HttpSinkTest, DotTopicsStayInsideThePrefix) {
  webhook::SinkOptions options = SharedOptions();
  options.url = SharedReceiver().BaseUrl() + "/hooks/{topic}/tail";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {".", "/hooks/%2E/tail"}, {"..", "/hooks/%2E%2E/tail"}, {"a/b", "/hooks/a%2Fb/tail"}};
  std::vector<std::unique_ptr<Destination>> destinations;
  std::vector<Envelope> batch;
  for (const auto& [topic, path] : cases) {
    // The receiver names a destination by the decoded path after /hooks/.
    destinations.push_back(std::make_unique<Destination>(SharedReceiver(), topic + "/tail"));
    batch.push_back(Make(topic));
  }
  ExpectAllPublished(Publish(options, batch), batch);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto requests = destinations[i]->WaitFor(1);
    ASSERT_EQ(requests.size(), 1U) << cases[i].first;
    EXPECT_EQ(requests[0].path, cases[i].second);
    EXPECT_TRUE(RemoveDotSegments(requests[0].path).starts_with("/hooks/"))
        << requests[0].path << " normalised is " << RemoveDotSegments(requests[0].path);
    EXPECT_EQ(requests[0].Header("outbox-topic"), std::optional<std::string>{cases[i].first});
  }
  // What the test's normaliser would have made of the old requests.
  EXPECT_EQ(RemoveDotSegments("/hooks/../tail"), "/tail");
  EXPECT_EQ(RemoveDotSegments("/hooks/./tail"), "/hooks/tail");
}

// --- How answers are classified -----------------------------------------------------------------

TEST(HttpSinkTest, StatusesAreClassifiedAsDocumented) {
  struct Case {
    int status;
    std::optional<FailureKind> kind;  // nullopt: published
    std::string extra;                // more of the plan entry's JSON
  };
  const std::vector<Case> cases = {
      {200, std::nullopt, ""},
      {201, std::nullopt, ""},
      {202, std::nullopt, ""},
      {204, std::nullopt, ""},
      {299, std::nullopt, ""},
      {400, FailureKind::kPermanent, R"(, "body": "field x is missing")"},
      {401, FailureKind::kUnavailable, ""},
      {403, FailureKind::kUnavailable, ""},
      {404, FailureKind::kRejected, ""},
      {410, FailureKind::kRejected, ""},
      {413, FailureKind::kPermanent, ""},
      {422, FailureKind::kPermanent, ""},
      {405, FailureKind::kRejected, ""},
      {407, FailureKind::kUnavailable, ""},
      {409, FailureKind::kRejected, ""},
      {415, FailureKind::kPermanent, ""},
      {408, FailureKind::kRejected, ""},
      {429, FailureKind::kRejected, ""},
      {500, FailureKind::kRejected, R"(, "body": "internal error")"},
      {502, FailureKind::kRejected, ""},
      {503, FailureKind::kRejected, ""},
      {504, FailureKind::kRejected, ""},
      {599, FailureKind::kRejected, ""},
      {600, FailureKind::kRejected, ""},
  };
  std::vector<std::unique_ptr<Destination>> destinations;
  std::vector<Envelope> batch;
  for (const Case& c : cases) {
    destinations.push_back(std::make_unique<Destination>(
        "status-" + std::to_string(c.status),
        R"({"plan": [{"status": )" + std::to_string(c.status) + c.extra + "}]}"));
    batch.push_back(Make(destinations.back()->name()));
  }
  // A destination never created: the receiver's own 404.
  batch.push_back(Make(UniqueDestination("never-created")));

  const auto outcomes = Publish(SharedOptions(), batch);
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(KindOf(outcomes[i]), cases[i].kind)
        << "HTTP " << cases[i].status << ": " << Describe(outcomes[i]);
    if (cases[i].kind) {
      EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), "HTTP " + std::to_string(cases[i].status)))
          << Describe(outcomes[i]);
    }
    EXPECT_EQ(destinations[i]->WaitFor(1).size(), 1U) << "HTTP " << cases[i].status;
  }
  // The answer's body is quoted in the reason.
  EXPECT_TRUE(Contains(ReasonOf(outcomes[5]), "field x is missing")) << Describe(outcomes[5]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[18]), "internal error")) << Describe(outcomes[18]);
  EXPECT_EQ(KindOf(outcomes.back()), FailureKind::kRejected) << Describe(outcomes.back());
  EXPECT_TRUE(Contains(ReasonOf(outcomes.back()), "HTTP 404")) << Describe(outcomes.back());
}

TEST(HttpSinkTest, RetryStatusesMakeThoseRejected) {
  Destination listed("listed", R"({"plan": [{"status": 400}]})");
  Destination also_listed("also-listed", R"({"plan": [{"status": 401}]})");
  Destination not_listed("not-listed", R"({"plan": [{"status": 422}]})");
  webhook::SinkOptions options = SharedOptions();
  options.retry_statuses = {400, 401};
  const std::vector<Envelope> batch{Make(listed.name()), Make(also_listed.name()),
                                    Make(not_listed.name()), Make(UniqueDestination("absent"))};
  const auto outcomes = Publish(options, batch);
  ASSERT_EQ(outcomes.size(), 4U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kRejected) << Describe(outcomes[0]);
  EXPECT_EQ(KindOf(outcomes[1]), FailureKind::kRejected) << Describe(outcomes[1]);
  EXPECT_EQ(KindOf(outcomes[2]), FailureKind::kPermanent) << Describe(outcomes[2]);
  EXPECT_EQ(KindOf(outcomes[3]), FailureKind::kRejected) << Describe(outcomes[3]);
}

TEST(HttpSinkTest, RedirectsAreRejectedNamingTheLocationAndNotFollowed) {
  Destination target("redirect-target");
  const std::string absolute = SharedReceiver().BaseUrl() + "/hooks/" + target.name();
  const std::string relative = "/hooks/" + target.name() + "?relative=1";
  const std::vector<std::pair<int, std::string>> redirects = {
      {301, absolute}, {302, relative}, {303, absolute}, {307, absolute}, {308, absolute}};
  std::vector<std::unique_ptr<Destination>> destinations;
  std::vector<Envelope> batch;
  for (const auto& [status, location] : redirects) {
    destinations.push_back(std::make_unique<Destination>(
        "redirect-" + std::to_string(status), R"({"plan": [{"status": )" + std::to_string(status) +
                                                  R"(, "location": ")" + location + R"("}]})"));
    batch.push_back(Make(destinations.back()->name()));
  }
  const auto outcomes = Publish(SharedOptions(), batch);
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < redirects.size(); ++i) {
    EXPECT_EQ(KindOf(outcomes[i]), FailureKind::kRejected) << Describe(outcomes[i]);
    EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), "HTTP " + std::to_string(redirects[i].first)))
        << Describe(outcomes[i]);
    // The Location, made absolute.
    const std::string location = redirects[i].second.starts_with("/")
                                     ? SharedReceiver().BaseUrl() + redirects[i].second
                                     : redirects[i].second;
    EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), location)) << Describe(outcomes[i]);
    EXPECT_EQ(destinations[i]->WaitFor(1).size(), 1U);
  }
  // Not followed: nothing reached the target (given time to arrive, had it been sent).
  std::this_thread::sleep_for(milliseconds{300});
  EXPECT_TRUE(target.Requests().empty());
}

// --- Retry-After --------------------------------------------------------------------------------

TEST(HttpSinkTest, RetryAfterHoldsItsHostOnlyAndNothingReachesItBeforeTheTime) {
  // Two receivers on one port, on 127.0.0.1 and 127.0.0.2: one sink reaches both, the host being
  // the envelope's target.
  std::unique_ptr<WebhookReceiver> first;
  std::unique_ptr<WebhookReceiver> second;
  for (int attempt = 0; attempt < 5 && !second; ++attempt) {
    first = std::make_unique<WebhookReceiver>(std::vector<std::string>{}, "127.0.0.1");
    try {
      second =
          std::make_unique<WebhookReceiver>(std::vector<std::string>{}, "127.0.0.2", first->port());
    } catch (const std::runtime_error& error) {  // that port is taken on 127.0.0.2: another one
      std::cerr << "second receiver: " << error.what() << "\n";
    }
  }
  ASSERT_TRUE(second) << "no port free on both 127.0.0.1 and 127.0.0.2";
  const std::string name = UniqueDestination("retry-after");
  Destination on_first(*first, name, R"({"plan": [{"status": 429, "retry_after": "2"}]})");
  Destination on_second(*second, name);
  webhook::SinkOptions options = OptionsFor(*first);
  options.url = "http://{target}:" + std::to_string(first->port()) + "/hooks/{topic}";
  const auto sink = webhook::OpenSink(options);
  const auto to = [&name](const std::string& host) {
    Envelope envelope = Make(name);
    envelope.target = host;
    return envelope;
  };

  const std::vector<Envelope> asked{to("127.0.0.1")};
  const auto answer = sink->Publish(asked, In(seconds{10}));
  ASSERT_EQ(KindOf(answer.at(0)), FailureKind::kRejected) << Describe(answer[0]);
  EXPECT_TRUE(Contains(ReasonOf(answer[0]), "HTTP 429")) << Describe(answer[0]);
  EXPECT_EQ(answer[0].failure->retry_after, milliseconds{2000});

  // At once: the first host's messages are not sent, the second host's are.
  const std::vector<Envelope> batch{to("127.0.0.1"), to("127.0.0.2"), to("127.0.0.1"),
                                    to("127.0.0.2")};
  const auto start = SteadyClock::now();
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  const milliseconds took = Since(start);
  ASSERT_EQ(outcomes.size(), 4U);
  for (const std::size_t i : {0U, 2U}) {
    EXPECT_EQ(KindOf(outcomes[i]), FailureKind::kUnavailable) << Describe(outcomes[i]);
    EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), "asked to wait")) << Describe(outcomes[i]);
    EXPECT_GT(outcomes[i].failure->retry_after, milliseconds{0});
    EXPECT_LE(outcomes[i].failure->retry_after, milliseconds{2000});
  }
  EXPECT_TRUE(outcomes[1].published()) << Describe(outcomes[1]);
  EXPECT_TRUE(outcomes[3].published()) << Describe(outcomes[3]);
  EXPECT_LT(took, milliseconds{2000}) << "the sink waited for the first host";
  EXPECT_EQ(on_second.WaitFor(2).size(), 2U);
  EXPECT_EQ(on_first.Requests().size(), 1U);

  // Once the time is up, the first host gets them; none came before.
  const std::vector<Envelope> later{batch[0], batch[2]};
  ExpectAllPublished(PublishUntilAllPublished(*sink, later), later);
  const auto requests = on_first.WaitFor(3);
  ASSERT_EQ(requests.size(), 3U);
  ASSERT_EQ(requests[0].status, std::optional<int>{429});
  for (std::size_t i = 1; i < requests.size(); ++i) {
    EXPECT_GE(requests[i].t, requests[0].answered_t + 2.0)
        << "request " << i << " came " << requests[i].t - requests[0].answered_t
        << " s after the 429";
  }
}

TEST(HttpSinkTest, RetryAfterForms) {
  struct Case {
    std::string name;
    std::string plan;  // one answer
    milliseconds max_retry_after;
    milliseconds least;  // the failure's retry_after, at least and at most
    milliseconds most;
  };
  char date[64];
  const std::time_t in_three = std::time(nullptr) + 3;
  std::tm utc{};
  gmtime_r(&in_three, &utc);
  std::strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &utc);
  const std::vector<Case> cases = {
      {"503 with seconds", R"({"status": 503, "retry_after": "1"})", std::chrono::minutes{10},
       milliseconds{1000}, milliseconds{1000}},
      {"429 without", R"({"status": 429})", std::chrono::minutes{10}, milliseconds{1000},
       milliseconds{1000}},
      {"429 over the maximum", R"({"status": 429, "retry_after": "3600"})", milliseconds{1000},
       milliseconds{1000}, milliseconds{1000}},
      {"503 with a date", R"({"status": 503, "retry_after": ")" + std::string{date} + R"("})",
       std::chrono::minutes{10}, milliseconds{1000}, milliseconds{4000}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Destination destination("retry-after-form", R"({"plan": [)" + c.plan + "]}");
    webhook::SinkOptions options = SharedOptions();
    options.max_retry_after = c.max_retry_after;
    const auto sink = webhook::OpenSink(options);
    const std::vector<Envelope> batch{Make(destination.name())};
    const auto first = sink->Publish(batch, In(seconds{10}));
    ASSERT_EQ(KindOf(first.at(0)), FailureKind::kRejected) << Describe(first[0]);
    EXPECT_GE(first[0].failure->retry_after, c.least);
    EXPECT_LE(first[0].failure->retry_after, c.most);
    // The host waits: the next one is not sent.
    const auto next = sink->Publish(batch, In(seconds{10}));
    EXPECT_EQ(KindOf(next.at(0)), FailureKind::kUnavailable) << Describe(next[0]);
    EXPECT_GT(next[0].failure->retry_after, milliseconds{0});
    EXPECT_EQ(destination.Requests().size(), 1U);
  }

  // A Retry-After on a status other than 429 and 503 is not honoured.
  Destination ignored("retry-after-500", R"({"plan": [{"status": 500, "retry_after": "60"}]})");
  const auto sink = webhook::OpenSink(SharedOptions());
  const std::vector<Envelope> batch{Make(ignored.name())};
  const auto first = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(KindOf(first.at(0)), FailureKind::kRejected) << Describe(first[0]);
  EXPECT_EQ(first[0].failure->retry_after, milliseconds{0});
  ExpectAllPublished(sink->Publish(batch, In(seconds{10})), batch);
}

// A 503 with Retry-After while more requests wait for the host: they are not sent in that Publish
// either; once the time is up they are, and a later 503 without Retry-After (on the same reused
// libcurl handle) makes nobody wait.
TEST(HttpSinkTest, RetryAfterStopsWhatWaitsInTheSameBatchAndIsNotRemembered) {
  Destination destination(
      "retry-after-batch",
      R"({"plan": [{"status": 503, "retry_after": "1"}, {"status": 200}, {"status": 503}]})");
  webhook::SinkOptions options = SharedOptions();
  options.max_in_flight = 1;  // one at a time, in batch order
  const auto sink = webhook::OpenSink(options);
  const std::vector<Envelope> batch{Make(destination.name()), Make(destination.name()),
                                    Make(destination.name())};
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 3U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kRejected) << Describe(outcomes[0]);
  EXPECT_EQ(outcomes[0].failure->retry_after, milliseconds{1000});
  for (const std::size_t i : {1U, 2U}) {
    EXPECT_EQ(KindOf(outcomes[i]), FailureKind::kUnavailable) << Describe(outcomes[i]);
    EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), "asked to wait")) << Describe(outcomes[i]);
    EXPECT_GT(outcomes[i].failure->retry_after, milliseconds{0});
    EXPECT_LE(outcomes[i].failure->retry_after, milliseconds{1000});
  }
  ASSERT_EQ(destination.WaitFor(1).size(), 1U);

  std::this_thread::sleep_for(milliseconds{1100});
  const std::vector<Envelope> later{batch[1], batch[2]};
  const auto after = sink->Publish(later, In(seconds{10}));
  ASSERT_EQ(after.size(), 2U);
  EXPECT_TRUE(after[0].published()) << Describe(after[0]);
  EXPECT_EQ(KindOf(after[1]), FailureKind::kRejected) << Describe(after[1]);
  EXPECT_TRUE(Contains(ReasonOf(after[1]), "HTTP 503")) << Describe(after[1]);
  EXPECT_EQ(after[1].failure->retry_after, milliseconds{0}) << "the earlier Retry-After stuck";
  // Nobody waits: sent at once.
  const std::vector<Envelope> last{batch[2]};
  ExpectAllPublished(sink->Publish(last, In(seconds{10})), last);
  const auto requests = destination.WaitFor(4);
  ASSERT_EQ(requests.size(), 4U);
  for (std::size_t i = 1; i < requests.size(); ++i) {
    EXPECT_GE(requests[i].t, requests[0].answered_t + 1.0) << i;
  }
}

// --- Order and limits ---------------------------------------------------------------------------

TEST(HttpSinkTest, OneRequestInFlightPerStreamWhileStreamsOverlap) {
  Destination destination("in-flight-stream", R"({"delay_ms": 300})");
  std::vector<Envelope> batch;
  for (std::int64_t seq = 1; seq <= 3; ++seq) {
    batch.push_back(MakeInStream(destination.name(), "stream-a", seq));
    batch.push_back(MakeInStream(destination.name(), "stream-b", seq));
  }
  ExpectAllPublished(Publish(SharedOptions(), batch), batch);
  const auto requests = destination.WaitFor(batch.size());
  ASSERT_EQ(requests.size(), batch.size());

  std::map<std::string, std::vector<ReceivedRequest>> by_stream;
  for (const ReceivedRequest& request : requests) {
    by_stream[request.stream_key.value_or("")].push_back(request);
  }
  ASSERT_EQ(by_stream.size(), 2U);
  for (auto& [stream, own] : by_stream) {
    std::sort(own.begin(), own.end(), [](const auto& a, const auto& b) { return a.t < b.t; });
    ASSERT_EQ(own.size(), 3U);
    for (std::size_t i = 0; i < own.size(); ++i) {
      EXPECT_EQ(own[i].stream_seq, std::optional<std::int64_t>{static_cast<std::int64_t>(i + 1)})
          << stream;
      if (i > 0) {
        // Sent only after the one before it was answered.
        EXPECT_GE(own[i].t, own[i - 1].answered_t) << stream << " " << i;
        EXPECT_FALSE(Overlap(own[i], own[i - 1])) << stream << " " << i;
      }
    }
  }
  // The two streams did not wait for each other.
  bool overlapped = false;
  for (const ReceivedRequest& a : by_stream["stream-a"]) {
    for (const ReceivedRequest& b : by_stream["stream-b"]) overlapped = overlapped || Overlap(a, b);
  }
  EXPECT_TRUE(overlapped) << "the two streams never had requests in flight together";
}

TEST(HttpSinkTest, MaxInFlightPerHostIsNeverExceeded) {
  constexpr std::size_t kLimit = 3;
  Destination destination("max-in-flight", R"({"delay_ms": 300})");
  webhook::SinkOptions options = SharedOptions();
  options.max_in_flight = kLimit;
  std::vector<Envelope> batch;
  for (int i = 0; i < 12; ++i) batch.push_back(Make(destination.name()));
  ExpectAllPublished(Publish(options, batch, seconds{20}), batch);
  const auto requests = destination.WaitFor(batch.size());
  ASSERT_EQ(requests.size(), batch.size());
  const std::size_t most = MostAtOnce(requests);
  EXPECT_LE(most, kLimit);
  EXPECT_EQ(most, kLimit) << "the sink never used its limit";
}

TEST(HttpSinkTest, AStreamStopsAfterARetriableFailureButGoesOnAfterAPermanentOne) {
  // 503 first: the stream's later messages are not sent (kOutcomeUnknown, "not sent"); a message
  // without a stream, to another destination, is.
  Destination retried("stream-503", R"({"plan": [{"status": 503}]})");
  Destination other("stream-other");
  const std::vector<Envelope> stopped{MakeInStream(retried.name(), "s", 1),
                                      MakeInStream(retried.name(), "s", 2), Make(other.name()),
                                      MakeInStream(retried.name(), "s", 3)};
  const auto outcomes = Publish(SharedOptions(), stopped);
  ASSERT_EQ(outcomes.size(), 4U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kRejected) << Describe(outcomes[0]);
  for (const std::size_t i : {1U, 3U}) {
    EXPECT_EQ(KindOf(outcomes[i]), FailureKind::kOutcomeUnknown) << Describe(outcomes[i]);
    EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), "not sent")) << Describe(outcomes[i]);
  }
  EXPECT_TRUE(outcomes[2].published()) << Describe(outcomes[2]);
  EXPECT_EQ(other.WaitFor(1).size(), 1U);
  std::this_thread::sleep_for(milliseconds{300});  // time for anything sent by mistake to arrive
  const auto retried_requests = retried.Requests();
  ASSERT_EQ(retried_requests.size(), 1U);
  EXPECT_EQ(retried_requests[0].stream_seq, std::optional<std::int64_t>{1});

  // A permanent failure first (422): the rest of the stream goes on, in order.
  Destination permanent("stream-422", R"({"plan": [{"status": 422}]})");
  const std::vector<Envelope> going_on{MakeInStream(permanent.name(), "p", 1),
                                       MakeInStream(permanent.name(), "p", 2),
                                       MakeInStream(permanent.name(), "p", 3)};
  const auto after_permanent = Publish(SharedOptions(), going_on);
  ASSERT_EQ(after_permanent.size(), 3U);
  EXPECT_EQ(KindOf(after_permanent[0]), FailureKind::kPermanent) << Describe(after_permanent[0]);
  EXPECT_TRUE(after_permanent[1].published()) << Describe(after_permanent[1]);
  EXPECT_TRUE(after_permanent[2].published()) << Describe(after_permanent[2]);
  const auto requests = permanent.WaitFor(3);
  ASSERT_EQ(requests.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(requests[i].stream_seq,
              std::optional<std::int64_t>{static_cast<std::int64_t>(i + 1)});
    if (i > 0) {
      EXPECT_GE(requests[i].t, requests[i - 1].answered_t);
    }
  }

  // A message refused before sending (too large) is permanent too: the stream goes on.
  Destination refused("stream-refused");
  webhook::SinkOptions options = SharedOptions();
  options.max_message_bytes = 100;
  std::vector<Envelope> with_refused{MakeInStream(refused.name(), "r", 1),
                                     MakeInStream(refused.name(), "r", 2),
                                     MakeInStream(refused.name(), "r", 3)};
  with_refused[1].payload = std::string(101, 'x');
  const auto refused_outcomes = Publish(options, with_refused);
  EXPECT_TRUE(refused_outcomes.at(0).published()) << Describe(refused_outcomes[0]);
  EXPECT_EQ(KindOf(refused_outcomes.at(1)), FailureKind::kPermanent)
      << Describe(refused_outcomes[1]);
  EXPECT_TRUE(refused_outcomes.at(2).published()) << Describe(refused_outcomes[2]);
  EXPECT_EQ(refused.WaitFor(2).size(), 2U);
}

// --- Connections, timeouts, deadlines -----------------------------------------------------------

TEST(HttpSinkTest, ConnectionRefusedIsUnavailableForAllAndQuick) {
  CapturedLog log;
  webhook::SinkOptions options;
  const int port = FreePort();
  options.url = "http://relay:hunter2@127.0.0.1:" + std::to_string(port) + "/hooks/{topic}";
  options.connect_timeout = milliseconds{5000};
  options.log = log.Fn();
  const auto sink = webhook::OpenSink(options);
  const std::vector<Envelope> batch{Make("a"), Make("b"), MakeInStream("c", "s", 1),
                                    MakeInStream("c", "s", 2), Make("d")};
  auto start = SteadyClock::now();
  auto outcomes = sink->Publish(batch, In(seconds{10}));
  EXPECT_LT(Since(start), milliseconds{3000}) << "waited as if for a connect timeout";
  ASSERT_EQ(outcomes.size(), batch.size());
  for (const PublishOutcome& outcome : outcomes) {
    EXPECT_EQ(KindOf(outcome), FailureKind::kUnavailable) << Describe(outcome);
    EXPECT_FALSE(Contains(ReasonOf(outcome), "hunter2")) << Describe(outcome);
  }
  // Right after: refused at once (the host's backoff), still unavailable.
  start = SteadyClock::now();
  outcomes = sink->Publish(batch, In(seconds{10}));
  EXPECT_LT(Since(start), milliseconds{3000});
  for (const PublishOutcome& outcome : outcomes) {
    EXPECT_EQ(KindOf(outcome), FailureKind::kUnavailable) << Describe(outcome);
  }
  // The warning names the endpoint with its password masked.
  const std::string logged = log.All();
  EXPECT_TRUE(Contains(logged, "relay:***@127.0.0.1")) << logged;
  EXPECT_FALSE(Contains(logged, "hunter2")) << logged;
}

// On a new connection. (On a reused one, libcurl sends a request that got nothing back once more
// by itself, taking the connection for one the server had closed while idle: the endpoint then
// gets the webhook-id twice and the sink reports what the second answer says.)
TEST(HttpSinkTest, ConnectionResetByTheEndpointIsOutcomeUnknown) {
  Destination destination("reset", R"({"plan": [{"reset": true}]})");
  const auto sink = webhook::OpenSink(SharedOptions());
  const std::vector<Envelope> batch{Make(destination.name())};
  const auto outcomes = sink->Publish(batch, In(seconds{10}));
  ASSERT_EQ(outcomes.size(), 1U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kOutcomeUnknown) << Describe(outcomes[0]);
  const auto requests = destination.WaitFor(1);
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_FALSE(requests[0].status.has_value());  // reset, not answered
  // Sent again, it arrives with the same webhook-id.
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch), batch);
  const auto again = destination.WaitFor(2);
  ASSERT_EQ(again.size(), 2U);
  EXPECT_EQ(again[0].id, again[1].id);
  EXPECT_EQ(again[1].id, std::optional<std::string>{batch[0].id.ToString()});
}

TEST(HttpSinkTest, RequestTimeoutIsOutcomeUnknown) {
  Destination destination("slow", R"({"delay_ms": 1500})");
  webhook::SinkOptions options = SharedOptions();
  options.request_timeout = milliseconds{300};
  const std::vector<Envelope> batch{Make(destination.name())};
  const auto outcomes = Publish(options, batch, seconds{20});
  ASSERT_EQ(outcomes.size(), 1U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kOutcomeUnknown) << Describe(outcomes[0]);
  // By the request timeout, not by the Publish deadline; named as such.
  EXPECT_TRUE(Contains(ReasonOf(outcomes[0]), "sent, no answer within request_timeout (300 ms)"))
      << Describe(outcomes[0]);
  EXPECT_FALSE(Contains(ReasonOf(outcomes[0]), "deadline")) << Describe(outcomes[0]);
  // It did arrive (the receiver answers it later, to nobody).
  EXPECT_EQ(destination.WaitFor(1).size(), 1U);
}

// Issue #40: one path of a host that never answers is that request's problem. Over plain HTTP
// with http_version "auto" (the default), libcurl used to hold every other request to the host
// behind the unanswered one's connection (CURLOPT_PIPEWAIT: waiting to learn whether it
// multiplexes), and then fail them at once, their request timeout spent while queued, as "Failed
// to resolve host '127.0.0.1' with timeout after 0 ms": unavailable, the host marked down.
TEST(HttpSinkTest, OneRequestNeverAnsweredStopsNothingElseOfItsHost) {
  WebhookReceiver receiver;
  Destination hung(receiver, "hung", R"({"delay_ms": 30000})");
  Destination healthy(receiver, "healthy");
  webhook::SinkOptions options = OptionsFor(receiver);
  options.http_version = webhook::HttpVersion::kAuto;
  options.request_timeout = milliseconds{1500};
  const auto sink = webhook::OpenSink(options);
  std::size_t healthy_sent = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<Envelope> batch{MakeInStream(hung.name(), "hung-stream", 1)};
    for (int i = 0; i < 20; ++i)
      batch.push_back(MakeInStream(healthy.name(), "s" + std::to_string(i), round + 1));
    const auto start = SteadyClock::now();
    const auto outcomes = sink->Publish(batch, In(seconds{10}));
    const milliseconds took = Since(start);
    ASSERT_EQ(outcomes.size(), batch.size());
    EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kOutcomeUnknown) << Describe(outcomes[0]);
    EXPECT_TRUE(Contains(ReasonOf(outcomes[0]), "no answer within request_timeout (1500 ms)"))
        << Describe(outcomes[0]);
    EXPECT_FALSE(Contains(ReasonOf(outcomes[0]), "resolve")) << Describe(outcomes[0]);
    for (std::size_t i = 1; i < outcomes.size(); ++i) {
      EXPECT_TRUE(outcomes[i].published()) << round << "/" << i << ": " << Describe(outcomes[i]);
    }
    EXPECT_GE(took.count(), 1400) << "the Publish waits for the hung request's timeout";
    EXPECT_LT(took.count(), 3000);
    // The healthy path's requests were all answered within a second of the first one arriving.
    healthy_sent += 20;
    const auto requests = healthy.WaitFor(healthy_sent);
    ASSERT_EQ(requests.size(), healthy_sent);
    double first = 1e18;
    double last = 0;
    for (std::size_t i = healthy_sent - 20; i < healthy_sent; ++i) {
      first = std::min(first, requests[i].t);
      last = std::max(last, requests[i].answered_t);
    }
    EXPECT_LT(last - first, 1.0) << "round " << round;
  }
  // The host is not down: the next batch goes at once.
  const std::vector<Envelope> after{Make(healthy.name()), Make(healthy.name())};
  const auto start = SteadyClock::now();
  ExpectAllPublished(sink->Publish(after, In(seconds{10})), after);
  EXPECT_LT(Since(start).count(), 1000);
}

// Many timeouts do mean the host is down: 3 different messages in a row timed out with no answer
// of any kind in between. One answer resets the count.
TEST(HttpSinkTest, TimeoutsOfThreeMessagesInARowWithNoAnswerMarkTheHostDown) {
  WebhookReceiver receiver;
  Destination hung(receiver, "hung", R"({"delay_ms": 30000})");
  Destination healthy(receiver, "healthy");
  webhook::SinkOptions options = OptionsFor(receiver);
  options.request_timeout = milliseconds{300};
  const auto sink = webhook::OpenSink(options);

  // Two, then an answer, then one: not down.
  const std::vector<Envelope> two{Make(hung.name()), Make(hung.name())};
  for (const auto& outcome : sink->Publish(two, In(seconds{10}))) {
    EXPECT_EQ(KindOf(outcome), FailureKind::kOutcomeUnknown) << Describe(outcome);
  }
  const std::vector<Envelope> one_ok{Make(healthy.name())};
  ExpectAllPublished(sink->Publish(one_ok, In(seconds{10})), one_ok);
  const std::vector<Envelope> one{Make(hung.name())};
  EXPECT_EQ(KindOf(sink->Publish(one, In(seconds{10})).at(0)), FailureKind::kOutcomeUnknown);
  const std::vector<Envelope> two_ok{Make(healthy.name())};
  ExpectAllPublished(sink->Publish(two_ok, In(seconds{10})), two_ok);

  // The same message three times is one message: not down.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(KindOf(sink->Publish(one, In(seconds{10})).at(0)), FailureKind::kOutcomeUnknown);
  }
  const std::vector<Envelope> three_ok{Make(healthy.name())};
  ExpectAllPublished(sink->Publish(three_ok, In(seconds{10})), three_ok);

  // Three different ones with nothing answered: down.
  const std::vector<Envelope> three{Make(hung.name()), Make(hung.name()), Make(hung.name())};
  for (const auto& outcome : sink->Publish(three, In(seconds{10}))) {
    EXPECT_EQ(KindOf(outcome), FailureKind::kOutcomeUnknown) << Describe(outcome);
  }
  const std::vector<Envelope> waits{Make(healthy.name())};
  const auto refused = sink->Publish(waits, In(seconds{10}));
  EXPECT_EQ(KindOf(refused.at(0)), FailureKind::kUnavailable) << Describe(refused[0]);
  EXPECT_TRUE(Contains(ReasonOf(refused[0]), "3 different messages in a row got no answer"))
      << Describe(refused[0]);
  std::this_thread::sleep_for(milliseconds{150});
  ExpectAllPublished(sink->Publish(waits, In(seconds{10})), waits);
}

// 401/403/407 refuse the relay: the host pauses as if unreachable, no attempt spent; once the
// host accepts a request sent after its last refusal, a refusal counts against its message.
TEST(HttpSinkTest, RefusalsOfTheRelayPauseTheHostUnlessItAcceptsOthers) {
  WebhookReceiver receiver;
  Destination auth(receiver, "auth", R"({"refuse_status": 401, "refuse_seconds": 1.0})");
  Destination healthy(receiver, "healthy");
  const auto sink = webhook::OpenSink(OptionsFor(receiver));
  const std::vector<Envelope> first{Make(auth.name())};
  const auto refused = sink->Publish(first, In(seconds{10}));
  EXPECT_EQ(KindOf(refused.at(0)), FailureKind::kUnavailable) << Describe(refused[0]);
  EXPECT_TRUE(
      Contains(ReasonOf(refused[0]), "the endpoint refuses the relay (its credentials): HTTP 401"))
      << Describe(refused[0]);
  // The whole host waits: nothing is sent to the healthy path meanwhile.
  const std::vector<Envelope> other{Make(healthy.name())};
  const auto waiting = sink->Publish(other, In(seconds{10}));
  EXPECT_EQ(KindOf(waiting.at(0)), FailureKind::kUnavailable) << Describe(waiting[0]);
  EXPECT_TRUE(Contains(ReasonOf(waiting[0]), "refuses the relay")) << Describe(waiting[0]);
  EXPECT_TRUE(Contains(ReasonOf(waiting[0]), "trying again in")) << Describe(waiting[0]);
  EXPECT_TRUE(healthy.Requests().empty());
  // Once the endpoint accepts again, both go.
  const auto both = std::vector<Envelope>{first[0], other[0]};
  ExpectAllPublished(PublishUntilAllPublished(*sink, both, seconds{10}), both);

  // A 403 for one path now that the host accepted requests sent after its last refusal: that
  // message's (an attempt spent), and the host is not paused.
  Destination forbidden(receiver, "forbidden", R"({"refuse_status": 403, "refuse_seconds": 600})");
  const std::vector<Envelope> bad{Make(forbidden.name())};
  const auto once = sink->Publish(bad, In(seconds{10}));
  EXPECT_EQ(KindOf(once.at(0)), FailureKind::kRejected) << Describe(once[0]);
  EXPECT_TRUE(Contains(ReasonOf(once[0]), "HTTP 403")) << Describe(once[0]);
  EXPECT_TRUE(Contains(ReasonOf(once[0]), "counted against this message")) << Describe(once[0]);
  const std::vector<Envelope> good{Make(healthy.name()), Make(healthy.name())};
  ExpectAllPublished(sink->Publish(good, In(seconds{10})), good);
  // Accepted again since: the next refusal is the message's again.
  const auto twice = sink->Publish(bad, In(seconds{10}));
  EXPECT_EQ(KindOf(twice.at(0)), FailureKind::kRejected) << Describe(twice[0]);
  // Each refusal starts the comparison anew: a refusal with no acceptance since the last one (as
  // when rotated credentials make the endpoint refuse everything) is the host's.
  const std::vector<Envelope> next{Make(forbidden.name())};
  const auto host = sink->Publish(next, In(seconds{10}));
  EXPECT_EQ(KindOf(host.at(0)), FailureKind::kUnavailable) << Describe(host[0]);
  EXPECT_TRUE(Contains(ReasonOf(host[0]), "the endpoint refuses the relay (its permissions)"))
      << Describe(host[0]);
}

TEST(HttpSinkTest, AbandonStatusesAbandonAndRetryStatusesWin) {
  Destination listed("abandon-404", R"({"plan": [{"status": 404}]})");
  Destination listed_5xx("abandon-501", R"({"plan": [{"status": 501}]})");
  Destination not_listed("abandon-410", R"({"plan": [{"status": 410}]})");
  Destination retried("retry-422", R"({"plan": [{"status": 422}]})");
  Destination refused("abandon-403", R"({"plan": [{"status": 403}]})");
  webhook::SinkOptions options = SharedOptions();
  options.abandon_statuses = {404, 501, 403};
  options.retry_statuses = {422};
  const std::vector<Envelope> batch{Make(listed.name()), Make(listed_5xx.name()),
                                    Make(not_listed.name()), Make(retried.name()),
                                    Make(refused.name())};
  const auto outcomes = Publish(options, batch);
  ASSERT_EQ(outcomes.size(), 5U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kPermanent) << Describe(outcomes[0]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[0]), "abandon_statuses")) << Describe(outcomes[0]);
  EXPECT_EQ(KindOf(outcomes[1]), FailureKind::kPermanent) << Describe(outcomes[1]);
  EXPECT_EQ(KindOf(outcomes[2]), FailureKind::kRejected) << Describe(outcomes[2]);
  EXPECT_EQ(KindOf(outcomes[3]), FailureKind::kRejected) << Describe(outcomes[3]);
  EXPECT_EQ(KindOf(outcomes[4]), FailureKind::kPermanent) << Describe(outcomes[4]);
}

TEST(HttpSinkTest, TheDeadlineEndsWhatIsInFlightAndWhatWaits) {
  Destination destination("deadline", R"({"delay_ms": 3000})");
  webhook::SinkOptions options = SharedOptions();
  options.max_in_flight = 1;
  const std::vector<Envelope> batch{Make(destination.name()), Make(destination.name())};
  const auto start = SteadyClock::now();
  const auto outcomes = Publish(options, batch, milliseconds{500});
  EXPECT_GE(Since(start), milliseconds{450});
  ASSERT_EQ(outcomes.size(), 2U);
  // The first was sent and got no answer; the second never had its turn.
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kOutcomeUnknown) << Describe(outcomes[0]);
  EXPECT_EQ(KindOf(outcomes[1]), FailureKind::kUnavailable) << Describe(outcomes[1]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[1]), "deadline")) << Describe(outcomes[1]);
}

// --- Refused before sending ---------------------------------------------------------------------

TEST(HttpSinkTest, APayloadOverMaxMessageBytesIsPermanentAndNotSent) {
  Destination destination("too-large");
  webhook::SinkOptions options = SharedOptions();
  options.max_message_bytes = 1000;
  const std::vector<Envelope> batch{Make(destination.name(), std::string(1000, 'a')),
                                    Make(destination.name(), std::string(1001, 'b'))};
  const auto outcomes = Publish(options, batch);
  ASSERT_EQ(outcomes.size(), 2U);
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  EXPECT_EQ(KindOf(outcomes[1]), FailureKind::kPermanent) << Describe(outcomes[1]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[1]), "max_message_bytes")) << Describe(outcomes[1]);
  EXPECT_EQ(destination.WaitFor(1).size(), 1U);
  std::this_thread::sleep_for(milliseconds{300});
  const auto requests = destination.Requests();
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_EQ(requests[0].payload.size(), 1000U);
}

TEST(HttpSinkTest, WhatAHeaderCannotCarryIsPermanentForThatMessageOnly) {
  Destination destination("bad-header");
  Envelope good_before = Make(destination.name());
  Envelope crlf = Make(destination.name());
  crlf.headers = {{"X-Note", "line\r\nX-Injected: 1"}};
  Envelope lf = Make(destination.name());
  lf.headers = {{"X-Note", "line\nX-Injected: 1"}};
  Envelope nul = Make(destination.name());
  nul.headers = {{"X-Note", std::string{"a\0b", 3}}};
  Envelope bad_name = Make(destination.name());
  bad_name.headers = {{"X Note", "v"}};
  Envelope bad_type = Make(destination.name());
  bad_type.type = "Order\r\nX-Injected: 1";
  Envelope bad_stream = Make(destination.name());
  bad_stream.stream_key = "s\n1";
  Envelope bad_content_type = Make(destination.name());
  bad_content_type.content_type = "text/plain\r\nX-Injected: 1";
  Envelope bad_database = Make(destination.name());
  bad_database.database = "tenant\r\nX-Injected: 1";
  Envelope good_after = Make(destination.name());
  good_after.headers = {{"X-Note", "fine: with a colon\tand a tab"}};
  const std::vector<Envelope> batch{good_before,  crlf,      lf,         nul,
                                    bad_name,     bad_type,  bad_stream, bad_content_type,
                                    bad_database, good_after};
  const auto outcomes = Publish(SharedOptions(), batch);
  ASSERT_EQ(outcomes.size(), batch.size());
  EXPECT_TRUE(outcomes.front().published()) << Describe(outcomes.front());
  EXPECT_TRUE(outcomes.back().published()) << Describe(outcomes.back());
  for (std::size_t i = 1; i + 1 < batch.size(); ++i) {
    EXPECT_EQ(KindOf(outcomes[i]), FailureKind::kPermanent) << i << ": " << Describe(outcomes[i]);
  }
  EXPECT_EQ(destination.WaitFor(2).size(), 2U);
  std::this_thread::sleep_for(milliseconds{300});
  const auto requests = destination.Requests();
  ASSERT_EQ(requests.size(), 2U);
  for (const ReceivedRequest& request : requests) {
    EXPECT_FALSE(request.Header("x-injected").has_value());
  }
  EXPECT_EQ(RequestOf(requests, good_after.id)->Header("x-note"),
            std::optional<std::string>{"fine: with a colon\tand a tab"});
}

TEST(HttpSinkTest, AnExpandedUrlThatIsNotValidIsPermanentForThatMessageOnly) {
  Destination destination("bad-url");
  webhook::SinkOptions options = SharedOptions();
  options.url =
      "http://relay:hunter2@{target}:" + std::to_string(SharedReceiver().port()) + "/hooks/{topic}";
  const auto to = [&destination](const std::string& target) {
    Envelope envelope = Make(destination.name());
    envelope.target = target;
    return envelope;
  };
  const std::vector<Envelope> batch{to("127.0.0.1"), to("bad host"), to(""), to("a@b"),
                                    to("127.0.0.1")};
  const auto outcomes = Publish(options, batch);
  ASSERT_EQ(outcomes.size(), batch.size());
  EXPECT_TRUE(outcomes[0].published()) << Describe(outcomes[0]);
  EXPECT_TRUE(outcomes[4].published()) << Describe(outcomes[4]);
  for (std::size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(KindOf(outcomes[i]), FailureKind::kPermanent) << i << ": " << Describe(outcomes[i]);
    EXPECT_TRUE(Contains(ReasonOf(outcomes[i]), "relay:***@")) << Describe(outcomes[i]);
    EXPECT_FALSE(Contains(ReasonOf(outcomes[i]), "hunter2")) << Describe(outcomes[i]);
  }
  EXPECT_EQ(destination.WaitFor(2).size(), 2U);
}

// --- Authentication, method, proxy --------------------------------------------------------------

TEST(HttpSinkTest, UserInfoInTheUrlIsBasicAuthenticationAndMasked) {
  Destination destination("basic-auth");
  webhook::SinkOptions options = SharedOptions();
  const std::string port = std::to_string(SharedReceiver().port());
  options.url = "http://relay:s3cr%40t@127.0.0.1:" + port + "/hooks/{topic}";
  const std::vector<Envelope> batch{Make(destination.name())};
  ExpectAllPublished(Publish(options, batch), batch);
  const auto requests = destination.WaitFor(1);
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_EQ(requests[0].Header("authorization"),
            std::optional<std::string>{"Basic " + Base64Encode("relay:s3cr@t")});
  EXPECT_EQ(webhook::MaskUrl(options.url), "http://relay:***@127.0.0.1:" + port + "/hooks/{topic}");
}

TEST(HttpSinkTest, PutSendsTheSameRequestWithMethodPut) {
  Destination destination("put");
  webhook::SinkOptions options = SharedOptions();
  options.method = "PUT";
  const std::vector<Envelope> batch{Make(destination.name(), R"({"put":true})")};
  ExpectAllPublished(Publish(options, batch), batch);
  const auto requests = destination.WaitFor(1);
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_EQ(requests[0].method, "PUT");
  EXPECT_EQ(requests[0].payload, R"({"put":true})");
  EXPECT_EQ(requests[0].signature_ok, std::optional<bool>{true});
  EXPECT_EQ(requests[0].Header("webhook-id"), std::optional<std::string>{batch[0].id.ToString()});
}

TEST(HttpSinkTest, AConfiguredProxyIsUsedAndTheEnvironmentsIsNot) {
  // The receiver doubles as a proxy (it serves the absolute form and records it as it came).
  Destination destination("proxied");
  webhook::SinkOptions options = SharedOptions();
  options.url = "http://hooks.invalid:9/hooks/{topic}";
  options.proxy = SharedReceiver().BaseUrl();
  const std::vector<Envelope> batch{Make(destination.name())};
  ExpectAllPublished(Publish(options, batch), batch);
  const auto requests = destination.WaitFor(1);
  ASSERT_EQ(requests.size(), 1U);
  EXPECT_EQ(requests[0].path, "http://hooks.invalid:9/hooks/" + destination.name());

  // http_proxy in the environment points nowhere: ignored.
  const char* saved = std::getenv("http_proxy");
  const std::optional<std::string> restore =
      saved == nullptr ? std::nullopt : std::optional<std::string>{saved};
  setenv("http_proxy", ("http://127.0.0.1:" + std::to_string(FreePort())).c_str(), 1);
  const std::vector<Envelope> direct{Make(destination.name())};
  const auto outcomes = Publish(SharedOptions(), direct);
  if (restore) {
    setenv("http_proxy", restore->c_str(), 1);
  } else {
    unsetenv("http_proxy");
  }
  ExpectAllPublished(outcomes, direct);
  const auto all = destination.WaitFor(2);
  ASSERT_EQ(all.size(), 2U);
  EXPECT_EQ(RequestOf(all, direct[0].id)->path, "/hooks/" + destination.name());
}

// --- TLS --------------------------------------------------------------------------------------
// Receivers of the test's own serving HTTPS (SharedCertificates(): a server certificate for
// 127.0.0.1 by the test CA); the sink's options differ only in what they trust and show.

// A receiver's TLS: the test CA's server certificate; with `require_client_certificate`, only
// clients with a certificate by the test CA are let in (its control requests show one).
ReceiverTls ServerTls(bool require_client_certificate = false) {
  const TestCertificates& certificates = SharedCertificates();
  ReceiverTls tls{.cert_file = certificates.ServerCert(),
                  .key_file = certificates.ServerKey(),
                  .control = {.ca_file = certificates.CaFile()}};
  if (require_client_certificate) {
    tls.client_ca_file = certificates.CaFile();
    tls.control.cert_file = certificates.ClientCert();
    tls.control.key_file = certificates.ClientKey();
  }
  return tls;
}

// Whether a reason says the failure was TLS's (a certificate, a handshake, an alert).
bool MentionsTls(const std::string& reason) {
  std::string lower = reason;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return Contains(lower, "certificate") || Contains(lower, "ssl") || Contains(lower, "tls");
}

// Waits (at most 5 s) until `receiver` has recorded at least `count` failed TLS handshakes; all of
// them then.
std::vector<std::string> WaitForTlsFailures(WebhookReceiver& receiver, std::size_t count) {
  const auto until = SteadyClock::now() + seconds{5};
  for (;;) {
    auto failures = receiver.TlsFailures();
    if (failures.size() >= count || SteadyClock::now() >= until) return failures;
    std::this_thread::sleep_for(milliseconds{20});
  }
}

std::string Join(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& line : lines) all += line + "\n";
  return all;
}

// Every outcome is `kind`, with a reason that names TLS when `names_tls`.
void ExpectAllFailed(const std::vector<PublishOutcome>& outcomes,
                     const std::vector<Envelope>& batch, FailureKind kind, bool names_tls) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    EXPECT_EQ(KindOf(outcomes[i]), kind) << i << ": " << Describe(outcomes[i]);
    if (names_tls) {
      EXPECT_TRUE(MentionsTls(ReasonOf(outcomes[i]))) << i << ": " << Describe(outcomes[i]);
    }
  }
}

TEST(HttpSinkTlsTest, AnHttpsEndpointSignedByTheConfiguredCaGetsSignedRequests) {
  const std::string secret = NewSecret();
  WebhookReceiver receiver({secret}, "127.0.0.1", 0, {}, ServerTls());
  ASSERT_TRUE(receiver.BaseUrl().starts_with("https://127.0.0.1:")) << receiver.BaseUrl();
  Destination destination("tls-ok", "{}", receiver);
  webhook::SinkOptions options = OptionsFor(receiver, {secret});
  options.tls_ca_file = SharedCertificates().CaFile();
  const std::vector<Envelope> batch{Make(destination.name(), R"({"tls":1})"),
                                    MakeInStream(destination.name(), "tls-stream", 1),
                                    MakeInStream(destination.name(), "tls-stream", 2)};
  ExpectAllPublished(Publish(options, batch), batch);

  // http_version kAuto: the receiver offers no ALPN, so HTTP/1.1 over TLS.
  options.http_version = webhook::HttpVersion::kAuto;
  const std::vector<Envelope> more{Make(destination.name(), R"({"tls":2})")};
  ExpectAllPublished(Publish(options, more), more);

  const auto requests = destination.WaitFor(4);
  ASSERT_EQ(requests.size(), 4U);
  for (const Envelope& envelope : {batch[0], batch[1], batch[2], more[0]}) {
    const auto request = RequestOf(requests, envelope.id);
    ASSERT_TRUE(request.has_value()) << envelope.id.ToString();
    EXPECT_EQ(request->signature_ok, std::optional<bool>{true});
    EXPECT_EQ(request->payload, envelope.payload);
    EXPECT_EQ(request->status, std::optional<int>{200});
  }
  EXPECT_TRUE(receiver.TlsFailures().empty()) << Join(receiver.TlsFailures());
}

TEST(HttpSinkTlsTest, AServerCertificateThatIsNotTrustedIsUnavailableAndNothingArrives) {
  const std::string secret = NewSecret();
  WebhookReceiver receiver({secret}, "127.0.0.1", 0, {}, ServerTls());
  Destination destination("tls-untrusted", "{}", receiver);
  const std::vector<Envelope> batch{Make(destination.name()),
                                    MakeInStream(destination.name(), "untrusted", 1),
                                    MakeInStream(destination.name(), "untrusted", 2)};

  // Trusting only the unrelated CA, then only the system's CAs (tls_ca_file empty).
  webhook::SinkOptions options = OptionsFor(receiver, {secret});
  for (const std::string& ca_file : {SharedCertificates().OtherCaFile(), std::string{}}) {
    SCOPED_TRACE("tls_ca_file = \"" + ca_file + "\"");
    options.tls_ca_file = ca_file;
    const auto start = SteadyClock::now();
    ExpectAllFailed(Publish(options, batch), batch, FailureKind::kUnavailable, true);
    EXPECT_LT(Since(start), milliseconds{3000});
  }
  // The receiver saw the handshakes fail (the sink refused its certificate: an unknown CA) and
  // nothing reached the destination.
  const auto failures = WaitForTlsFailures(receiver, 2);
  EXPECT_GE(failures.size(), 2U) << Join(failures);
  for (const std::string& failure : failures) {
    EXPECT_TRUE(Contains(failure, "UNKNOWN_CA")) << failure;
  }
  EXPECT_TRUE(destination.Requests().empty());
}

TEST(HttpSinkTlsTest, AnEndpointThatRequiresAClientCertificateTakesOnlyOneItTrusts) {
  const std::string secret = NewSecret();
  WebhookReceiver receiver({secret}, "127.0.0.1", 0, {}, ServerTls(true));
  Destination destination("tls-client", "{}", receiver);
  webhook::SinkOptions options = OptionsFor(receiver, {secret});
  options.tls_ca_file = SharedCertificates().CaFile();

  // Without a client certificate, then with one by a CA that the endpoint does not trust: the
  // endpoint refuses the handshake. Not delivered: kUnavailable, as for any refused handshake.
  // (TLS 1.3: the sink's side of the handshake ends before the endpoint has checked the
  // certificate, so the request goes out, unread, and the refusal comes as an alert instead of
  // an answer; or the endpoint has reset the connection before the request is written, and the
  // failed write is all the sink sees: its reason need not name TLS.)
  const std::vector<std::pair<std::string, std::string>> refused{
      {"", ""}, {SharedCertificates().OtherClientCert(), SharedCertificates().OtherClientKey()}};
  for (const auto& [cert, key] : refused) {
    SCOPED_TRACE("tls_cert_file = \"" + cert + "\"");
    options.tls_cert_file = cert;
    options.tls_key_file = key;
    const std::vector<Envelope> batch{Make(destination.name()),
                                      MakeInStream(destination.name(), "client-cert", 1),
                                      MakeInStream(destination.name(), "client-cert", 2)};
    const auto start = SteadyClock::now();
    ExpectAllFailed(Publish(options, batch), batch, FailureKind::kUnavailable, false);
    EXPECT_LT(Since(start), milliseconds{3000});
  }
  // (The receiver's words: PEER_DID_NOT_RETURN_A_CERTIFICATE, CERTIFICATE_VERIFY_FAILED.)
  const auto failures = WaitForTlsFailures(receiver, 2);
  EXPECT_GE(failures.size(), 2U) << Join(failures);
  for (const std::string& failure : failures) {
    EXPECT_TRUE(Contains(failure, "CERTIFICATE")) << failure;
  }
  EXPECT_TRUE(destination.Requests().empty());

  // With the client certificate by the test CA: published.
  options.tls_cert_file = SharedCertificates().ClientCert();
  options.tls_key_file = SharedCertificates().ClientKey();
  const std::vector<Envelope> batch{Make(destination.name(), R"({"mtls":true})"),
                                    MakeInStream(destination.name(), "client-cert", 1)};
  ExpectAllPublished(Publish(options, batch), batch);
  const auto requests = destination.WaitFor(2);
  ASSERT_EQ(requests.size(), 2U);
  for (const ReceivedRequest& request : requests) {
    EXPECT_EQ(request.signature_ok, std::optional<bool>{true});
  }
}

// Plain HTTP to the TLS port: the request goes out in clear text, the receiver's handshake fails
// on it ("http request") and it closes the connection without an answer: sent, no answer.
TEST(HttpSinkTlsTest, HttpToATlsPortIsNotPublishedAndNothingIsAccepted) {
  const std::string secret = NewSecret();
  WebhookReceiver receiver({secret}, "127.0.0.1", 0, {}, ServerTls());
  Destination destination("tls-plain-to-tls", "{}", receiver);
  webhook::SinkOptions options = OptionsFor(receiver, {secret});
  options.url = "http://127.0.0.1:" + std::to_string(receiver.port()) + "/hooks/{topic}";
  options.tls_ca_file = SharedCertificates().CaFile();
  const std::vector<Envelope> batch{Make(destination.name())};
  const auto start = SteadyClock::now();
  const auto outcomes = Publish(options, batch);
  EXPECT_LT(Since(start), milliseconds{3000});
  ASSERT_EQ(outcomes.size(), 1U);
  EXPECT_EQ(KindOf(outcomes[0]), FailureKind::kOutcomeUnknown) << Describe(outcomes[0]);
  EXPECT_TRUE(Contains(ReasonOf(outcomes[0]), "sent, no answer")) << Describe(outcomes[0]);
  const auto failures = WaitForTlsFailures(receiver, 1);
  ASSERT_EQ(failures.size(), 1U) << Join(failures);
  EXPECT_TRUE(Contains(failures[0], "HTTP_REQUEST")) << failures[0];
  EXPECT_TRUE(destination.Requests().empty());
}

// https:// to a plain HTTP receiver: it answers the sink's ClientHello with an HTTP 400, which is
// no TLS: the handshake fails before anything is sent.
TEST(HttpSinkTlsTest, HttpsToAPlainHttpPortIsUnavailableAndNothingIsAccepted) {
  Destination destination("tls-to-plain");
  webhook::SinkOptions options = SharedOptions();
  options.url = "https://127.0.0.1:" + std::to_string(SharedReceiver().port()) + "/hooks/{topic}";
  options.tls_ca_file = SharedCertificates().CaFile();
  const std::vector<Envelope> batch{Make(destination.name()), Make(destination.name())};
  const auto start = SteadyClock::now();
  ExpectAllFailed(Publish(options, batch), batch, FailureKind::kUnavailable, true);
  EXPECT_LT(Since(start), milliseconds{3000});
  EXPECT_TRUE(destination.Requests().empty());
}

}  // namespace
}  // namespace outbox::testing
