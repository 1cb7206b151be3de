// The HTTP webhook sink (sink/http.h): one libcurl multi handle, driven on the calling thread
// inside Publish. A batch becomes per-host queues of requests that may go now (messages without a
// stream, and the first message of each stream); a stream's next message joins its host's queue
// when the one before it was answered 2xx. Nothing is sent to a host that asked to wait
// (Retry-After), that could not be reached a moment ago, or that refused the relay itself (401,
// 403, 407). A request that times out is its own message's problem, not its host's (issue #40).

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "classify.h"
#include "headers.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/core/log_text.h"
#include "outbox/core/version.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/http.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/sink_base.h"
#include "signature.h"
#include "sink/curl_handles.h"
#include "url.h"

namespace outbox::webhook {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A host that could not be reached gets nothing for this long, doubling up to the maximum.
constexpr milliseconds kMinHostBackoff = kMinReconnectBackoff;
constexpr milliseconds kMaxHostBackoff = kMaxReconnectBackoff;
// A 429 without Retry-After: the host gets nothing for this long.
constexpr milliseconds kTooManyRequestsPause{1000};
// Request timeouts of this many different messages in a row, with no answer from their host in
// between, make the host count as down.
constexpr std::size_t kTimeoutsForDown = 3;
// A refusal of the relay (401, 403, 407) is remembered this long: within it, a host that accepted
// a request sent after its last refusal blames the next refusal on the message.
constexpr std::chrono::seconds kRefusalMemory{60};
// How much of a refused header name a failure's reason quotes.
constexpr std::size_t kQuotedNameBytes = 64;
// How much of an answer's body is kept, to quote in a failure's reason.
constexpr std::size_t kKeptBodyBytes = 256;
// The least time a request is started with before the Publish deadline.
constexpr milliseconds kMinRequestBudget{20};
// The longest single wait for network activity (the loop also wakes at the deadline).
constexpr milliseconds kLongestPoll{1000};

milliseconds Until(SteadyClock::time_point when, SteadyClock::time_point now) {
  return std::max(milliseconds{0}, std::chrono::ceil<milliseconds>(when - now));
}

// "5 s", "1500 ms": a timeout as a reason quotes it.
std::string TimeoutText(milliseconds timeout) {
  if (timeout.count() % 1000 == 0) return std::to_string(timeout.count() / 1000) + " s";
  return std::to_string(timeout.count()) + " ms";
}

// "name: value" as curl_slist takes it; "name;" sends an empty value ("name:" would remove it).
std::string HeaderLine(std::string_view name, std::string_view value) {
  std::string line{name};
  if (value.empty()) {
    line += ';';
    return line;
  }
  line += ": ";
  line += value;
  return line;
}

class HttpSink final : public SinkBase {
 public:
  explicit HttpSink(SinkOptions options)
      : options_(std::move(options)),
        url_(NameTemplate::Parse(options_.url, "url")),
        cloudevents_(options_.cloudevents),
        signer_(options_.secrets),
        user_agent_(std::string{"outbox/"} + kVersion) {
    if (HostIsLiteral(options_.url)) {
      const UrlCheck check = CheckUrl(SampleUrl(options_.url));
      if (check.host) fixed_host_ = check.host->key;
    }
    for (const auto& [name, value] : options_.headers) {
      static_headers_.push_back(HeaderLine(name, value));
    }
  }

  ~HttpSink() override { Close(); }
  HttpSink(const HttpSink&) = delete;
  HttpSink& operator=(const HttpSink&) = delete;

  [[nodiscard]] std::string_view Name() const override { return kSinkName; }

  // No connection of its own: libcurl connects per request, and a host that cannot be reached
  // is paused on its own (HostDown), not the whole sink.
  bool Connected(Deadline /*deadline*/) override { return true; }
  std::optional<std::string> Connect(Deadline /*deadline*/) override { return std::nullopt; }
  void Send(Batch& verdicts, Deadline deadline) override;
  void Await(Batch& verdicts, Deadline deadline) override;
  void Finish(Batch& verdicts, Deadline deadline) override;

  void Close() override {
    for (auto& request : running_) {
      if (request && multi_) curl_multi_remove_handle(multi_.get(), request->easy.get());
    }
    running_.clear();
    idle_.clear();
    multi_.reset();  // closes every cached connection
  }

 private:
  // What the sink remembers of a host between calls.
  struct HostState {
    SteadyClock::time_point wait_until;  // Retry-After
    std::string wait_reason;
    SteadyClock::time_point down_until;  // could not be reached, or refused the relay
    SteadyClock::time_point down_since;  // when it was last found so
    Backoff backoff{kMinHostBackoff, kMaxHostBackoff};
    std::string down_reason;  // "cannot reach the endpoint: ...", "the endpoint refuses ..."
    // The messages whose requests timed out since the host last answered anything.
    std::vector<Uuid> timed_out;
    // The last refusal of the relay (401, 403, 407), and whether a request sent after it was
    // accepted (2xx): then the next refusal is the message's.
    std::optional<SteadyClock::time_point> refused_at;
    bool accepted_since_refusal = false;
    // Within one Publish: requests in flight, and the batch indexes that may go now.
    std::size_t in_flight = 0;
    std::deque<std::size_t> ready;
  };

  // A message as a CloudEvent: its attributes (binary mode) or its JSON document (structured).
  struct CloudEvent {
    std::vector<cloudevents::Attribute> attributes;
    std::optional<std::string> body;
  };

  // One request in flight.
  struct Request {
    std::size_t index = 0;
    HostState* host = nullptr;
    curl::EasyPtr easy;
    curl::SlistPtr headers;
    std::string url;
    CloudEvent event;        // with envelope = "cloudevents"
    std::string body_start;  // the start of the answer's body
    bool sent = false;       // a connection was made or reused for it: it may have arrived
    SteadyClock::time_point started;
    milliseconds timeout{0};    // CURLOPT_TIMEOUT_MS as set
    bool deadline_cut = false;  // the Publish deadline, not request_timeout, set `timeout`
    std::array<char, CURL_ERROR_SIZE> error{};
  };

  // A stream's state within one Publish.
  struct StreamState {
    bool busy = false;  // its current message is ready or in flight
    std::deque<std::size_t> rest;
    std::optional<Failure> broken;  // what its later messages are told
  };

  // The state of one Publish call besides its verdicts.
  struct Plan {
    explicit Plan(Batch& batch)
        : verdicts(batch), urls(batch.size()), events(batch.size()), hosts(batch.size(), nullptr) {}
    Batch& verdicts;
    std::vector<std::string> urls;
    std::vector<CloudEvent> events;  // with envelope = "cloudevents"
    std::vector<HostState*> hosts;
    std::unordered_map<std::string_view, StreamState> streams;
    std::vector<HostState*> active;  // hosts with work in this batch
  };

  static std::size_t OnBody(char* data, std::size_t size, std::size_t count, void* user) {
    auto* request = static_cast<Request*>(user);
    const std::size_t bytes = size * count;
    if (request->body_start.size() < kKeptBodyBytes) {
      request->body_start.append(data,
                                 std::min(bytes, kKeptBodyBytes - request->body_start.size()));
    }
    return bytes;
  }

  static int OnPrerequest(void* user, char* /*remote_ip*/, char* /*local_ip*/, int /*remote*/,
                          int /*local*/) {
    static_cast<Request*>(user)->sent = true;
    return CURL_PREREQFUNC_OK;
  }

  void Log(LogLevel level, const std::string& message) const {
    if (options_.log) options_.log(level, message);
  }

  CURLM* Multi() {
    if (!multi_) {
      curl::InitCurlOnce();
      multi_.reset(curl_multi_init());
      if (!multi_) throw std::runtime_error("libcurl: curl_multi_init failed");
      const long per_host = static_cast<long>(options_.max_in_flight);
      curl_multi_setopt(multi_.get(), CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
      curl_multi_setopt(multi_.get(), CURLMOPT_MAX_HOST_CONNECTIONS, per_host);
      curl_multi_setopt(multi_.get(), CURLMOPT_MAXCONNECTS, std::max(16L, per_host * 2));
    }
    return multi_.get();
  }

  // Why `envelope` cannot be sent as it is, or "".
  std::string Problem(const Envelope& envelope) const {
    if (envelope.payload.size() > options_.max_message_bytes) {
      return "payload of " + std::to_string(envelope.payload.size()) +
             " bytes is over max_message_bytes (" + std::to_string(options_.max_message_bytes) +
             ")";
    }
    const auto check_value = [](std::string_view what, std::string_view value) {
      return IsHeaderValue(value)
                 ? std::string{}
                 : std::string{what} + " contains CR, LF or NUL, which an HTTP header cannot carry";
    };
    const auto optional_text = [](const std::optional<std::string>& text) {
      return text ? std::string_view{*text} : std::string_view{};
    };
    const std::array<std::pair<std::string_view, std::string_view>, 5> fields{{
        {"topic", envelope.topic},
        {"database", envelope.database},
        {"content_type", envelope.content_type},
        {"stream_key", optional_text(envelope.stream_key)},
        {"type", optional_text(envelope.type)},
    }};
    for (const auto& [what, value] : fields) {
      if (auto problem = check_value(what, value); !problem.empty()) return problem;
    }
    // As CloudEvents extensions the headers' values are percent-encoded; their names are legal.
    if (cloudevents()) return {};
    for (const auto& [name, value] : envelope.headers) {
      if (LeftOut(envelope, name)) continue;
      if (!IsHeaderName(name)) {
        return "header name '" + SanitizeForLog(name, kQuotedNameBytes) + "' is not an HTTP token";
      }
      if (auto problem = check_value("header '" + name + "'", value); !problem.empty()) {
        return problem;
      }
    }
    return {};
  }

  // Whether the envelope's own header `name` is left out: one the sink sets itself or that HTTP
  // reserves (headers.h), and, with envelope = "external", `type` (any case) when the sink sends
  // the envelope's type under that name.
  [[nodiscard]] bool LeftOut(const Envelope& envelope, std::string_view name) const {
    if (ReservedHeaderName(name)) return true;
    return options_.envelope == EnvelopeStyle::kExternal && envelope.type &&
           EqualsNoCase(name, kExternalTypeHeader);
  }

  [[nodiscard]] bool cloudevents() const {
    return options_.envelope == EnvelopeStyle::kCloudEvents;
  }

  // The HTTP binding of CloudEvents (binary mode: ce-* headers, datacontenttype as content-type;
  // structured: content-type application/cloudevents+json), with Standard Webhooks' headers
  // (signed over the body sent) and the configured ones. The envelope's headers go only as the
  // extensions the mapping makes of them.
  curl::SlistPtr CloudEventHeaders(const Envelope& envelope, const CloudEvent& event) const {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    const std::string id = envelope.id.ToString();
    curl::SlistPtr list;
    const auto add = [&list](const std::string& line) {
      curl_slist* head = curl_slist_append(list.get(), line.c_str());
      if (head == nullptr) throw std::bad_alloc();  // `list` is left whole, freed by its owner
      if (!list) list.reset(head);
    };
    const std::string_view body = event.body ? *event.body : std::string_view{envelope.payload};
    if (event.body) add(HeaderLine("content-type", cloudevents::kStructuredContentType));
    add(HeaderLine(kIdHeader, id));
    add(HeaderLine(kTimestampHeader, std::to_string(seconds)));
    if (!signer_.empty()) add(HeaderLine(kSignatureHeader, signer_.Sign(id, seconds, body)));
    for (const cloudevents::Attribute& attribute : event.attributes) {
      if (attribute.name == cloudevents::kDataContentType) {
        add(HeaderLine("content-type", attribute.value));
      } else {
        add(HeaderLine("ce-" + attribute.name,
                       cloudevents::PercentEncodeHeaderValue(attribute.value)));
      }
    }
    add("Expect:");  // no 100-continue round trip before large bodies
    for (const std::string& line : static_headers_) add(line);
    return list;
  }

  curl::SlistPtr Headers(const Envelope& envelope) const {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    const std::string id = envelope.id.ToString();
    curl::SlistPtr list;
    const auto add = [&list](const std::string& line) {
      curl_slist* head = curl_slist_append(list.get(), line.c_str());
      if (head == nullptr) throw std::bad_alloc();  // `list` is left whole, freed by its owner
      if (!list) list.reset(head);
    };
    add(HeaderLine("content-type", envelope.content_type));
    add(HeaderLine(kIdHeader, id));
    add(HeaderLine(kTimestampHeader, std::to_string(seconds)));
    if (!signer_.empty()) {
      add(HeaderLine(kSignatureHeader, signer_.Sign(id, seconds, envelope.payload)));
    }
    add(HeaderLine(wire::kEventId, envelope.EventId().ToString()));
    if (options_.envelope == EnvelopeStyle::kExternal) {
      if (envelope.type) add(HeaderLine(kExternalTypeHeader, *envelope.type));
    } else {
      add(HeaderLine(wire::kTopicHeader, envelope.topic));
      if (envelope.type) add(HeaderLine(kTypeHeader, *envelope.type));
      if (envelope.stream_key) add(HeaderLine(wire::kStreamKeyHeader, *envelope.stream_key));
      if (envelope.stream_seq) {
        add(HeaderLine(wire::kStreamSeqHeader, std::to_string(*envelope.stream_seq)));
      }
      if (envelope.stream_prev_seq) {
        add(HeaderLine(wire::kStreamPrevSeqHeader, std::to_string(*envelope.stream_prev_seq)));
      }
      add(HeaderLine(wire::kPartitionHeader, std::to_string(envelope.partition)));
      add(HeaderLine(wire::kAttemptsHeader, std::to_string(envelope.attempts)));
      add(HeaderLine(wire::kTargetHeader, envelope.target));
      if (!envelope.database.empty()) add(HeaderLine(wire::kDatabaseHeader, envelope.database));
    }
    add("Expect:");  // no 100-continue round trip before large bodies
    for (const std::string& line : static_headers_) add(line);
    for (const auto& [name, value] : envelope.headers) {
      if (!LeftOut(envelope, name)) add(HeaderLine(name, value));
    }
    return list;
  }

  HostState& Host(const std::string& key) { return hosts_[key]; }

  // Records the outcome of message `index` and, for a stream, lets its next message go (after a
  // success) or tells its later messages why they are not sent (after a failure).
  void Decide(Plan& batch, std::size_t index, std::optional<Failure> failure) {
    const Envelope& envelope = batch.verdicts[index];
    const bool published = !failure.has_value();
    batch.verdicts.Settle(index, std::move(failure));
    if (!envelope.stream_key) return;
    StreamState& stream = batch.streams[*envelope.stream_key];
    stream.busy = false;
    // A permanent failure is abandoned by the relay, never accepted later: the rest of the stream
    // goes on. Any other failure is tried again, so nothing after it may be accepted first.
    if (!published && batch.verdicts.verdict(index)->kind != FailureKind::kPermanent) {
      const Failure& cause = *batch.verdicts.verdict(index);
      stream.broken =
          cause.kind == FailureKind::kUnavailable
              ? Failure{FailureKind::kUnavailable,
                        "not sent: an earlier message of its stream could not be sent (" +
                            cause.reason + ")",
                        cause.retry_after}
              : Failure{FailureKind::kOutcomeUnknown,
                        "not sent: an earlier message of its stream failed; it goes "
                        "after it"};
    }
    Advance(batch, stream);
  }

  // The stream's next message becomes ready, unless the stream is broken (then all of the rest
  // are told so).
  void Advance(Plan& batch, StreamState& stream) {
    while (!stream.rest.empty() && !stream.busy) {
      const std::size_t next = stream.rest.front();
      stream.rest.pop_front();
      if (stream.broken) {
        // (One refused before sending keeps its own, permanent, failure.)
        batch.verdicts.Settle(next, stream.broken);
        continue;
      }
      if (batch.verdicts.settled(next)) {  // refused before sending: the rest waits for it
        Decide(batch, next, batch.verdicts.verdict(next));
        return;
      }
      stream.busy = true;
      batch.hosts[next]->ready.push_back(next);
    }
  }

  // Starts what may go now on every host; tells the messages of hosts that wait why.
  void StartReady(Plan& batch, Deadline deadline) {
    const auto now = SteadyClock::now();
    bool again = true;
    while (again) {  // a failure here can make a stream's next message ready on another host
      again = false;
      for (HostState* host : batch.active) {
        if (host->ready.empty()) continue;
        std::optional<Failure> refuse;
        if (now < host->wait_until) {
          const milliseconds left = Until(host->wait_until, now);
          refuse = Failure{FailureKind::kUnavailable,
                           "the endpoint asked to wait " + std::to_string(left.count()) +
                               " ms more (" + host->wait_reason + ")",
                           left};
        } else if (now < host->down_until) {
          refuse = Failure{FailureKind::kUnavailable,
                           host->down_reason + "; trying again in " +
                               std::to_string(Until(host->down_until, now).count()) + " ms"};
        }
        if (refuse) {
          while (!host->ready.empty()) {
            const std::size_t index = host->ready.front();
            host->ready.pop_front();
            Decide(batch, index, refuse);
          }
          again = true;
          continue;
        }
        // Nothing starts with less than kMinRequestBudget left (it would go with a timeout of a
        // millisecond or two and end "sent, no answer"): what is still ready is told by GiveUp
        // that the deadline came before its turn.
        while (!host->ready.empty() && host->in_flight < options_.max_in_flight &&
               now + kMinRequestBudget <= deadline) {
          const std::size_t index = host->ready.front();
          host->ready.pop_front();
          Start(batch, index, *host, deadline);
        }
      }
    }
  }

  void Start(Plan& batch, std::size_t index, HostState& host, Deadline deadline) {
    const Envelope& envelope = batch.verdicts[index];
    auto request = std::make_unique<Request>();
    request->index = index;
    request->host = &host;
    request->url = std::move(batch.urls[index]);
    if (!idle_.empty()) {
      request->easy = std::move(idle_.back());
      idle_.pop_back();
      curl_easy_reset(request->easy.get());
    } else {
      request->easy.reset(curl_easy_init());
      if (!request->easy) throw std::runtime_error("libcurl: curl_easy_init failed");
    }
    request->event = std::move(batch.events[index]);
    request->headers =
        cloudevents() ? CloudEventHeaders(envelope, request->event) : Headers(envelope);
    const std::string& body = request->event.body ? *request->event.body : envelope.payload;
    CURL* easy = request->easy.get();
    const milliseconds left = Until(deadline, SteadyClock::now());
    const long total = static_cast<long>(
        std::max<std::int64_t>(1, std::min(options_.request_timeout, left).count()));
    request->started = SteadyClock::now();
    request->timeout = milliseconds{total};
    request->deadline_cut = left < options_.request_timeout;
    const long connect = static_cast<long>(
        std::max<std::int64_t>(1, std::min(options_.connect_timeout, left).count()));
    curl_easy_setopt(easy, CURLOPT_URL, request->url.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
    if (options_.method != "POST") {
      curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, options_.method.c_str());
    }
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, request->headers.get());
    curl_easy_setopt(easy, CURLOPT_USERAGENT, user_agent_.c_str());
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &HttpSink::OnBody);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, request.get());
    curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, &HttpSink::OnPrerequest);
    curl_easy_setopt(easy, CURLOPT_PREREQDATA, request.get());
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, request->error.data());
    curl_easy_setopt(easy, CURLOPT_PRIVATE, request.get());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    // The URL as expanded: libcurl would otherwise remove "." and ".." segments, and a topic of
    // ".." (not percent-encoded: '.' is unreserved) would send the request to the parent path.
    curl_easy_setopt(easy, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, total);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, connect);
    curl_easy_setopt(easy, CURLOPT_PROXY, options_.proxy.c_str());
    // PIPEWAIT (wait for a connection being made to say whether it multiplexes, rather than open
    // another) only where the answer comes with the connection: TLS's ALPN, or HTTP/2 by prior
    // knowledge. On plain HTTP with "auto" (HTTP/1.1 there), a connection says so only with its
    // first answer: every other request to the host waited in libcurl behind one that was never
    // answered, and then failed at once with its request timeout spent ("Failed to resolve host
    // ... with timeout after 0 ms").
    const bool https = request->url.starts_with("https:");
    switch (options_.http_version) {
      case HttpVersion::kAuto:
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION,
                         static_cast<long>(https ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_1_1));
        curl_easy_setopt(easy, CURLOPT_PIPEWAIT, https ? 1L : 0L);
        break;
      case HttpVersion::kHttp1:
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
        curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 0L);
        break;
      case HttpVersion::kHttp2:
        curl_easy_setopt(easy, CURLOPT_HTTP_VERSION,
                         static_cast<long>(https ? CURL_HTTP_VERSION_2TLS
                                                 : CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE));
        curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
        break;
    }
    if (!options_.tls_ca_file.empty()) {
      curl_easy_setopt(easy, CURLOPT_CAINFO, options_.tls_ca_file.c_str());
    }
    if (!options_.tls_cert_file.empty()) {
      curl_easy_setopt(easy, CURLOPT_SSLCERT, options_.tls_cert_file.c_str());
      curl_easy_setopt(easy, CURLOPT_SSLKEY, options_.tls_key_file.c_str());
    }
    const CURLMcode added = curl_multi_add_handle(Multi(), easy);
    if (added != CURLM_OK) {
      Decide(
          batch, index,
          Failure{FailureKind::kUnavailable, std::string{"libcurl could not start the request: "} +
                                                 curl_multi_strerror(added)});
      idle_.push_back(std::move(request->easy));
      return;
    }
    ++host.in_flight;
    running_.push_back(std::move(request));
  }

  // The host is told nothing for a while, doubling: it cannot be reached, or refuses the relay.
  // `why` starts "cannot reach the endpoint: " or "the endpoint refuses the relay (".
  void HostDown(HostState& host, const Request& request, const std::string& why,
                SteadyClock::time_point now) {
    // A request that was already in flight when the host was last found down tells nothing new:
    // one event that ends many requests at once (a frozen route, every connection timing out at
    // the deadline) pauses the host once, with the shortest pause, not once per request.
    if (request.started < host.down_since) return;
    host.down_since = now;
    const milliseconds pause = host.backoff.Failed();
    if (now >= host.down_until) {
      // (Unreachable: the words the log has always had, which operators and tests look for.)
      const bool unreachable = why.starts_with("cannot reach");
      Log(LogLevel::kWarn, "webhook endpoint " + MaskUrl(request.url) +
                               (unreachable ? " cannot be reached: " : ": ") + why +
                               "; nothing is sent to its host for " +
                               std::to_string(pause.count()) + " ms");
    }
    host.down_until = now + pause;
    host.down_reason = why;
  }

  // A request ended: its outcome, and what it says about its host.
  void Conclude(Plan& batch, Request& request, CURLcode code) {
    HostState& host = *request.host;
    --host.in_flight;
    CURL* easy = request.easy.get();
    const auto now = SteadyClock::now();
    if (code != CURLE_OK) {
      // A connection was made for it, but whatever ended it came before any of the request was
      // written (the endpoint had closed the connection, e.g. after refusing the TLS handshake;
      // a timeout while connecting through a proxy): it never went out.
      bool sent = request.sent;
      if (sent) {
        long written = 0;  // NOLINT(google-runtime-int): libcurl's type
        curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &written);
        sent = written > 0;
      }
      // Its whole timeout ran out (not the connect timeout, which ends sooner): this request's
      // problem, whatever libcurl's text says, unless it keeps happening with nothing answered.
      if (code == CURLE_OPERATION_TIMEDOUT &&
          now - request.started + milliseconds{5} >= request.timeout) {
        const std::string limit =
            request.deadline_cut
                ? "the publish deadline (relay.publish_timeout)"
                : "request_timeout (" + TimeoutText(options_.request_timeout) + ")";
        Failure failure = ClassifyTimeout(sent, limit);
        const Uuid& id = batch.verdicts[request.index].id;
        if (host.timed_out.size() < kTimeoutsForDown &&
            std::find(host.timed_out.begin(), host.timed_out.end(), id) == host.timed_out.end()) {
          host.timed_out.push_back(id);
        }
        if (host.timed_out.size() >= kTimeoutsForDown) {
          HostDown(host, request,
                   "cannot reach the endpoint: requests of " + std::to_string(kTimeoutsForDown) +
                       " different messages in a row got no answer within " + limit +
                       ", and it answered nothing in between",
                   now);
        }
        Decide(batch, request.index, std::move(failure));
        return;
      }
      Failure failure = ClassifyError(code, sent, request.error.data());
      if (failure.kind == FailureKind::kUnavailable) HostDown(host, request, failure.reason, now);
      Decide(batch, request.index, std::move(failure));
      return;
    }
    host.timed_out.clear();
    long status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
    const char* location = nullptr;
    if (status >= 300 && status < 400) curl_easy_getinfo(easy, CURLINFO_REDIRECT_URL, &location);
    const StatusLists lists{options_.retry_statuses, options_.abandon_statuses};
    std::optional<Failure> failure =
        ClassifyStatus(status, lists, request.body_start,
                       location == nullptr ? std::string_view{} : std::string_view{location});
    if (RefusesRelay(status, lists)) {
      Refused(batch, request, status, *failure, now);
      return;
    }
    host.backoff.Succeeded();
    host.down_until = {};
    if (!failure && host.refused_at && request.started > *host.refused_at) {
      host.accepted_since_refusal = true;
    }
    if (failure && HonoursRetryAfter(status)) {
      curl_off_t retry_after = 0;
      curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &retry_after);
      milliseconds wait{0};
      if (retry_after > 0) {
        wait = std::min<milliseconds>(std::chrono::seconds{retry_after}, options_.max_retry_after);
      } else if (status == 429) {
        wait = kTooManyRequestsPause;
      }
      if (wait.count() > 0) {
        const auto until = now + wait;
        if (until > host.wait_until) {
          host.wait_until = until;
          host.wait_reason = "HTTP " + std::to_string(status) + " with Retry-After: " +
                             (retry_after > 0 ? std::to_string(retry_after) + " s" : "none");
        }
        failure->retry_after = wait;
      }
    }
    Decide(batch, request.index, std::move(failure));
  }

  // The endpoint refused the relay itself (401, 403, 407; `failure` is kUnavailable). The host's
  // problem: it is paused as if unreachable and the message waits, no attempt spent. Unless the
  // host accepted a request sent after its last refusal (within kRefusalMemory): its credentials
  // work, so this refusal is about this message (e.g. a 403 on one path while the others are
  // accepted): kRejected, an attempt spent. Either way the refusal is remembered, so that a host
  // that refuses everything from now on (rotated credentials) is blamed from its next refusal.
  void Refused(Plan& batch, const Request& request, long status, Failure failure,
               SteadyClock::time_point now) {
    HostState& host = *request.host;
    if (host.refused_at && now - *host.refused_at > kRefusalMemory) {
      host.accepted_since_refusal = false;
    }
    const bool message_only = host.refused_at && host.accepted_since_refusal;
    host.refused_at = now;
    host.accepted_since_refusal = false;
    if (message_only) {
      failure.kind = FailureKind::kRejected;
      failure.reason +=
          "; counted against this message: its host accepted other requests since "
          "its last refusal";
    } else {
      failure.reason = "the endpoint refuses the relay (" + std::string{RefusalOf(status)} +
                       "): " + failure.reason + "; no attempt spent";
      HostDown(host, request, failure.reason, now);
    }
    Decide(batch, request.index, std::move(failure));
  }

  // Collects every request libcurl has finished. True when any had.
  bool CollectFinished(Plan& batch) {
    bool any = false;
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(multi_.get(), &queued)) {
      if (message->msg != CURLMSG_DONE) continue;
      CURL* easy = message->easy_handle;
      const CURLcode code = message->data.result;
      Request* request = nullptr;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, &request);
      curl_multi_remove_handle(multi_.get(), easy);
      Conclude(batch, *request, code);
      idle_.push_back(std::move(request->easy));
      std::erase_if(running_, [request](const auto& held) { return held.get() == request; });
      any = true;
    }
    return any;
  }

  // The deadline passed: what is in flight is given up on, what waits is told so.
  void GiveUp(Plan& batch) {
    for (auto& request : running_) {
      curl_multi_remove_handle(multi_.get(), request->easy.get());
      --request->host->in_flight;
      Decide(batch, request->index,
             request->sent
                 ? Failure{FailureKind::kOutcomeUnknown, "sent, no answer by the deadline"}
                 : Failure{FailureKind::kUnavailable, "the deadline passed while connecting"});
      // A transfer cut short leaves its connection unusable; the handle is not reused either.
    }
    running_.clear();
    for (HostState* host : batch.active) {
      while (!host->ready.empty()) {
        const std::size_t index = host->ready.front();
        host->ready.pop_front();
        Decide(batch, index,
               Failure{FailureKind::kUnavailable, "not sent: the deadline passed before its turn"});
      }
    }
  }

  // Why `envelope` cannot be sent as a CloudEvent, or "".
  std::string MakeCloudEvent(const Envelope& envelope, CloudEvent& event) const {
    if (cloudevents_.mode() == cloudevents::Mode::kBinary) {
      auto error = cloudevents_.Attributes(envelope, event.attributes);
      return error ? *error : std::string{};
    }
    std::string body;
    if (auto error = cloudevents_.StructuredJson(envelope, body)) return *error;
    if (body.size() > options_.max_message_bytes) {
      return "the structured CloudEvent of " + std::to_string(body.size()) +
             " bytes is over max_message_bytes (" + std::to_string(options_.max_message_bytes) +
             ")";
    }
    event.body = std::move(body);
    return {};
  }

  SinkOptions options_;
  NameTemplate url_;
  cloudevents::Mapper cloudevents_;
  Signer signer_;
  std::string user_agent_;
  std::optional<std::string> fixed_host_;  // when every message goes to the same host
  std::vector<std::string> static_headers_;
  curl::MultiPtr multi_;
  std::vector<curl::EasyPtr> idle_;
  std::vector<std::unique_ptr<Request>> running_;
  std::map<std::string, HostState, std::less<>> hosts_;
  std::optional<Plan> plan_;  // of the Publish call in progress
};

// Plans the batch: what cannot be sent is permanent at once; each host gets a queue of what may go
// now (messages without a stream, and the first of each stream).
void HttpSink::Send(Batch& verdicts, Deadline deadline) {
  Plan& batch = plan_.emplace(verdicts);
  HostState* fixed = fixed_host_ ? &Host(*fixed_host_) : nullptr;
  for (std::size_t i = 0; i < verdicts.size(); ++i) {
    const Envelope& envelope = verdicts[i];
    std::string problem = Problem(envelope);
    if (problem.empty() && cloudevents()) problem = MakeCloudEvent(envelope, batch.events[i]);
    if (!problem.empty()) {
      verdicts.Fail(i, FailureKind::kPermanent, problem);
    } else {
      batch.urls[i] = url_.Expand(envelope, &EncodePlaceholder);
      if (fixed != nullptr) {
        batch.hosts[i] = fixed;
      } else {
        const UrlCheck check = CheckUrl(batch.urls[i]);
        if (check.host) {
          batch.hosts[i] = &Host(check.host->key);
        } else {
          verdicts.Fail(i, FailureKind::kPermanent,
                        "url " + MaskUrl(batch.urls[i]) + " " + check.problem);
        }
      }
      if (batch.hosts[i] != nullptr && std::find(batch.active.begin(), batch.active.end(),
                                                 batch.hosts[i]) == batch.active.end()) {
        batch.active.push_back(batch.hosts[i]);
      }
    }
    if (!envelope.stream_key) {
      if (!verdicts.settled(i)) batch.hosts[i]->ready.push_back(i);
      continue;
    }
    StreamState& stream = batch.streams[*envelope.stream_key];
    stream.rest.push_back(i);
    if (!stream.busy) Advance(batch, stream);
  }
  StartReady(batch, deadline);
}

// Drives the requests until each is answered or the deadline passes.
void HttpSink::Await(Batch& /*verdicts*/, Deadline deadline) {
  Plan& batch = *plan_;
  while (!running_.empty()) {
    int still_running = 0;
    const CURLMcode performed = curl_multi_perform(multi_.get(), &still_running);
    if (performed != CURLM_OK) {
      Log(LogLevel::kError, std::string{"libcurl: "} + curl_multi_strerror(performed));
      break;
    }
    if (CollectFinished(batch)) {
      StartReady(batch, deadline);
      continue;
    }
    const auto now = SteadyClock::now();
    if (now >= deadline) break;
    const int wait_ms = static_cast<int>(std::min(Until(deadline, now), kLongestPoll).count());
    curl_multi_poll(multi_.get(), nullptr, 0, std::max(wait_ms, 1), nullptr);
  }
}

void HttpSink::Finish(Batch& /*verdicts*/, Deadline /*deadline*/) {
  if (!plan_) return;
  GiveUp(*plan_);
  for (HostState* host : plan_->active) host->in_flight = 0;
  plan_.reset();
}

}  // namespace

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  ValidateOptions(options);
  curl::InitCurlOnce();
  return std::make_unique<HttpSink>(std::move(options));
}

}  // namespace outbox::webhook
