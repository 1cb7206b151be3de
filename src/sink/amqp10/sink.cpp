// The AMQP 1.0 sink: unsettled deliveries over one sender link per address, windowed, outcomes in
// batch order.
//
// Two threads. Proton's container runs a connection's events on a thread of its own (a Session:
// container, thread and handler, made per connection and stopped and joined when the connection
// is given up). Publish runs on the caller's thread. They meet in a Mailbox, under its mutex:
//   - Publish prepares each message (a proton::message: a value, made on its thread) and queues
//     it, per address, in batch order, with a token (a number that grows across batches; batch
//     index = token - the batch's first), then wakes the container thread (its work queue);
//   - the container thread (Pump) opens a session and sender link for each address it has not
//     seen (closing idle ones past kMaxLinks), and
//     sends the queued messages of each open link while the link has credit and fewer than
//     `max_in_flight` deliveries await their disposition; the delivery tag is the token. It
//     posts "sent" for each, and a verdict for each disposition (ClassifyDisposition), for each
//     queued message whose link the broker refused (ClassifyLinkRefusal), and outcome-unknown
//     for each unsettled delivery of a link or a connection that is lost;
//   - Publish applies what was posted to its Batch until every message has a verdict, the
//     connection is lost or the deadline passes; then it takes back whatever is still queued
//     (never sent: unavailable). Sending happens under the mailbox's mutex, so that a message is
//     either taken back or sent, never both.
// A verdict for a token of an earlier batch (a late disposition) is ignored. Before anything is
// sent, Connected() has the container thread begin and end a session (Handler::Probe): the
// broker's answer, or the connection's loss, tells whether the connection is still there.

#include <proton/delivery.h>
#include <proton/disposition.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <proton/annotation_key.hpp>
#include <proton/binary.hpp>
#include <proton/connection.hpp>
#include <proton/connection_options.hpp>
#include <proton/container.hpp>
#include <proton/delivery_mode.hpp>
#include <proton/error_condition.hpp>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/sender.hpp>
#include <proton/sender_options.hpp>
#include <proton/session.hpp>
#include <proton/ssl.hpp>
#include <proton/target.hpp>
#include <proton/timestamp.hpp>
#include <proton/tracker.hpp>
#include <proton/transport.hpp>
#include <proton/work_queue.hpp>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "classify.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/amqp10.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/readable_file.h"
#include "outbox/sink/sink_base.h"

namespace outbox::amqp10 {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// How long Close() waits for the broker to answer its close before the connection is aborted.
constexpr milliseconds kCloseWait{1000};
// Links (each with its session) kept open at most before the idle ones are closed.
constexpr std::size_t kMaxLinks = 256;
// How long the liveness probe at the start of a Publish waits for the broker's answer.
constexpr milliseconds kProbeWait{100};
// Messages are queued for the container thread in chunks of this many, so that sending starts
// while the rest of a large batch is being prepared.
constexpr std::size_t kQueueChunk = 128;

// Proton's C++ tracker does not show the condition of a remote disposition; the C API does. The
// wrapper's pointer is protected, so a copy of the tracker in a class of ours hands it out.
class RawTracker : public proton::tracker {
 public:
  explicit RawTracker(const proton::tracker& wrapped) : proton::tracker(wrapped) {}
  [[nodiscard]] pn_delivery_t* get() const { return pn_object(); }
};

proton::binary Tag(std::uint64_t token) {
  proton::binary tag(sizeof token, 0);
  for (std::size_t i = 0; i < sizeof token; ++i) {
    tag[i] = static_cast<std::uint8_t>(token >> (8 * i));
  }
  return tag;
}

std::optional<std::uint64_t> TokenOf(const proton::binary& tag) {
  if (tag.size() != sizeof(std::uint64_t)) return std::nullopt;
  std::uint64_t token = 0;
  for (std::size_t i = 0; i < tag.size(); ++i) token |= std::uint64_t{tag[i]} << (8 * i);
  return token;
}

// A message ready to go.
struct Outgoing {
  std::uint64_t token = 0;
  proton::message message;
};

// What the container thread tells the Publish thread about one message.
struct Event {
  std::uint64_t token = 0;
  bool sent = false;  // handed to Proton; else a verdict
  std::optional<Failure> failure;
};

enum class State : std::uint8_t { kConnecting, kOpen, kLost };

// One connection's meeting point of the two threads.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  State state = State::kConnecting;
  std::string lost_reason;
  // Messages waiting for their link, its credit or room in the window, per address, in order.
  std::map<std::string, std::deque<Outgoing>> queued;
  std::vector<Event> events;  // posted, not yet applied
  // The open connection's work queue, through which the Publish thread wakes the container
  // thread; null before it opens and once it is lost (the queue dies with the connection).
  proton::work_queue* work = nullptr;
  std::uint64_t probed = 0;  // the last probe the container thread answered
};

// The container thread's side: Proton's events. Everything here but the mailbox is touched on
// that thread only.
class Handler final : public proton::messaging_handler {
 public:
  Handler(const SinkOptions& options, const Endpoint& endpoint, Mailbox& mailbox)
      : options_(options), endpoint_(endpoint), mailbox_(mailbox) {}

  // Sends what is queued as far as links, credit and the window allow.
  void Pump() {
    if (!connection_ || closing_) return;
    bool posted = false;
    {
      const std::lock_guard lock(mailbox_.mutex);
      for (auto it = mailbox_.queued.begin(); it != mailbox_.queued.end();) {
        auto& [address, messages] = *it;
        if (messages.empty()) {
          it = mailbox_.queued.erase(it);
          continue;
        }
        auto link = links_.find(address);
        if (link == links_.end()) {
          if (links_.size() >= kMaxLinks) CloseIdleLinks();
          proton::sender_options sender_options;
          sender_options.delivery_mode(proton::delivery_mode::AT_LEAST_ONCE);
          sender_options.auto_settle(true);
          // A session per address: RabbitMQ 3.x's plugin ends the whole session when it refuses
          // a link (an exchange that does not exist) or a publish, which would take every other
          // address's deliveries with it.
          proton::session session = connection_.open_session();
          proton::sender sender = session.open_sender(address, sender_options);
          links_.emplace(address, Link{.session = session, .sender = sender});
          ++it;
          continue;
        }
        proton::sender& sender = link->second.sender;
        while (link->second.open && !messages.empty() && sender.credit() > 0 &&
               unsettled_.size() < options_.max_in_flight) {
          Outgoing& outgoing = messages.front();
          sender.send(outgoing.message, Tag(outgoing.token));
          unsettled_.emplace(outgoing.token, address);
          mailbox_.events.push_back({.token = outgoing.token, .sent = true});
          messages.pop_front();
          posted = true;
        }
        ++it;
      }
    }
    if (posted) mailbox_.changed.notify_all();
  }

  void Close() {
    if (connection_ && !closing_) connection_.close();
    closing_ = true;
  }

  // A round trip to the broker: a session begun and ended (AMQP 1.0 has no ping). Its answer
  // sets the mailbox's `probed` to `number`; a connection cut meanwhile is found lost instead.
  void Probe(std::uint64_t number) {
    if (!connection_ || closing_) return;
    probe_ = connection_.open_session();
    probe_number_ = number;
  }
  void on_session_open(proton::session& session) override {
    if (!probe_ || session != probe_) return;
    {
      const std::lock_guard lock(mailbox_.mutex);
      mailbox_.probed = probe_number_;
    }
    mailbox_.changed.notify_all();
    probe_.close();
    probe_ = proton::session{};
  }

  void on_container_start(proton::container& container) override {
    proton::connection_options options;
    options.idle_timeout(proton::duration(options_.idle_timeout.count()));
    options.sasl_enabled(true);
    std::string mechanisms = options_.sasl_mechanisms;
    if (mechanisms.empty()) mechanisms = endpoint_.user.empty() ? "ANONYMOUS" : "PLAIN";
    options.sasl_allowed_mechs(mechanisms);
    // PLAIN over amqp:// is what the URL asks for (RabbitMQ's port 5672, a broker on loopback).
    options.sasl_allow_insecure_mechs(!endpoint_.tls);
    if (!endpoint_.user.empty()) options.user(endpoint_.user);
    if (!endpoint_.password.empty()) options.password(endpoint_.password);
    const std::string host =
        options_.tls_server_name.empty() ? endpoint_.host : options_.tls_server_name;
    options.virtual_host(host);
    if (endpoint_.tls) {
      if (!options_.tls_cert_file.empty()) {
        options.ssl_client_options(proton::ssl_client_options(
            proton::ssl_certificate(options_.tls_cert_file, options_.tls_key_file),
            options_.tls_ca_file, proton::ssl::VERIFY_PEER_NAME));
      } else if (!options_.tls_ca_file.empty()) {
        options.ssl_client_options(
            proton::ssl_client_options(options_.tls_ca_file, proton::ssl::VERIFY_PEER_NAME));
      } else {
        options.ssl_client_options(proton::ssl_client_options(proton::ssl::VERIFY_PEER_NAME));
      }
    }
    try {
      container.connect(endpoint_.Describe(), options);
    } catch (const std::exception& error) {
      Lose(error.what());
    }
  }

  void on_connection_open(proton::connection& connection) override {
    connection_ = connection;
    {
      const std::lock_guard lock(mailbox_.mutex);
      if (mailbox_.state == State::kConnecting) mailbox_.state = State::kOpen;
      mailbox_.work = &connection.work_queue();
    }
    mailbox_.changed.notify_all();
    Pump();
  }

  void on_sender_open(proton::sender& sender) override {
    // A broker that refuses a link answers the attach without a target, then detaches it with
    // the error (AMQP 1.0 section 2.6.3): nothing is sent on it meanwhile.
    if (sender.target().address().empty()) return;
    const auto link = FindLink(sender);
    if (link != links_.end()) link->second.open = true;
    Pump();
  }

  void on_sendable(proton::sender& /*sender*/) override { Pump(); }

  void on_tracker_accept(proton::tracker& tracker) override {
    Settle(tracker, Disposition::kAccepted);
  }
  void on_tracker_reject(proton::tracker& tracker) override {
    Settle(tracker, Disposition::kRejected);
  }
  void on_tracker_release(proton::tracker& tracker) override {
    // Proton reports released and modified alike; the state tells them apart.
    Settle(tracker, tracker.state() == proton::transfer::MODIFIED ? Disposition::kModified
                                                                  : Disposition::kReleased);
  }

  // The broker closed the link (refused its attach, or detached it) or its session, with or
  // without an error.
  void on_sender_close(proton::sender& sender) override { Drop(FindLink(sender), sender.error()); }
  void on_session_close(proton::session& session) override {
    Drop(std::find_if(links_.begin(), links_.end(),
                      [&](const auto& entry) { return entry.second.session == session; }),
         session.error());
  }

  void on_transport_error(proton::transport& transport) override { Lose(transport.error().what()); }
  void on_connection_error(proton::connection& connection) override {
    Lose(connection.error().what());
  }
  void on_transport_close(proton::transport& /*transport*/) override {
    Lose("the connection was closed");
  }
  // Each error is handled by its own event above; the default would throw out of run().
  void on_error(const proton::error_condition& /*error*/) override {}

 private:
  struct Link {
    proton::session session;
    proton::sender sender;
    bool open = false;
  };

  // Gives up the link: its unsettled deliveries are outcome-unknown, and what is queued for its
  // address is not sent (classified by the broker's error). The next message for the address
  // opens it anew.
  void Drop(std::map<std::string, Link>::iterator link, const proton::error_condition& error) {
    if (link == links_.end()) return;
    const std::string address = link->first;
    if (link->second.session.active()) link->second.session.close();
    links_.erase(link);
    const std::string condition = error.name();
    const std::string text = error.description();
    const std::string why = condition.empty() ? std::string{"no error"} : condition + ": " + text;
    {
      const std::lock_guard lock(mailbox_.mutex);
      for (auto it = unsettled_.begin(); it != unsettled_.end();) {
        if (it->second != address) {
          ++it;
          continue;
        }
        // A refusal of the relay (RabbitMQ 3.x: ACCESS_REFUSED on the first publish to an
        // exchange, ending the session) is the not-authorized rule's unavailable; retried without
        // an attempt either way, like an unknown outcome.
        const bool refused = IsDestinationState(condition);
        mailbox_.events.push_back(
            {.token = it->first,
             .failure =
                 MakeFailure(refused ? FailureKind::kUnavailable : FailureKind::kOutcomeUnknown,
                             (refused ? "not taken: the broker closed the link to '"
                                      : "sent, but the broker closed the link to '") +
                                 address + "' before its disposition (" + why + ")")});
        it = unsettled_.erase(it);
      }
      if (const auto queued = mailbox_.queued.find(address); queued != mailbox_.queued.end()) {
        for (const Outgoing& outgoing : queued->second) {
          mailbox_.events.push_back(
              {.token = outgoing.token, .failure = ClassifyLinkRefusal(address, condition, text)});
        }
        mailbox_.queued.erase(queued);
      }
    }
    mailbox_.changed.notify_all();
    Pump();
  }

  // Closes the links with nothing unsettled and nothing queued (an address template that yields
  // many addresses would otherwise keep a session open for each). Called under the mailbox's
  // mutex.
  void CloseIdleLinks() {
    std::set<std::string_view> busy;
    for (const auto& [token, address] : unsettled_) busy.insert(address);
    for (auto it = links_.begin(); it != links_.end();) {
      const auto queued = mailbox_.queued.find(it->first);
      if (busy.contains(it->first) ||
          (queued != mailbox_.queued.end() && !queued->second.empty())) {
        ++it;
        continue;
      }
      it->second.session.close();
      it = links_.erase(it);
    }
  }

  std::map<std::string, Link>::iterator FindLink(const proton::sender& sender) {
    return std::find_if(links_.begin(), links_.end(),
                        [&](const auto& entry) { return entry.second.sender == sender; });
  }

  void Settle(proton::tracker& tracker, Disposition disposition) {
    const auto token = TokenOf(tracker.tag());
    if (!token) return;
    const auto found = unsettled_.find(*token);
    if (found == unsettled_.end()) return;
    unsettled_.erase(found);
    std::string condition;
    std::string description;
    if (disposition == Disposition::kRejected) {
      pn_disposition_t* remote = pn_delivery_remote(RawTracker(tracker).get());
      pn_condition_t* error = remote != nullptr ? pn_disposition_condition(remote) : nullptr;
      if (error != nullptr && pn_condition_is_set(error)) {
        const char* name = pn_condition_get_name(error);
        const char* text = pn_condition_get_description(error);
        condition = name != nullptr ? name : "";
        description = text != nullptr ? text : "";
      }
    }
    {
      const std::lock_guard lock(mailbox_.mutex);
      mailbox_.events.push_back(
          {.token = *token, .failure = ClassifyDisposition(disposition, condition, description)});
    }
    mailbox_.changed.notify_all();
    Pump();  // room in the window
  }

  void Lose(const std::string& reason) {
    {
      const std::lock_guard lock(mailbox_.mutex);
      if (mailbox_.state == State::kLost) return;
      mailbox_.state = State::kLost;
      mailbox_.work = nullptr;
      mailbox_.lost_reason = reason.empty() ? "the connection was closed" : reason;
      for (const auto& [token, address] : unsettled_) {
        mailbox_.events.push_back(
            {.token = token,
             .failure = MakeFailure(FailureKind::kOutcomeUnknown,
                                    "sent, but the connection was lost before its "
                                    "disposition: " +
                                        mailbox_.lost_reason)});
      }
    }
    unsettled_.clear();
    links_.clear();
    connection_ = proton::connection{};
    mailbox_.changed.notify_all();
  }

  const SinkOptions& options_;
  const Endpoint& endpoint_;
  Mailbox& mailbox_;
  proton::connection connection_;
  bool closing_ = false;
  proton::session probe_;  // the probe's session until the broker answers it
  std::uint64_t probe_number_ = 0;
  std::map<std::string, Link> links_;                         // by address
  std::unordered_map<std::uint64_t, std::string> unsettled_;  // token -> address
};

// One connection: its container, the container's thread and the handler. Destroying it aborts
// the connection (if still open) and joins the thread.
class Session {
 public:
  Session(const SinkOptions& options, const Endpoint& endpoint)
      : handler_(options, endpoint, mailbox_), container_(handler_) {
    container_.auto_stop(false);
    thread_ = std::thread([this] {
      try {
        container_.run();
      } catch (const std::exception& error) {
        {
          const std::lock_guard lock(mailbox_.mutex);
          mailbox_.state = State::kLost;
          mailbox_.lost_reason = error.what();
        }
        mailbox_.changed.notify_all();
      }
    });
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    container_.stop();
    thread_.join();
  }

  Mailbox& mailbox() { return mailbox_; }
  void Pump() {
    Post([this] { handler_.Pump(); });
  }
  // Posts a probe (Handler::Probe); the mailbox's `probed` reaches the number returned once the
  // broker has answered it.
  std::uint64_t Probe() {
    const std::uint64_t probe = ++probes_;
    Post([this, probe] { handler_.Probe(probe); });
    return probe;
  }
  // Asks the broker to close the connection; true once it is closed (or lost) within `wait`.
  bool Close(milliseconds wait) {
    Post([this] { handler_.Close(); });
    std::unique_lock lock(mailbox_.mutex);
    return mailbox_.changed.wait_for(lock, wait, [&] { return mailbox_.state == State::kLost; });
  }

 private:
  // Runs `work` on the container thread, if the connection is open. The connection's work queue
  // wakes its thread at once (a queue of the container's waits for the next event).
  void Post(proton::work work) {
    const std::lock_guard lock(mailbox_.mutex);
    if (mailbox_.work != nullptr) mailbox_.work->add(std::move(work));
  }

  Mailbox mailbox_;
  Handler handler_;
  proton::container container_;
  std::thread thread_;
  std::uint64_t probes_ = 0;
};

class Amqp10Sink final : public SinkBase {
 public:
  explicit Amqp10Sink(SinkOptions options)
      : options_(std::move(options)),
        endpoint_(ParseUrl(options_.url)),
        address_(NameTemplate::Parse(options_.address, "address")),
        cloudevents_(options_.cloudevents) {}

  Amqp10Sink(const Amqp10Sink&) = delete;
  Amqp10Sink& operator=(const Amqp10Sink&) = delete;
  ~Amqp10Sink() override { Close(); }

  [[nodiscard]] std::string_view Name() const override { return kSinkName; }

  void Close() override {
    if (session_) session_->Close(kCloseWait);
    session_.reset();
  }

 private:
  bool Connected(Deadline deadline) override;
  std::optional<std::string> Connect(Deadline deadline) override;
  void Send(Batch& batch, Deadline deadline) override;
  void Await(Batch& batch, Deadline deadline) override;
  void Finish(Batch& batch, Deadline deadline) override;
  std::optional<Failure> Prepare(const Envelope& envelope, std::string& address,
                                 proton::message& message) const;
  std::optional<Failure> PrepareCloudEvent(const Envelope& envelope,
                                           proton::message& message) const;
  void Apply(Batch& batch, std::vector<Event>& events);

  SinkOptions options_;
  Endpoint endpoint_;
  NameTemplate address_;
  cloudevents::Mapper cloudevents_;
  std::unique_ptr<Session> session_;
  std::uint64_t next_token_ = 1;
  std::uint64_t first_token_ = 0;  // of the Publish call in progress
  std::size_t awaited_ = 0;        // its messages queued and not yet given a verdict
};

bool Amqp10Sink::Connected(Deadline deadline) {
  if (!session_) return false;
  // A round trip to the broker first (as the NATS sink PINGs): a connection the broker or the
  // network cut since the last call is then known as lost before anything is sent on it. A slow
  // answer is no reason to stop: after kProbeWait the batch goes on the connection as it is.
  Mailbox& mailbox = session_->mailbox();
  const std::uint64_t probe = session_->Probe();
  State state = State::kConnecting;
  {
    std::unique_lock lock(mailbox.mutex);
    mailbox.changed.wait_until(lock, std::min(deadline, SteadyClock::now() + kProbeWait), [&] {
      return mailbox.probed >= probe || mailbox.state == State::kLost;
    });
    state = mailbox.state;
  }
  if (state == State::kOpen) return true;
  session_.reset();  // lost since the last call (or never opened): nothing is sent on it
  return false;
}

std::optional<std::string> Amqp10Sink::Connect(Deadline deadline) {
  const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now());
  const milliseconds timeout =
      std::max(milliseconds{1}, std::min(options_.connect_timeout, remaining));
  auto session = std::make_unique<Session>(options_, endpoint_);
  Mailbox& mailbox = session->mailbox();
  std::string reason;
  {
    std::unique_lock lock(mailbox.mutex);
    mailbox.changed.wait_for(lock, timeout, [&] { return mailbox.state != State::kConnecting; });
    if (mailbox.state == State::kOpen) {
      session_ = std::move(session);
      return std::nullopt;
    }
    reason = mailbox.state == State::kLost
                 ? mailbox.lost_reason
                 : "no answer within " + Millis(timeout) + " (connect_timeout or the deadline)";
  }
  session.reset();
  return "cannot connect to " + endpoint_.Describe() + ": " + reason;
}

void Amqp10Sink::Send(Batch& batch, Deadline /*deadline*/) {
  first_token_ = next_token_;
  next_token_ += batch.size();
  awaited_ = 0;
  Mailbox& mailbox = session_->mailbox();
  std::vector<std::pair<std::string, Outgoing>> chunk;
  chunk.reserve(kQueueChunk);
  const auto flush = [&] {
    if (chunk.empty()) return;
    {
      const std::lock_guard lock(mailbox.mutex);
      for (auto& [address, outgoing] : chunk) {
        mailbox.queued[address].push_back(std::move(outgoing));
      }
    }
    awaited_ += chunk.size();
    chunk.clear();
    session_->Pump();
  };
  for (std::size_t i = 0; i < batch.size(); ++i) {
    std::string address;
    proton::message message;
    if (auto failure = Prepare(batch[i], address, message)) {
      batch.Settle(i, std::move(failure));
      continue;
    }
    chunk.emplace_back(std::move(address),
                       Outgoing{.token = first_token_ + i, .message = std::move(message)});
    if (chunk.size() == kQueueChunk) flush();
  }
  flush();
}

void Amqp10Sink::Apply(Batch& batch, std::vector<Event>& events) {
  for (Event& event : events) {
    if (event.token < first_token_ || event.token - first_token_ >= batch.size()) continue;
    const std::size_t index = event.token - first_token_;
    if (event.sent) {
      batch.MarkSent(index);
      continue;
    }
    if (!batch.settled(index) && awaited_ > 0) --awaited_;
    batch.Settle(index, std::move(event.failure));
  }
  events.clear();
}

void Amqp10Sink::Await(Batch& batch, Deadline deadline) {
  Mailbox& mailbox = session_->mailbox();
  std::vector<Event> events;
  while (awaited_ > 0) {
    bool lost = false;
    std::string lost_reason;
    {
      std::unique_lock lock(mailbox.mutex);
      mailbox.changed.wait_until(
          lock, deadline, [&] { return !mailbox.events.empty() || mailbox.state == State::kLost; });
      events.swap(mailbox.events);
      lost = mailbox.state == State::kLost;
      lost_reason = mailbox.lost_reason;
    }
    Apply(batch, events);
    if (lost) {
      batch.Stop("connection to " + endpoint_.Describe() + " lost: " + lost_reason);
      return;
    }
    if (SteadyClock::now() >= deadline) return;
  }
}

// What is still queued was never sent: taken back (unavailable). What was sent and has no
// verdict is outcome-unknown (the base's doing); its late disposition is ignored.
void Amqp10Sink::Finish(Batch& batch, Deadline /*deadline*/) {
  if (!session_) return;
  Mailbox& mailbox = session_->mailbox();
  std::vector<Event> events;
  bool taken_back = false;
  {
    const std::lock_guard lock(mailbox.mutex);
    for (const auto& [address, messages] : mailbox.queued) taken_back |= !messages.empty();
    mailbox.queued.clear();
    events.swap(mailbox.events);
  }
  Apply(batch, events);
  if (taken_back) {
    batch.Stop(
        "not sent by the deadline (no link credit from the broker, or max_in_flight "
        "deliveries awaiting their disposition)");
  }
  awaited_ = 0;
}

std::optional<Failure> Amqp10Sink::Prepare(const Envelope& envelope, std::string& address,
                                           proton::message& message) const {
  if (envelope.payload.size() > options_.max_message_bytes) {
    return MakeFailure(FailureKind::kPermanent,
                       "payload is " + std::to_string(envelope.payload.size()) +
                           " bytes, over max_message_bytes (" +
                           std::to_string(options_.max_message_bytes) + ")");
  }
  address = address_.Expand(envelope);
  if (address.empty()) {
    return MakeFailure(FailureKind::kPermanent,
                       "the address template '" + address_.text() + "' gives an empty address");
  }
  message.id(proton::message_id(envelope.id.ToString()));
  message.durable(options_.durable);
  // A binary body goes as a data section (not an amqp-value) only when inferred.
  message.inferred(true);
  message.creation_time(proton::timestamp(
      std::chrono::duration_cast<milliseconds>(envelope.created_at.time_since_epoch()).count()));
  if (options_.envelope != EnvelopeStyle::kCloudEvents) {
    message.body(proton::binary(envelope.payload));
    if (!envelope.content_type.empty()) message.content_type(envelope.content_type);
    if (envelope.type && !envelope.type->empty()) message.subject(*envelope.type);
    if (const auto it = envelope.headers.find(kCorrelationIdHeader);
        it != envelope.headers.end() && !it->second.empty()) {
      message.correlation_id(proton::message_id(it->second));
    }
  }
  if (envelope.stream_key) {
    message.group_id(*envelope.stream_key);
    message.message_annotations().put(proton::symbol(std::string{kPartitionKeyAnnotation}),
                                      *envelope.stream_key);
  }
  // group-sequence is an AMQP sequence-no; Proton's C++ API takes it as int32.
  if (envelope.stream_seq && *envelope.stream_seq >= 0 &&
      *envelope.stream_seq <= std::numeric_limits<std::int32_t>::max()) {
    message.group_sequence(static_cast<std::int32_t>(*envelope.stream_seq));
  }

  proton::message::property_map& properties = message.properties();
  if (options_.envelope == EnvelopeStyle::kCloudEvents) {
    return PrepareCloudEvent(envelope, message);
  }
  for (const auto& [name, value] : envelope.headers) {
    // The store refuses these names; skip them anyway so that they can never shadow ours.
    if (wire::IsReservedName(name)) continue;
    properties.put(name, value);
  }
  properties.put(std::string{wire::kEventId}, envelope.EventId().ToString());
  if (options_.envelope == EnvelopeStyle::kFull) {
    properties.put(std::string{wire::kTopicHeader}, envelope.topic);
    if (envelope.stream_key)
      properties.put(std::string{wire::kStreamKeyHeader}, *envelope.stream_key);
    if (envelope.stream_seq) {
      properties.put(std::string{wire::kStreamSeqHeader}, std::int64_t{*envelope.stream_seq});
    }
    if (envelope.stream_prev_seq) {
      properties.put(std::string{wire::kStreamPrevSeqHeader},
                     std::int64_t{*envelope.stream_prev_seq});
    }
    properties.put(std::string{wire::kPartitionHeader}, std::int32_t{envelope.partition});
    properties.put(std::string{wire::kAttemptsHeader}, std::int32_t{envelope.attempts});
    properties.put(std::string{wire::kTargetHeader}, envelope.target);
    if (!envelope.database.empty()) {
      properties.put(std::string{wire::kDatabaseHeader}, envelope.database);
    }
  }
  return std::nullopt;
}

// The AMQP binding of CloudEvents: binary mode, each attribute as an application property
// cloudEvents_<name> (a string, the canonical form: the binding allows it), datacontenttype as the
// content-type property, the payload as the data section; structured mode, the JSON event as the
// data section with content-type application/cloudevents+json. The other properties
// (message-id, creation-time, group-id, ...) as for every envelope; no subject or correlation-id.
std::optional<Failure> Amqp10Sink::PrepareCloudEvent(const Envelope& envelope,
                                                     proton::message& message) const {
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
    message.content_type(std::string{cloudevents::kStructuredContentType});
    message.body(proton::binary(body));
    return std::nullopt;
  }
  std::vector<cloudevents::Attribute> attributes;
  if (auto error = cloudevents_.Attributes(envelope, attributes)) {
    return MakeFailure(FailureKind::kPermanent, std::move(*error));
  }
  proton::message::property_map& properties = message.properties();
  for (const cloudevents::Attribute& attribute : attributes) {
    if (attribute.name == cloudevents::kDataContentType) {
      message.content_type(attribute.value);
    } else {
      properties.put(std::string{kCloudEventsPrefix} + attribute.name, attribute.value);
    }
  }
  message.body(proton::binary(envelope.payload));
  return std::nullopt;
}

}  // namespace

void ValidateOptions(const SinkOptions& options) {
  if (options.envelope == EnvelopeStyle::kCloudEvents) {
    cloudevents::ValidateOptions(options.cloudevents);
  }
  Endpoint endpoint;
  try {
    endpoint = ParseUrl(options.url);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("url", error.what());
  }
  if (options.address.empty()) throw ConfigError("address", "must not be empty");
  if (HasControlCharacter(options.address)) {
    throw ConfigError("address", "must not contain control characters");
  }
  NameTemplate::Parse(options.address, "address");
  std::string_view mechanisms = options.sasl_mechanisms;
  while (!mechanisms.empty()) {
    const std::size_t space = std::min(mechanisms.find(' '), mechanisms.size());
    const std::string_view mechanism = mechanisms.substr(0, space);
    if (!mechanism.empty() && mechanism != "PLAIN" && mechanism != "ANONYMOUS" &&
        mechanism != "EXTERNAL") {
      throw ConfigError("sasl_mechanisms",
                        "'" + Shorten(mechanism) +
                            "' is not one of PLAIN, ANONYMOUS or EXTERNAL (space-separated)");
    }
    if (mechanism == "PLAIN" && endpoint.user.empty()) {
      throw ConfigError("sasl_mechanisms", "PLAIN needs a user and password in the url");
    }
    mechanisms.remove_prefix(std::min(space + 1, mechanisms.size()));
  }
  if (options.max_in_flight == 0) {
    throw ConfigError("max_in_flight", "must be at least 1 (deliveries awaiting a disposition)");
  }
  if (options.connect_timeout <= milliseconds::zero()) {
    throw ConfigError("connect_timeout", "must be positive");
  }
  if (options.idle_timeout < milliseconds::zero() ||
      options.idle_timeout.count() > std::numeric_limits<std::uint32_t>::max()) {
    throw ConfigError("idle_timeout", "must be 0 (never) or a positive duration");
  }
  if (options.max_message_bytes == 0) throw ConfigError("max_message_bytes", "must be at least 1");
  const bool any_tls = !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
                       !options.tls_key_file.empty() || !options.tls_server_name.empty();
  if (any_tls && !endpoint.tls) {
    throw ConfigError("url", "tls_* keys are set but the url is not amqps://");
  }
  for (const auto& [key, path] :
       {std::pair<const char*, const std::string&>{"tls_ca_file", options.tls_ca_file},
        {"tls_cert_file", options.tls_cert_file},
        {"tls_key_file", options.tls_key_file}}) {
    if (!path.empty() && !IsReadableFile(path)) {
      throw ConfigError(key, "'" + Shorten(path) + "' is not a readable file");
    }
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    throw ConfigError(options.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
                      "tls_cert_file and tls_key_file go together");
  }
  if (!options.tls_cert_file.empty() && options.tls_ca_file.empty()) {
    throw ConfigError("tls_ca_file", "is needed with a client certificate (tls_cert_file)");
  }
  if (HasControlCharacter(options.tls_server_name) ||
      options.tls_server_name.find(' ') != std::string::npos) {
    throw ConfigError("tls_server_name", "must be a host name");
  }
}

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  ValidateOptions(options);
  return std::make_unique<Amqp10Sink>(std::move(options));
}

}  // namespace outbox::amqp10
