#include "operations.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <stdexcept>

#include "outbox/core/version.h"
#include "outbox/store/postgres.h"

namespace outbox::outboxd {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kHttpThreads = 4;
constexpr std::size_t kMaxRequestBodyBytes = 1024;  // every endpoint is a GET
constexpr time_t kHttpTimeoutSeconds = 2;           // read and write, per request
constexpr std::size_t kKeepAliveMaxRequests = 20;
constexpr milliseconds kProbeTimeout{1000};

constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

double Seconds(SteadyClock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

std::string SecondsText(SteadyClock::duration duration) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.1f s", Seconds(duration));
  return text.data();
}

}  // namespace

std::optional<std::pair<std::string, int>> AmqpHostPort(std::string_view url) {
  constexpr std::string_view kScheme = "amqp://";
  if (!url.starts_with(kScheme)) return std::nullopt;
  std::string_view rest = url.substr(kScheme.size());
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
    rest = rest.substr(at + 1);
  }
  std::string_view host = rest;
  std::string_view port_text;
  if (rest.starts_with('[')) {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port_text = rest.substr(close + 2);
  } else if (const std::size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
  }
  if (host.empty()) host = "localhost";  // librabbitmq's default as well
  int port = 5672;
  if (!port_text.empty()) {
    const auto [end, error] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (error != std::errc{} || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535) {
      return std::nullopt;
    }
  }
  return std::pair{std::string{host}, port};
}

bool TcpReachable(const std::string& host, int port, milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses{found, &::freeaddrinfo};
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            address->ai_protocol);
    if (fd < 0) continue;
    bool connected = ::connect(fd, address->ai_addr, address->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd waiting{.fd = fd, .events = POLLOUT, .revents = 0};
      if (::poll(&waiting, 1, static_cast<int>(timeout.count())) == 1) {
        int error = 0;
        socklen_t size = sizeof error;
        connected = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
      }
    }
    ::close(fd);
    if (connected) return true;
  }
  return false;
}

bool BearerTokenMatches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (token.empty()) return true;
  if (!authorization.starts_with(kPrefix)) return false;
  const std::string_view given = authorization.substr(kPrefix.size());
  // Always compare token.size() bytes, whatever was sent.
  unsigned difference = given.size() == token.size() ? 0U : 1U;
  for (std::size_t i = 0; i < token.size(); ++i) {
    const char sent = i < given.size() ? given[i] : '\0';
    difference |= static_cast<unsigned>(static_cast<unsigned char>(sent) ^
                                        static_cast<unsigned char>(token[i]));
  }
  return difference == 0;
}

class Operations::Impl {
 public:
  Impl(const Config& config, observe::Registry& registry, const RelayCounters& relay, LogFn log)
      : config_(config),
        registry_(registry),
        relay_(relay),
        log_(std::move(log)),
        ready_(registry.AddGauge("outbox_ready", "1 when /readyz answers 200, else 0.")),
        stats_age_(registry.AddGauge(
            "outbox_stats_age_seconds",
            "Seconds since the message counts were last read from the database (-1: never).")),
        stats_duration_(registry.AddGauge(
            "outbox_stats_duration_seconds",
            "How long the last read of the message counts took in the database.")),
        estimated_(registry.AddGauge(
            "outbox_messages_estimated",
            "1 when a count of outbox_messages was too large to take exactly and is the "
            "database planner's estimate.")),
        oldest_pending_age_(registry.AddGauge("outbox_oldest_pending_age_seconds",
                                              "Age of the oldest pending message (0 when none is "
                                              "pending), on the database's clock.")),
        lease_owners_(registry.AddGauge(
            "outbox_lease_owners", "Relays (lease owners) holding unexpired leases right now.")) {
    registry
        .AddGauge("outbox_info", "Always 1; the labels describe this outboxd.",
                  {{"version", kVersion}, {"instance", config.instance}})
        .Set(1);
    for (const std::string_view status :
         {"pending", "processing", "failed", "abandoned", "published"}) {
      by_status_.push_back(&registry.AddGauge(
          "outbox_messages",
          "Messages in the outbox by status (published: those kept by the retention setting).",
          {{"status", std::string{status}}}));
    }
    for (const SinkConfig& sink : config.sinks) {
      const auto* rabbit = std::get_if<RabbitSinkConfig>(&sink.settings);
      if (rabbit == nullptr) continue;
      const auto address = AmqpHostPort(rabbit->url);
      probes_.push_back(Probe{
          .sink = sink.name,
          .host = address ? address->first : std::string{},
          .port = address ? address->second : 0,
          .gauge = &registry.AddGauge(
              "outbox_sink_reachable",
              "1 when the last TCP connection attempt to the sink's broker succeeded.",
              {{"sink", sink.name}}),
      });
    }
  }

  ~Impl() { Stop(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void Start() {
    stats_thread_ = std::thread([this] { StatsLoop(); });
    if (config_.http.listen.empty()) return;
    SetUpServer();
    const std::string host = config_.http.host();
    const int port = config_.http.port();
    if (!server_.bind_to_port(host, port)) {
      Stop();
      throw std::runtime_error("[http] cannot listen on " + config_.http.listen +
                               " (in use, or not an address of this host)");
    }
    http_thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib's stop() does nothing before the server runs; don't let Stop() race the start.
    for (int i = 0; i < 500 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(milliseconds{10});
    }
    Log(LogLevel::kInfo, "serving /metrics, /api/outbox, /healthz and /readyz on http://" +
                             config_.http.listen +
                             (config_.http.token.empty() ? "" : " (bearer token required)"));
  }

  void BeginDrain() { draining_ = true; }

  void Stop() {
    if (http_thread_.joinable()) {
      server_.stop();
      http_thread_.join();
    }
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    stop_changed_.notify_all();
    if (stats_thread_.joinable()) stats_thread_.join();
  }

  Readiness CheckReadiness() {
    Readiness readiness{.ready = true, .report = {}};
    const auto now = SteadyClock::now();
    const milliseconds max_age = config_.http.ready_max_age;
    const auto line = [&](bool ok, const std::string& text) {
      readiness.ready = readiness.ready && ok;
      readiness.report += text + "\n";
    };
    std::lock_guard lock(mutex_);
    if (draining_) line(false, "relay: draining (shutting down)");
    if (!stats_ok_at_) {
      line(false, "database: not reached yet" + (stats_error_.empty() ? "" : ": " + stats_error_));
    } else if (!stats_error_.empty()) {
      line(false, "database: the last read of the counts failed: " + stats_error_);
    } else if (now - *stats_ok_at_ > max_age) {
      line(false, "database: the counts are " + SecondsText(now - *stats_ok_at_) + " old");
    } else {
      line(true, "database: ok (counts read " + SecondsText(now - *stats_ok_at_) + " ago)");
    }
    for (const Probe& probe : probes_) {
      const std::string name = "sink " + probe.sink + ": ";
      if (!probe.ok_at) {
        line(false, name + "broker not reached yet (TCP " + probe.host + ":" +
                        std::to_string(probe.port) + ")");
      } else if (!probe.last_ok) {
        line(false, name + "broker refuses TCP connections on " + probe.host + ":" +
                        std::to_string(probe.port));
      } else if (now - *probe.ok_at > max_age) {
        line(false, name + "broker last reached " + SecondsText(now - *probe.ok_at) + " ago");
      } else {
        line(true, name + "broker accepts TCP connections");
      }
    }
    if (relay_.broker_unavailable) {
      line(false, "relay: the last batch found the broker unavailable");
    }
    ready_.Set(readiness.ready ? 1.0 : 0.0);
    stats_age_.Set(stats_ok_at_ ? Seconds(now - *stats_ok_at_) : -1.0);
    return readiness;
  }

 private:
  struct Probe {
    std::string sink;
    std::string host;  // empty: the URL has no usable host (then never ready)
    int port = 0;
    observe::Gauge* gauge = nullptr;
    std::optional<SteadyClock::time_point> ok_at;  // guarded by mutex_
    bool last_ok = false;                          // guarded by mutex_
  };

  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  void SetUpServer() {
    server_.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
    // httplib's default also sets SO_REUSEPORT, which would let a second outboxd share the port
    // (and answer half the scrapes) instead of failing to start.
    server_.set_socket_options([](socket_t socket) {
      const int yes = 1;
      ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    server_.set_read_timeout(kHttpTimeoutSeconds, 0);
    server_.set_write_timeout(kHttpTimeoutSeconds, 0);
    server_.set_keep_alive_timeout(kHttpTimeoutSeconds);
    server_.set_keep_alive_max_count(kKeepAliveMaxRequests);
    server_.set_payload_max_length(kMaxRequestBodyBytes);
    server_.set_pre_routing_handler([this](const httplib::Request& request,
                                           httplib::Response& response) {
      if (request.path == "/healthz" || config_.http.token.empty()) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      if (BearerTokenMatches(request.get_header_value("Authorization"), config_.http.token)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      response.status = 401;
      response.set_header("WWW-Authenticate", "Bearer");
      response.set_content("401 unauthorized: send Authorization: Bearer <token>\n", "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    });
    server_.set_error_handler([](const httplib::Request&, httplib::Response& response) {
      if (response.body.empty()) {
        response.set_content(std::to_string(response.status) +
                                 " (paths: /metrics, /api/outbox, /healthz, /readyz)\n",
                             "text/plain");
      }
    });
    server_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
          response.status = 500;
          response.set_content("500 internal error\n", "text/plain");
        });
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("ok\n", "text/plain");
    });
    server_.Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
      const Readiness readiness = CheckReadiness();
      response.status = readiness.ready ? 200 : 503;
      response.set_content(readiness.report, "text/plain");
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
      CheckReadiness();  // refreshes outbox_ready and outbox_stats_age_seconds
      response.set_content(registry_.RenderPrometheus(), std::string{kPrometheusContentType});
    });
    server_.Get("/api/outbox", [this](const httplib::Request&, httplib::Response& response) {
      CheckReadiness();
      response.set_content(registry_.RenderJson(), "application/json");
    });
  }

  // Every stats_interval: the counts on a connection of our own, then the broker probes.
  void StatsLoop() {
    std::unique_ptr<Store> store;
    for (;;) {
      ReadStats(store);
      ProbeBrokers();
      CheckReadiness();
      std::unique_lock lock(mutex_);
      if (stop_changed_.wait_for(lock, config_.http.stats_interval, [this] { return stop_; })) {
        return;
      }
    }
  }

  void ReadStats(std::unique_ptr<Store>& store) {
    std::string error;
    const auto started = SteadyClock::now();
    try {
      if (!store) {
        postgres::StoreOptions options;
        options.conninfo = config_.database_url;
        options.schema = config_.schema;
        options.retry = config_.retry;
        options.retention = config_.retention;
        store = postgres::OpenStore(options);
      }
      const StoreStats stats = store->Stats();
      stats_duration_.Set(Seconds(SteadyClock::now() - started));
      const std::array<std::int64_t, 5> counts{stats.pending, stats.processing, stats.failed,
                                               stats.abandoned, stats.published};
      for (std::size_t i = 0; i < counts.size(); ++i) {
        by_status_[i]->Set(static_cast<double>(counts[i]));
      }
      estimated_.Set(stats.counts_estimated ? 1.0 : 0.0);
      oldest_pending_age_.Set(stats.oldest_pending_age
                                  ? std::chrono::duration<double>(*stats.oldest_pending_age).count()
                                  : 0.0);
      lease_owners_.Set(static_cast<double>(stats.active_leases));
    } catch (const std::exception& failure) {
      // Error texts of the store name the database without its password; mask anyway.
      error = MaskPassword(failure.what());
    }
    bool changed = false;
    {
      std::lock_guard lock(mutex_);
      changed = error != stats_error_;
      stats_error_ = error;
      if (error.empty()) stats_ok_at_ = SteadyClock::now();
    }
    if (!changed) return;
    if (error.empty()) {
      Log(LogLevel::kInfo, "reading the outbox counts works again");
    } else {
      registry_.RecordError("database", "reading the outbox counts failed: " + error);
      Log(LogLevel::kWarn, "reading the outbox counts failed (readiness fails): " + error);
    }
  }

  void ProbeBrokers() {
    for (Probe& probe : probes_) {
      const bool ok = !probe.host.empty() && TcpReachable(probe.host, probe.port, kProbeTimeout);
      probe.gauge->Set(ok ? 1.0 : 0.0);
      bool changed = false;
      {
        std::lock_guard lock(mutex_);
        changed = probe.ok_at.has_value() ? ok != probe.last_ok : !ok;
        probe.last_ok = ok;
        if (ok) probe.ok_at = SteadyClock::now();
      }
      if (!changed) continue;
      const std::string where = probe.host + ":" + std::to_string(probe.port);
      if (ok) {
        Log(LogLevel::kInfo, "sink " + probe.sink + ": the broker at " + where + " is reachable");
      } else {
        registry_.RecordError("unavailable", "sink " + probe.sink + ": the broker at " + where +
                                                 " refuses TCP connections");
        Log(LogLevel::kWarn, "sink " + probe.sink + ": the broker at " + where +
                                 " refuses TCP connections (readiness fails)");
      }
    }
  }

  const Config& config_;
  observe::Registry& registry_;
  const RelayCounters& relay_;
  LogFn log_;
  observe::Gauge& ready_;
  observe::Gauge& stats_age_;
  observe::Gauge& stats_duration_;
  observe::Gauge& estimated_;
  observe::Gauge& oldest_pending_age_;
  observe::Gauge& lease_owners_;
  std::vector<observe::Gauge*> by_status_;
  std::vector<Probe> probes_;
  std::atomic<bool> draining_{false};

  httplib::Server server_;
  std::thread http_thread_;
  std::thread stats_thread_;
  std::mutex mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;                                   // guarded by mutex_
  std::optional<SteadyClock::time_point> stats_ok_at_;  // guarded by mutex_
  std::string stats_error_;                             // guarded by mutex_
};

Operations::Operations(const Config& config, observe::Registry& registry,
                       const RelayCounters& relay, LogFn log)
    : impl_(std::make_unique<Impl>(config, registry, relay, std::move(log))) {}

Operations::~Operations() = default;

void Operations::Start() { impl_->Start(); }
void Operations::BeginDrain() { impl_->BeginDrain(); }
void Operations::Stop() { impl_->Stop(); }
Operations::Readiness Operations::CheckReadiness() { return impl_->CheckReadiness(); }

}  // namespace outbox::outboxd
