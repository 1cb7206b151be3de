// The NATS JetStream sink: asynchronous JetStream publishes on one connection, up to
// `max_pending` awaiting their ack, outcomes in batch order.
//
// How a batch goes out. Each message is published with js_PublishMsgAsync (Nats-Msg-Id = its id)
// and gets a token, a number that grows across batches, kept in `pending_` with its batch index.
// libnats hands each ack to OnAck on a thread of its own; OnAck turns the message back into its
// token (Mailbox::tokens) and posts the ack; Publish applies posted acks on its own thread,
// between publishes and while it waits for room in the window or for the last acks. At the
// deadline what still awaits its ack is outcome-unknown; its token stays in `pending_` without a
// batch index so that its late ack is recognized and ignored. libnats times an ack out after
// kAckTimeout (its own timer posts a NATS_TIMEOUT ack), which clears what no ack will ever come
// for on a connection that stays up.
//
// Connections. libnats' reconnection is off: a lost connection is closed, its closed callback
// tells the mailbox, and what awaited an ack is outcome-unknown at once (not at the deadline).
// The next Publish makes a new connection, with a backoff after failed attempts (100 ms doubling
// to 5 s; meanwhile Publish answers kUnavailable at once). A Publish on an existing connection
// first sends a PING and waits (at most kProbeWait) for the PONG: a connection the server has
// cut but whose reader has not noticed yet is found dead before anything is sent.
//
// Answers that are not acks. A publish the server refuses for permissions gets no reply, only an
// asynchronous -ERR naming the subject: OnAsyncError posts the subject, and Publish rejects what
// awaits an ack on it. "No responders" followed by the loss of the connection in the same batch
// is a server shutting down (JetStream stops first), not a missing stream: unavailable.
//
// Threading: libnats' threads touch only a Mailbox (under its mutex); everything else is the
// Publish thread's. No lock is held while libnats is called.
//
// Why callbacks find their mailbox by number. libnats says an ack handler may still run after
// the JetStream context is destroyed (nats.h, jsCtx), and gives no way to learn when its reply
// thread is done; the closed and error callbacks run on its callback thread, also after a
// connection is gone. So the closure libnats holds is the number of a Mailbox in a process-wide
// table, never a pointer to the sink: a call that comes after the sink dropped the connection
// finds nothing and only frees the message it was handed.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "classify.h"
#include "handles.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/nats.h"
#include "outbox/sink/readable_file.h"
#include "outbox/sink/sink_base.h"

namespace outbox::nats {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// How long the liveness PING at the start of a Publish may wait for its PONG.
constexpr milliseconds kProbeWait{100};
// PINGs without a PONG at which libnats gives a connection up (ping_interval in sink/nats.h).
constexpr int kMaxPingsOut = 2;
// libnats' own ack timeout for every publish (jsPubOptions.MaxWait): long after any Publish
// deadline; it only clears acks that will never come. One value for all keeps libnats' timer
// list in order (it inserts by scanning otherwise).
constexpr milliseconds kAckTimeout{std::chrono::minutes{5}};
// How often a wait for acks looks at the connection itself, in case its closed callback is late.
constexpr milliseconds kWaitSlice{100};
// Posted acks are applied at least every this many publishes.
constexpr std::size_t kApplyEvery = 64;
// The duplicate-window check: its request waits at most this long; a stream whose check timed
// out this many times is given up on.
constexpr milliseconds kStreamInfoWait{2000};
constexpr int kStreamInfoTries = 3;
constexpr milliseconds kMinTimeForCheck{20};
// Limits of the configuration.
constexpr std::size_t kMaxPending = 100000;
constexpr std::size_t kMaxMessageBytes =
    std::size_t{64} * 1024 * 1024;  // NATS' hard limit on max_payload

std::string Seconds(std::chrono::nanoseconds duration) {
  const auto ms = std::chrono::duration_cast<milliseconds>(duration).count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

// Why `name` cannot be a NATS header name (a line "name: value"), or empty.
std::string HeaderNameProblem(std::string_view name) {
  if (name.empty()) return "is empty";
  for (const char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte == 0x7F || c == ':') {
      return "has ':', whitespace or a control character, which a NATS header name cannot carry";
    }
  }
  return {};
}

// Why `value` cannot be a NATS header value, or empty.
std::string HeaderValueProblem(std::string_view value) {
  if (value.find_first_of(std::string_view{"\r\n\0", 3}) != std::string_view::npos) {
    return "has CR, LF or NUL, which a NATS header value cannot carry";
  }
  return {};
}

// What a stream name may not contain (JetStream: no whitespace, '.', '*', '>', path separators).
bool IsStreamName(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte <= 0x20 || byte == 0x7F || c == '.' || c == '*' || c == '>' || c == '/' ||
           c == '\\';
  });
}

// `text` with every occurrence of each of `secrets` replaced by ***.
std::string MaskSecrets(std::string text, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) {
    if (secret.empty()) continue;
    for (std::size_t at = text.find(secret); at != std::string::npos;
         at = text.find(secret, at + 3)) {
      text.replace(at, secret.size(), "***");
    }
  }
  return text;
}

// ---- What libnats' threads tell the sink ----

// An ack, as OnAck posted it.
struct Ack {
  std::uint64_t token = 0;
  natsStatus status = NATS_OK;
  jsErrCode code = static_cast<jsErrCode>(0);
  std::string text;    // the error's text
  std::string stream;  // the stream that stored it (a pub ack)
};

// One connection's news from libnats' threads.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::unordered_map<const natsMsg*, std::uint64_t> tokens;  // publishes awaiting their ack
  std::vector<Ack> acks;                                     // posted, not yet applied
  bool closed = false;
  std::string closed_reason;
  // Subjects the server refused publishes to (permissions): no ack comes for those.
  std::set<std::string> denied;
  std::uint64_t denied_version = 0;
  // Immutable after the mailbox is made.
  LogFn log;
  std::vector<std::string> secrets;  // masked in what libnats says, should it quote one

  [[nodiscard]] std::string Mask(std::string text) const {
    return MaskSecrets(std::move(text), secrets);
  }
};

class MailboxTable {
 public:
  void* Add(std::shared_ptr<Mailbox> mailbox) {
    const std::lock_guard lock(mutex_);
    const std::uint64_t number = next_++;
    mailboxes_.emplace(number, std::move(mailbox));
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(number));  // NOLINT: a number
  }
  std::shared_ptr<Mailbox> Find(void* closure) {
    const std::lock_guard lock(mutex_);
    const auto found = mailboxes_.find(reinterpret_cast<std::uintptr_t>(closure));
    return found == mailboxes_.end() ? nullptr : found->second;
  }
  void Remove(void* closure) {
    const std::lock_guard lock(mutex_);
    mailboxes_.erase(reinterpret_cast<std::uintptr_t>(closure));
  }

 private:
  std::mutex mutex_;
  std::uint64_t next_ = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<Mailbox>> mailboxes_;
};

MailboxTable& Mailboxes() {
  // Never destroyed: a libnats thread may still call a handler while the program exits, after
  // static objects are gone.
  static MailboxTable* const table = std::make_unique<MailboxTable>().release();
  return *table;
}

void OnAck(jsCtx* /*js*/, natsMsg* message, jsPubAck* ack, jsPubAckErr* error, void* closure) {
  const MsgPtr owned{message};  // the handler owns it (jsOptions.PublishAsync.AckHandler)
  const std::shared_ptr<Mailbox> mailbox = Mailboxes().Find(closure);
  if (!mailbox) return;
  Ack posted;
  if (error != nullptr) {
    posted.status = error->Err == NATS_OK ? NATS_ERR : error->Err;
    posted.code = error->ErrCode;
    posted.text = error->ErrText != nullptr ? error->ErrText : natsStatus_GetText(posted.status);
  } else if (ack != nullptr) {
    if (ack->Stream != nullptr) posted.stream = ack->Stream;
  } else {
    posted.status = NATS_ERR;
    posted.text = "the ack handler was called without an ack";
  }
  {
    const std::lock_guard lock(mailbox->mutex);
    const auto found = mailbox->tokens.find(message);
    if (found == mailbox->tokens.end()) return;
    posted.token = found->second;
    mailbox->tokens.erase(found);
    mailbox->acks.push_back(std::move(posted));
  }
  mailbox->changed.notify_all();
}

void OnClosed(natsConnection* connection, void* closure) {
  const std::shared_ptr<Mailbox> mailbox = Mailboxes().Find(closure);
  if (!mailbox) return;
  const char* text = nullptr;
  natsConnection_GetLastError(connection, &text);
  {
    const std::lock_guard lock(mailbox->mutex);
    mailbox->closed = true;
    mailbox->closed_reason = text != nullptr && text[0] != '\0'
                                 ? mailbox->Mask(WithoutSourceLocation(text))
                                 : "the connection was closed";
  }
  mailbox->changed.notify_all();
}

// The text between `prefix` and the next '"' in `text`, e.g. the subject of
// 'Permissions Violation for Publish to "orders.eu"'.
std::optional<std::string> QuotedAfter(std::string_view text, std::string_view prefix) {
  const std::size_t at = text.find(prefix);
  if (at == std::string_view::npos) return std::nullopt;
  const std::size_t begin = at + prefix.size();
  const std::size_t end = text.find('"', begin);
  if (end == std::string_view::npos) return std::nullopt;
  return std::string{text.substr(begin, end - begin)};
}

void OnAsyncError(natsConnection* connection, natsSubscription* /*subscription*/, natsStatus status,
                  void* closure) {
  const std::shared_ptr<Mailbox> mailbox = Mailboxes().Find(closure);
  if (!mailbox) return;
  const char* raw_text = nullptr;
  natsConnection_GetLastError(connection, &raw_text);
  const std::string text =
      raw_text != nullptr ? mailbox->Mask(WithoutSourceLocation(raw_text)) : std::string{};
  // A publish the server refused (-ERR 'Permissions Violation for Publish to "x"') gets no
  // reply: the publishes to that subject are answered from here. Logged once per subject.
  if (status == NATS_NOT_PERMITTED) {
    if (auto subject = QuotedAfter(text, "Publish to \"")) {
      bool first = false;
      {
        const std::lock_guard lock(mailbox->mutex);
        first = mailbox->denied.insert(std::move(*subject)).second;
        ++mailbox->denied_version;
      }
      mailbox->changed.notify_all();
      if (!first) return;
    }
  }
  if (!mailbox->log) return;
  mailbox->log(LogLevel::kWarn, std::string{"nats: "} + natsStatus_GetText(status) +
                                    (text.empty() ? std::string{} : ": " + text));
}

// ---- The sink ----

class NatsSink final : public SinkBase {
 public:
  explicit NatsSink(SinkOptions options)
      : options_(std::move(options)),
        servers_(ParseUrl(options_.url)),
        subject_(NameTemplate::Parse(options_.subject, "subject")),
        cloudevents_(options_.cloudevents) {
    for (const std::string* secret : {&servers_.password, &servers_.token, &options_.token}) {
      if (!secret->empty()) secrets_.push_back(*secret);
    }
    if (!options_.expect_stream.empty()) due_checks_.insert(options_.expect_stream);
  }

  NatsSink(const NatsSink&) = delete;
  NatsSink& operator=(const NatsSink&) = delete;
  ~NatsSink() override { Close(); }

  [[nodiscard]] std::string_view Name() const override { return kSinkName; }

  void Close() override {
    pending_.clear();
    Disconnect();
  }

 private:
  // One connection and what belongs to it.
  struct Link {
    std::shared_ptr<Mailbox> mailbox;
    void* closure = nullptr;  // the mailbox's number
    ConnectionPtr connection;
    JetStreamPtr js;
    std::int64_t max_payload = 0;
    // The mailbox's denied subjects as last taken (denied_version).
    std::set<std::string> denied;
    std::uint64_t denied_version = 0;
  };

  void Settle(std::size_t index, std::optional<Failure> failure) {
    batch()->Settle(index, std::move(failure));
  }
  void Stop(std::string reason) { batch()->Stop(std::move(reason)); }
  [[nodiscard]] std::string Mask(std::string text) const {
    return MaskSecrets(std::move(text), secrets_);
  }
  void Log(LogLevel level, const std::string& message) const {
    if (options_.log) options_.log(level, message);
  }

  bool Connected(Deadline deadline) override;
  std::optional<std::string> Connect(Deadline deadline) override;
  void Send(Batch& batch, Deadline deadline) override;
  void Await(Batch& batch, Deadline deadline) override;
  void Finish(Batch& batch, Deadline deadline) override;
  OptionsPtr MakeOptions(milliseconds timeout, void* closure, std::string& error) const;
  std::optional<Failure> Prepare(const Envelope& envelope, MsgPtr& out, std::string& subject) const;
  std::optional<Failure> CloudEventHeaders(
      const Envelope& envelope, std::vector<std::pair<std::string, std::string>>& headers,
      std::optional<std::string>& structured) const;
  bool WaitForAcks(Deadline deadline);
  void ApplyAcks();
  void LoseConnection(const std::string& reason);
  void Disconnect();
  void CheckDuplicateWindows(Deadline deadline);

  SinkOptions options_;
  Servers servers_;
  NameTemplate subject_;
  cloudevents::Mapper cloudevents_;
  std::vector<std::string> secrets_;

  std::optional<Link> link_;
  std::uint64_t next_token_ = 1;
  std::map<std::uint64_t, std::size_t> pending_;  // token -> batch index (kNoIndex: answered)
  std::vector<std::string> subjects_;             // by batch index, for the reasons of rejects

  // Of the Publish call in progress: published, no ack applied yet; answered "no responders" (a
  // server shutting down stops JetStream before it closes its connections, and meanwhile answers
  // so for every subject).
  std::size_t in_flight_ = 0;
  std::vector<std::size_t> no_responders_;

  // Streams whose duplicate window is still to be compared with the lease, and those done.
  std::set<std::string> due_checks_;
  std::set<std::string> checked_;
  std::map<std::string, int> check_tries_;
};

void NatsSink::Await(Batch& /*batch*/, Deadline deadline) {
  while (in_flight_ > 0 && link_) {
    if (!WaitForAcks(deadline) && SteadyClock::now() >= deadline) break;
  }
}

void NatsSink::Finish(Batch& /*batch*/, Deadline deadline) {
  // Whatever still awaits its ack has no verdict by the deadline; its late ack will be ignored.
  for (auto& [token, index] : pending_) {
    if (index == kNoIndex) continue;
    Settle(index, MakeFailure(FailureKind::kOutcomeUnknown,
                              "sent, but no ack from JetStream by the deadline"));
    index = kNoIndex;
  }
  in_flight_ = 0;
  no_responders_.clear();
  CheckDuplicateWindows(deadline);
}

bool NatsSink::Connected(Deadline deadline) {
  if (link_) {
    bool closed = false;
    std::string reason;
    {
      const std::lock_guard lock(link_->mailbox->mutex);
      closed = link_->mailbox->closed;
      reason = link_->mailbox->closed_reason;
    }
    if (!closed && natsConnection_IsClosed(link_->connection.get())) {
      closed = true;
      reason = "the connection was closed";
    }
    if (!closed) {
      // A PING: a connection the server cut is found dead here, before anything is sent. No
      // PONG in time is no reason to stop (a busy or silent server): what is sent then and not
      // acknowledged is outcome-unknown.
      const auto remaining = std::chrono::ceil<milliseconds>(deadline - SteadyClock::now());
      const milliseconds wait = std::clamp(remaining / 4, milliseconds{1}, kProbeWait);
      const natsStatus status = natsConnection_FlushTimeout(link_->connection.get(), wait.count());
      if (status != NATS_OK && status != NATS_TIMEOUT) {
        closed = true;
        reason = Mask(LastError(status));
      }
    }
    if (closed) {
      ApplyAcks();  // those that came before the end
      LoseConnection(reason);
    }
  }
  return link_.has_value();
}

OptionsPtr NatsSink::MakeOptions(milliseconds timeout, void* closure, std::string& error) const {
  natsOptions* raw = nullptr;
  if (natsOptions_Create(&raw) != NATS_OK) {
    error = "cannot create connection options: " + LastError(NATS_NO_MEMORY);
    return nullptr;
  }
  OptionsPtr options{raw};
  // The servers without user info (given apart below), as a comma-separated list.
  const std::string urls = servers_.Describe();
  const bool tls = servers_.tls || !options_.tls_ca_file.empty() ||
                   !options_.tls_cert_file.empty() || !options_.tls_server_name.empty();
  // Each step names what it set, for the error; libnats' text says why.
  const std::pair<const char*, natsStatus> steps[] = {
      {"servers", natsOptions_SetURL(options.get(), urls.c_str())},
      {"no_randomize", natsOptions_SetNoRandomize(options.get(), true)},
      {"timeout", natsOptions_SetTimeout(options.get(), timeout.count())},
      {"allow_reconnect", natsOptions_SetAllowReconnect(options.get(), false)},
      // A silent server (the connection open, nothing answered) ends the connection.
      {"ping_interval", natsOptions_SetPingInterval(options.get(), options_.ping_interval.count())},
      {"max_pings_out", natsOptions_SetMaxPingsOut(options.get(), kMaxPingsOut)},
      {"name", natsOptions_SetName(options.get(), "outbox")},
      {"closed_callback", natsOptions_SetClosedCB(options.get(), OnClosed, closure)},
      {"error_handler", natsOptions_SetErrorHandler(options.get(), OnAsyncError, closure)},
  };
  for (const auto& [what, status] : steps) {
    if (status != NATS_OK) {
      error = std::string{"connection options ("} + what + "): " + Mask(LastError(status));
      return nullptr;
    }
  }
  const auto check = [&](const char* what, natsStatus status) {
    if (status == NATS_OK) return true;
    error = std::string{what} + ": " + Mask(LastError(status));
    return false;
  };
  if (!servers_.user.empty() &&
      !check("user info", natsOptions_SetUserInfo(options.get(), servers_.user.c_str(),
                                                  servers_.password.c_str()))) {
    return nullptr;
  }
  const std::string& token = !servers_.token.empty() ? servers_.token : options_.token;
  if (!token.empty() && !check("token", natsOptions_SetToken(options.get(), token.c_str()))) {
    return nullptr;
  }
  if (!options_.creds.empty() &&
      !check("creds", natsOptions_SetUserCredentialsFromFiles(options.get(), options_.creds.c_str(),
                                                              nullptr))) {
    return nullptr;
  }
  if (!options_.nkey_seed.empty() &&
      !check("nkey_seed",
             natsOptions_SetNKeyFromSeed(options.get(), nullptr, options_.nkey_seed.c_str()))) {
    return nullptr;
  }
  if (tls) {
    if (!check("tls", natsOptions_SetSecure(options.get(), true))) return nullptr;
    if (!options_.tls_ca_file.empty() &&
        !check("tls_ca_file", natsOptions_LoadCATrustedCertificates(
                                  options.get(), options_.tls_ca_file.c_str()))) {
      return nullptr;
    }
    if (!options_.tls_cert_file.empty() &&
        !check("tls_cert_file",
               natsOptions_LoadCertificatesChain(options.get(), options_.tls_cert_file.c_str(),
                                                 options_.tls_key_file.c_str()))) {
      return nullptr;
    }
    if (!options_.tls_server_name.empty() &&
        !check("tls_server_name",
               natsOptions_SetExpectedHostname(options.get(), options_.tls_server_name.c_str()))) {
      return nullptr;
    }
  }
  return options;
}

std::optional<std::string> NatsSink::Connect(Deadline deadline) {
  const auto now = SteadyClock::now();
  // Per server: libnats tries them in turn, each with this timeout.
  const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - now) /
                         static_cast<int>(servers_.addresses.size());
  const milliseconds timeout =
      std::max(milliseconds{1}, std::min(options_.connect_timeout, remaining));

  auto mailbox = std::make_shared<Mailbox>();
  mailbox->log = options_.log;
  mailbox->secrets = secrets_;
  void* const closure = Mailboxes().Add(mailbox);
  std::string error;
  Link link{.mailbox = std::move(mailbox), .closure = closure};
  if (OptionsPtr options = MakeOptions(timeout, closure, error)) {
    natsConnection* connection = nullptr;
    const natsStatus status = natsConnection_Connect(&connection, options.get());
    if (status == NATS_OK) {
      link.connection.reset(connection);
      jsOptions js_options;
      jsOptions_Init(&js_options);
      js_options.PublishAsync.AckHandler = OnAck;
      js_options.PublishAsync.AckHandlerClosure = closure;
      jsCtx* js = nullptr;
      const natsStatus js_status =
          natsConnection_JetStream(&js, link.connection.get(), &js_options);
      if (js_status == NATS_OK) {
        link.js.reset(js);
      } else {
        error = "cannot make a JetStream context: " + Mask(LastError(js_status));
      }
    } else {
      error = "cannot connect to " + servers_.Describe() + ": " + Mask(LastError(status));
    }
  }
  if (!link.js) {
    Mailboxes().Remove(closure);
    link.js.reset();
    link.connection.reset();
    return error;
  }
  link.max_payload = natsConnection_GetMaxPayload(link.connection.get());
  link_.emplace(std::move(link));
  return std::nullopt;
}

// The NATS binding of CloudEvents: binary mode, every attribute (datacontenttype too) as a header
// ce-<name>, its value percent-encoded as the binding says; structured mode, the JSON event as the
// body and Content-Type: application/cloudevents+json.
std::optional<Failure> NatsSink::CloudEventHeaders(
    const Envelope& envelope, std::vector<std::pair<std::string, std::string>>& headers,
    std::optional<std::string>& structured) const {
  if (cloudevents_.mode() == cloudevents::Mode::kStructured) {
    std::string body;
    if (auto error = cloudevents_.StructuredJson(envelope, body)) {
      return MakeFailure(FailureKind::kPermanent, std::move(*error));
    }
    if (body.size() > options_.max_message_bytes) {
      return MakeFailure(FailureKind::kPermanent,
                         "the structured CloudEvent is " + std::to_string(body.size()) +
                             " bytes, over max_message_bytes (" +
                             std::to_string(options_.max_message_bytes) + ")");
    }
    structured = std::move(body);
    headers.emplace_back(kCloudEventsContentTypeHeader, cloudevents::kStructuredContentType);
    return std::nullopt;
  }
  std::vector<cloudevents::Attribute> attributes;
  if (auto error = cloudevents_.Attributes(envelope, attributes)) {
    return MakeFailure(FailureKind::kPermanent, std::move(*error));
  }
  for (const cloudevents::Attribute& attribute : attributes) {
    headers.emplace_back("ce-" + attribute.name,
                         cloudevents::PercentEncodeHeaderValue(attribute.value));
  }
  return std::nullopt;
}

std::optional<Failure> NatsSink::Prepare(const Envelope& envelope, MsgPtr& out,
                                         std::string& subject) const {
  if (envelope.payload.size() > options_.max_message_bytes) {
    return MakeFailure(FailureKind::kPermanent,
                       "payload is " + std::to_string(envelope.payload.size()) +
                           " bytes, over max_message_bytes (" +
                           std::to_string(options_.max_message_bytes) + ")");
  }
  subject = subject_.Expand(envelope);
  if (const std::string problem = SubjectProblem(subject); !problem.empty()) {
    return MakeFailure(FailureKind::kPermanent, "subject '" + Shorten(subject) +
                                                    "' (from the subject template '" +
                                                    Shorten(options_.subject) + "') " + problem +
                                                    ": not a NATS subject to publish to");
  }
  const bool has_type = envelope.type && !envelope.type->empty();
  const bool has_content_type = !envelope.content_type.empty();
  std::vector<std::pair<std::string, std::string>> headers;
  headers.reserve(envelope.headers.size() + 12);
  const std::string id = envelope.id.ToString();
  std::optional<std::string> structured;  // the body in CloudEvents' structured mode
  if (options_.envelope == EnvelopeStyle::kCloudEvents) {
    if (auto failure = CloudEventHeaders(envelope, headers, structured)) return failure;
  }
  for (const auto& [name, value] : envelope.headers) {
    if (options_.envelope == EnvelopeStyle::kCloudEvents) break;  // only as extensions
    // The store refuses the reserved names; skip them anyway, the names set below, and Nats-*
    // (JetStream acts on those).
    if (wire::IsReservedName(name) || StartsWithNoCase(name, kReservedNatsPrefix) ||
        (has_type && name == kTypeHeader) || (has_content_type && name == kContentTypeHeader)) {
      continue;
    }
    headers.emplace_back(name, value);
  }
  if (options_.envelope != EnvelopeStyle::kCloudEvents) {
    headers.emplace_back(wire::kMessageId, id);
    headers.emplace_back(wire::kEventId, envelope.EventId().ToString());
    if (has_type) headers.emplace_back(kTypeHeader, *envelope.type);
    if (has_content_type) headers.emplace_back(kContentTypeHeader, envelope.content_type);
  }
  if (options_.envelope == EnvelopeStyle::kFull) {
    headers.emplace_back(wire::kTopicHeader, envelope.topic);
    if (envelope.stream_key) headers.emplace_back(wire::kStreamKeyHeader, *envelope.stream_key);
    if (envelope.stream_seq) {
      headers.emplace_back(wire::kStreamSeqHeader, std::to_string(*envelope.stream_seq));
    }
    if (envelope.stream_prev_seq) {
      headers.emplace_back(wire::kStreamPrevSeqHeader, std::to_string(*envelope.stream_prev_seq));
    }
    headers.emplace_back(wire::kPartitionHeader, std::to_string(envelope.partition));
    headers.emplace_back(wire::kAttemptsHeader, std::to_string(envelope.attempts));
    headers.emplace_back(wire::kTargetHeader, envelope.target);
    if (!envelope.database.empty()) headers.emplace_back(wire::kDatabaseHeader, envelope.database);
  }

  // "NATS/1.0\r\n", a "name: value\r\n" line each, "\r\n": as the server counts them against
  // max_payload, with JetStream's own headers.
  std::size_t header_bytes = 10 + 2 + kMsgIdHeader.size() + 4 + id.size();
  if (!options_.expect_stream.empty()) {
    header_bytes += kExpectedStreamHeader.size() + 4 + options_.expect_stream.size();
  }
  for (const auto& [name, value] : headers) {
    if (const std::string problem = HeaderNameProblem(name); !problem.empty()) {
      return MakeFailure(FailureKind::kPermanent, "header name '" + Shorten(name) + "' " + problem);
    }
    if (const std::string problem = HeaderValueProblem(value); !problem.empty()) {
      return MakeFailure(FailureKind::kPermanent,
                         "header '" + Shorten(name) + "': value " + problem);
    }
    header_bytes += name.size() + 4 + value.size();
  }
  const std::string& body = structured ? *structured : envelope.payload;
  const std::size_t size = body.size() + header_bytes;
  if (link_ && link_->max_payload > 0 && size > static_cast<std::size_t>(link_->max_payload)) {
    return MakeFailure(FailureKind::kPermanent,
                       "message is " + std::to_string(size) + " bytes (payload " +
                           std::to_string(body.size()) + ", headers " +
                           std::to_string(header_bytes) + "), over the server's max_payload (" +
                           std::to_string(link_->max_payload) + ")");
  }

  natsMsg* raw = nullptr;
  natsStatus status =
      natsMsg_Create(&raw, subject.c_str(), nullptr, body.data(), static_cast<int>(body.size()));
  out.reset(raw);
  for (std::size_t i = 0; status == NATS_OK && i < headers.size(); ++i) {
    status = natsMsgHeader_Set(raw, headers[i].first.c_str(), headers[i].second.c_str());
  }
  if (status != NATS_OK) {
    out.reset();
    return MakeFailure(FailureKind::kPermanent, "cannot make the message: " + LastError(status));
  }
  return std::nullopt;
}

void NatsSink::Send(Batch& batch, Deadline deadline) {
  subjects_.assign(batch.size(), std::string{});
  in_flight_ = 0;
  no_responders_.clear();
  MsgPtr message;
  std::size_t since_applied = 0;
  jsPubOptions publish_options;
  jsPubOptions_Init(&publish_options);
  publish_options.MaxWait = kAckTimeout.count();
  if (!options_.expect_stream.empty())
    publish_options.ExpectStream = options_.expect_stream.c_str();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!link_) return;  // LoseConnection said why
    if (SteadyClock::now() >= deadline) {
      Stop("the deadline passed before its turn");
      return;
    }
    if (auto failure = Prepare(batch[i], message, subjects_[i])) {
      Settle(i, std::move(failure));
      continue;
    }
    while (link_ && pending_.size() >= options_.max_pending) {
      if (!WaitForAcks(deadline) && SteadyClock::now() >= deadline) {
        Stop("the deadline passed with " + std::to_string(pending_.size()) +
             " publishes awaiting their ack (max_pending " + std::to_string(options_.max_pending) +
             ")");
        return;
      }
    }
    if (!link_) return;
    if (++since_applied >= kApplyEvery) {
      since_applied = 0;
      ApplyAcks();
      if (!link_) return;
    }

    Mailbox& mailbox = *link_->mailbox;
    const std::uint64_t token = next_token_++;
    {
      // Before the publish: its ack may come before js_PublishMsgAsync returns.
      const std::lock_guard lock(mailbox.mutex);
      mailbox.tokens.emplace(message.get(), token);
    }
    pending_.emplace(token, i);
    const std::string id = batch[i].id.ToString();
    publish_options.MsgId = id.c_str();
    natsMsg* raw = message.get();
    const natsStatus status = js_PublishMsgAsync(link_->js.get(), &raw, &publish_options);
    if (raw == nullptr) {
      static_cast<void>(message.release());  // libnats owns it now; OnAck frees it
      ++in_flight_;
      continue;
    }
    // Refused: libnats kept no trace of it, no ack will come.
    {
      const std::lock_guard lock(mailbox.mutex);
      mailbox.tokens.erase(message.get());
    }
    pending_.erase(token);
    const std::string text = Mask(LastError(status));
    Settle(i, ClassifyPublishError(status, text));
    if (IsConnectionLost(status)) {
      LoseConnection(text);
      return;
    }
  }
}

bool NatsSink::WaitForAcks(Deadline deadline) {
  Mailbox& mailbox = *link_->mailbox;
  bool closed = false;
  std::string reason;
  bool arrived = false;
  {
    std::unique_lock lock(mailbox.mutex);
    const auto until = std::min<SteadyClock::time_point>(deadline, SteadyClock::now() + kWaitSlice);
    arrived = mailbox.changed.wait_until(lock, until, [&] {
      return !mailbox.acks.empty() || mailbox.closed ||
             mailbox.denied_version != link_->denied_version;
    });
    closed = mailbox.closed;
    reason = mailbox.closed_reason;
  }
  ApplyAcks();
  if (!closed && natsConnection_IsClosed(link_->connection.get())) {
    closed = true;
    reason = "the connection was closed";
  }
  if (closed) {
    LoseConnection(reason);
    return false;
  }
  return arrived;
}

void NatsSink::ApplyAcks() {
  if (!link_) return;
  std::vector<Ack> acks;
  bool denied_changed = false;
  {
    Mailbox& mailbox = *link_->mailbox;
    const std::lock_guard lock(mailbox.mutex);
    acks.swap(mailbox.acks);
    if (mailbox.denied_version != link_->denied_version) {
      link_->denied = mailbox.denied;
      link_->denied_version = mailbox.denied_version;
      denied_changed = true;
    }
  }
  for (Ack& ack : acks) {
    const auto found = pending_.find(ack.token);
    if (found == pending_.end()) continue;
    const std::size_t index = found->second;
    pending_.erase(found);
    if (ack.status == NATS_OK && !ack.stream.empty() && !checked_.contains(ack.stream)) {
      due_checks_.insert(ack.stream);
    }
    if (index == kNoIndex || batch() == nullptr) continue;
    if (ack.status == NATS_NO_RESPONDERS) no_responders_.push_back(index);
    Settle(index, ClassifyAck(ack.status, ack.code, Mask(std::move(ack.text)), subjects_[index]));
    --in_flight_;
  }
  if (link_->denied.empty() || batch() == nullptr || (!denied_changed && acks.empty())) return;
  // Publishes to a subject the server refuses: their (timed-out) acks will be ignored.
  for (auto it = pending_.begin(); it != pending_.end();) {
    const std::size_t index = it->second;
    if (index == kNoIndex || !link_->denied.contains(subjects_[index])) {
      ++it;
      continue;
    }
    // A state of the destination, not of the message (issue #40): no attempt spent.
    Settle(index, MakeFailure(FailureKind::kUnavailable,
                              "not permitted to publish to subject '" + subjects_[index] +
                                  "' (the server's Permissions Violation)"));
    --in_flight_;
    it = pending_.erase(it);
  }
}

void NatsSink::LoseConnection(const std::string& reason) {
  const std::string what = "connection to " + servers_.Describe() + " lost: " + reason;
  for (auto& [token, index] : pending_) {
    if (index == kNoIndex || batch() == nullptr) continue;
    Settle(index, MakeFailure(FailureKind::kOutcomeUnknown, "sent, but no ack before the " + what));
    --in_flight_;
  }
  pending_.clear();
  Disconnect();
  if (batch() == nullptr) return;
  Stop(what);
  // "No responders" and then the connection lost: the server was shutting down (JetStream first)
  // rather than missing a stream. Not stored either way; retried without spending an attempt.
  for (const std::size_t index : no_responders_) {
    batch()->Unsettle(index);
    Settle(index, MakeFailure(FailureKind::kUnavailable,
                              "not stored: no responders for subject '" + subjects_[index] +
                                  "' while the server was going away (" + what + ")"));
  }
  no_responders_.clear();
}

void NatsSink::Disconnect() {
  if (!link_) return;
  // Callbacks that come from now on find no mailbox. Then the context (it drops the publishes
  // still awaiting an ack) before its connection.
  Mailboxes().Remove(link_->closure);
  link_->js.reset();
  link_->connection.reset();
  link_.reset();
}

void NatsSink::CheckDuplicateWindows(Deadline deadline) {
  if (!options_.log || options_.lease <= milliseconds::zero()) {
    due_checks_.clear();
    return;
  }
  while (!due_checks_.empty() && link_) {
    const auto remaining = std::chrono::floor<milliseconds>(deadline - SteadyClock::now());
    if (remaining < kMinTimeForCheck) return;  // on a later Publish
    const std::string stream = *due_checks_.begin();
    jsOptions js_options;
    jsOptions_Init(&js_options);
    js_options.Wait = std::min(remaining, kStreamInfoWait).count();
    jsStreamInfo* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus status =
        js_GetStreamInfo(&raw, link_->js.get(), stream.c_str(), &js_options, &code);
    const StreamInfoPtr info{raw};
    if (status == NATS_TIMEOUT && ++check_tries_[stream] < kStreamInfoTries) {
      // Try again on a later Publish (the set keeps it due).
      return;
    }
    due_checks_.erase(stream);
    checked_.insert(stream);
    if (status == NATS_OK && info && info->Config != nullptr) {
      const std::chrono::nanoseconds window{info->Config->Duplicates};
      if (window < options_.lease) {
        Log(LogLevel::kWarn,
            "nats: stream '" + stream + "' keeps message ids for " + Seconds(window) +
                " (its duplicate_window), less than the relay's lease of " +
                Seconds(options_.lease) +
                ": a message published again after a relay takeover or a lost ack may be "
                "stored twice; set the stream's duplicate_window to at least the lease");
      }
    } else if (code == JSStreamNotFoundErr) {
      Log(LogLevel::kWarn,
          "nats: stream '" + stream + "' does not exist" +
              (stream == options_.expect_stream ? " (expect_stream): every publish will be rejected"
                                                : std::string{}));
    } else {
      Log(LogLevel::kInfo,
          "nats: cannot read the duplicate window of stream '" + stream +
              "' (to compare it with the relay's lease): " + Mask(LastError(status)));
    }
  }
}

}  // namespace

void ValidateOptions(const SinkOptions& options) {
  if (options.envelope == EnvelopeStyle::kCloudEvents) {
    cloudevents::ValidateOptions(options.cloudevents);
  }
  Servers servers;
  try {
    servers = ParseUrl(options.url);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("url", std::string{error.what()} + " (got '" + MaskUrl(options.url) + "')");
  }
  {
    // The template's literal parts must make a subject with any field's value (each expanded
    // subject is checked again when a message is prepared).
    Envelope sample;
    sample.topic = "topic";
    sample.target = "target";
    sample.type = "type";
    const std::string subject = NameTemplate::Parse(options.subject, "subject").Expand(sample);
    if (const std::string problem = SubjectProblem(subject); !problem.empty()) {
      const bool is_template = options.subject.find('{') != std::string::npos;
      throw ConfigError("subject",
                        "'" + Shorten(options.subject) + "' " +
                            (is_template ? "gives a subject that " : std::string{}) + problem +
                            (is_template ? " (e.g. '" + Shorten(subject) + "')" : std::string{}) +
                            ": not a NATS subject to publish to");
    }
  }
  if (!options.expect_stream.empty() && !IsStreamName(options.expect_stream)) {
    throw ConfigError("expect_stream",
                      "'" + Shorten(options.expect_stream) +
                          "' is not a stream name (1 to 255 bytes without whitespace, '.', '*', "
                          "'>', '/' or '\\')");
  }
  if (options.max_pending < 1 || options.max_pending > kMaxPending) {
    throw ConfigError("max_pending", "must be between 1 and " + std::to_string(kMaxPending));
  }
  if (options.connect_timeout <= milliseconds::zero()) {
    throw ConfigError("connect_timeout", "must be positive");
  }
  if (options.ping_interval < milliseconds{100} || options.ping_interval > std::chrono::hours{1}) {
    throw ConfigError("ping_interval", "must be between 100 ms and 1 h");
  }
  if (options.max_message_bytes < 1 || options.max_message_bytes > kMaxMessageBytes) {
    throw ConfigError("max_message_bytes",
                      "must be between 1 and " + std::to_string(kMaxMessageBytes) + " (64 MiB)");
  }
  // One way to authenticate.
  std::vector<std::string> ways;
  if (!servers.user.empty()) ways.emplace_back("user and password in url");
  if (!servers.token.empty()) ways.emplace_back("token in url");
  if (!options.token.empty()) ways.emplace_back("token");
  if (!options.creds.empty()) ways.emplace_back("creds");
  if (!options.nkey_seed.empty()) ways.emplace_back("nkey_seed");
  if (ways.size() > 1) {
    const std::string key = ways.back().find(' ') == std::string::npos ? ways.back() : "url";
    throw ConfigError(
        key, "more than one way to authenticate (" + ways[0] + ", " + ways[1] + "); give one");
  }
  for (const auto& [key, path] :
       {std::pair<std::string, const std::string*>{"creds", &options.creds},
        {"nkey_seed", &options.nkey_seed},
        {"tls_ca_file", &options.tls_ca_file},
        {"tls_cert_file", &options.tls_cert_file},
        {"tls_key_file", &options.tls_key_file}}) {
    if (!path->empty() && !IsReadableFile(*path)) {
      throw ConfigError(key, "cannot read the file '" + Shorten(*path, 200) + "'");
    }
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    throw ConfigError(options.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
                      "tls_cert_file and tls_key_file go together (a client certificate and its "
                      "key)");
  }
  if (options.tls_server_name.find_first_of(" /\t\r\n") != std::string::npos) {
    throw ConfigError("tls_server_name",
                      "'" + Shorten(options.tls_server_name) + "' is not a host name");
  }
}

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  ValidateOptions(options);
  return std::make_unique<NatsSink>(std::move(options));
}

}  // namespace outbox::nats
