#include "operations.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "duration.h"
#include "message_json.h"
#include "outbox/core/log_text.h"
#include "outbox/core/secrets.h"
#include "outbox/core/utf8.h"
#include "outbox/core/version.h"
#include "outbox/observe/http_server.h"
#include "outbox/observe/status.h"
#include "outbox/store/admin.h"
#include "ui_assets.h"

namespace outbox::outboxd {
namespace {

namespace http = observe::http;

using std::chrono::milliseconds;

// The largest body (POST /api/messages/replay and /abandon); larger ones get 413.
constexpr std::size_t kMaxRequestBodyBytes = 64 * 1024;
// The most ids one replay or abandon request may name, and the most ids its reply lists.
constexpr std::size_t kMaxIdsPerRequest = 1000;
// Each statement of the admin API, lock waits included; then 503 (the database is busy).
constexpr milliseconds kAdminStatementTimeout{30000};
// Per request, not per read: the whole header, the whole body, the whole response.
constexpr milliseconds kHeaderTimeout{5000};
constexpr milliseconds kBodyTimeout{10000};
constexpr milliseconds kWriteTimeout{10000};

constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// The dashboard (/ui): the page and its files come from this origin only, run no inline script
// or style, and cannot be framed; data are rendered as text by app.js, never as markup.
constexpr std::string_view kUiContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

// Whether `path` is the dashboard's: "/ui", "/ui/" or a file under it.
bool IsUiPath(std::string_view path) { return path == "/ui" || path.starts_with("/ui/"); }

// ---- the admin API's JSON (the same shapes as outboxctl list/show --json) ----

using Json = nlohmann::ordered_json;  // keys in the order written: id first

using http::Response;

Response JsonReply(int status, const Json& body) {
  Response response;
  response.status = status;
  // Text from the database is UTF-8; replace rather than throw if it ever is not.
  response.body = body.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  response.content_type = "application/json";
  return response;
}

Response ErrorReply(int status, const std::string& message) {
  return JsonReply(status, Json{{"error", RedactKnownSecrets(message)}});
}

// The longest value of a parameter or field (a topic, stream key or target: what the stores
// accept on enqueue, so no stored message has a longer one; the other values are shorter still).
constexpr std::size_t kMaxValueBytes = 255;
// The longest abandon reason (it is kept in last_error).
constexpr std::size_t kMaxReasonBytes = 4096;
// The most bytes of a refused name or value an error quotes.
constexpr std::size_t kMaxQuotedBytes = 64;

// `text` in quotes for an error message: control characters and invalid UTF-8 escaped, at most
// kMaxQuotedBytes of it (outbox/core/log_text.h).
std::string Quoted(std::string_view text) {
  return "'" + SanitizeForLog(text, kMaxQuotedBytes) + "'";
}

// Refuses, with 400 and our own words, a value the database would refuse to compare (PostgreSQL
// answers invalid UTF-8 and NUL bytes with SQLSTATE 22021) or that no message can have: at most
// kMaxValueBytes of valid UTF-8 without control characters (as the stores require of a topic,
// stream key or target on enqueue; no id, status, duration or number has one either), and not
// empty when it is a topic, stream key or target (`text`).
void CheckValue(std::string_view name, std::string_view value, bool text) {
  if (value.size() > kMaxValueBytes) {
    throw std::invalid_argument(std::string{name} + " is " + std::to_string(value.size()) +
                                " bytes, over the limit of " + std::to_string(kMaxValueBytes));
  }
  if (!IsValidUtf8(value)) throw std::invalid_argument(std::string{name} + " is not valid UTF-8");
  if (text && value.empty()) throw std::invalid_argument(std::string{name} + " must not be empty");
  const auto control = std::find_if(value.begin(), value.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == '\x7f';
  });
  if (control != value.end()) {
    std::array<char, 8> code{};
    std::snprintf(code.data(), code.size(), "0x%02x", static_cast<unsigned char>(*control));
    throw std::invalid_argument(std::string{name} + " contains a control character (" +
                                code.data() + ")");
  }
}

// Sets the criterion `key` of `filter`; false when `key` is not a filter's. Throws
// std::invalid_argument for a bad value.
bool SetFilter(MessageFilter& filter, std::string_view key, const std::string& value) {
  const bool text = key == "topic" || key == "stream" || key == "target";
  if (text || key == "status" || key == "event" || key == "older_than") {
    CheckValue(key, value, text);
  }
  if (key == "status") {
    filter.status = ParseMessageStatus(value);
  } else if (key == "topic") {
    filter.topic = value;
  } else if (key == "stream") {
    filter.stream_key = value;
  } else if (key == "target") {
    filter.target = value;
  } else if (key == "event") {
    filter.event_id = apps::ParseMessageId(value);
  } else if (key == "older_than") {
    filter.older_than = apps::ParseDuration(value);
  } else if (key == "held") {
    // Only abandoned messages that hold their stream (on_abandon = "hold").
    if (value != "true" && value != "false") {
      throw std::invalid_argument("held must be true or false, got " + Quoted(value));
    }
    filter.held = value == "true";
  } else {
    return false;
  }
  return true;
}

struct ListQuery {
  MessageFilter filter;
  int limit = 50;
  std::optional<MessageId> after;
};

// GET /api/messages?status=&topic=&stream=&target=&event=&older_than=&held=&limit=&after=
ListQuery ParseListQuery(const http::Request& request) {
  ListQuery query;
  for (const auto& [key, value] : request.query) {
    if (request.QueryCount(key) > 1) {
      throw std::invalid_argument("parameter " + Quoted(key) + " is given more than once");
    }
    if (SetFilter(query.filter, key, value)) continue;
    if (key == "limit" || key == "after") CheckValue(key, value, /*text=*/false);
    if (key == "limit") {
      const auto [end, error] =
          std::from_chars(value.data(), value.data() + value.size(), query.limit);
      if (error != std::errc{} || end != value.data() + value.size() || query.limit < 1 ||
          query.limit > Admin::kMaxListLimit) {
        throw std::invalid_argument("limit must be a number from 1 to " +
                                    std::to_string(Admin::kMaxListLimit));
      }
    } else if (key == "after") {
      query.after = apps::ParseMessageId(value);
    } else if (key != "database") {  // which database: WithAdmin reads it
      throw std::invalid_argument("unknown parameter " + Quoted(key) +
                                  " (known: status, topic, stream, target, event, older_than, "
                                  "held, limit, after, database)");
    }
  }
  return query;
}

struct ChangeRequest {
  MessageFilter filter;
  bool dry_run = false;
  std::string reason;
};

// The body of POST /api/messages/replay, /skip and /abandon: {"ids": [...]} and/or the criteria
// "status", "topic", "stream", "target", "event", "older_than", "held"; "dry_run": bool;
// "reason": text.
ChangeRequest ParseChangeRequest(const std::string& body) {
  const Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) throw std::invalid_argument("the body is not valid JSON");
  if (!json.is_object()) throw std::invalid_argument("the body must be a JSON object");
  ChangeRequest change;
  for (const auto& [key, value] : json.items()) {
    if (key == "ids") {
      if (!value.is_array()) throw std::invalid_argument("ids must be an array of message ids");
      if (value.size() > kMaxIdsPerRequest) {
        throw std::invalid_argument("at most " + std::to_string(kMaxIdsPerRequest) +
                                    " ids per request");
      }
      std::vector<MessageId> ids;
      for (const Json& id : value) {
        if (!id.is_string()) throw std::invalid_argument("ids must be an array of message ids");
        CheckValue("an id", id.get_ref<const std::string&>(), /*text=*/false);
        ids.push_back(apps::ParseMessageId(id.get<std::string>()));
      }
      change.filter.ids = std::move(ids);
    } else if (key == "dry_run") {
      if (!value.is_boolean()) throw std::invalid_argument("dry_run must be true or false");
      change.dry_run = value.get<bool>();
    } else if (key == "held") {
      if (!value.is_boolean()) throw std::invalid_argument("held must be true or false");
      change.filter.held = value.get<bool>();
    } else if (key == "reason") {
      if (!value.is_string()) throw std::invalid_argument("reason must be a string");
      change.reason = value.get<std::string>();
      // JSON text is valid UTF-8, but "\u0000" is a NUL byte, which no database text holds.
      if (change.reason.size() > kMaxReasonBytes) {
        throw std::invalid_argument("reason is " + std::to_string(change.reason.size()) +
                                    " bytes, over the limit of " + std::to_string(kMaxReasonBytes));
      }
      if (change.reason.find('\0') != std::string::npos) {
        throw std::invalid_argument("reason contains a NUL byte");
      }
    } else if (key == "older_than" && value.is_number_unsigned()) {
      change.filter.older_than =
          apps::ParseDuration(std::to_string(value.get<std::uint64_t>()) + "s");
    } else if (value.is_string()) {
      if (!SetFilter(change.filter, key, value.get<std::string>())) {
        throw std::invalid_argument("unknown field " + Quoted(key) +
                                    " (known: ids, status, topic, stream, target, event, "
                                    "older_than, held, dry_run, reason)");
      }
    } else {
      throw std::invalid_argument("field " + Quoted(key) + " must be a string");
    }
  }
  return change;
}

}  // namespace

std::optional<std::string> ExposureWarning(const HttpConfig& http) {
  if (!http.token.empty() || !http.listens_beyond_loopback()) return std::nullopt;
  return "[http] listens on " + http.listen +
         ", beyond loopback, without a token (allow_unauthenticated = true): anyone who "
         "reaches the port can read /metrics and /api/outbox (topics, ids, recent errors)";
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

namespace {

// The sinks whose broker readiness probes: those whose settings name an endpoint.
std::vector<observe::ProbedSink> ProbedSinks(const Config& config) {
  std::vector<observe::ProbedSink> sinks;
  for (const SinkConfig& sink : config.sinks) {
    if (auto endpoint = sink.settings->Endpoint()) {
      sinks.push_back({.name = sink.name, .endpoint = std::move(*endpoint)});
    }
  }
  return sinks;
}

observe::StatusOptions StatusOptionsOf(const Config& config) {
  return {.instance = config.relay.instance,
          .stats_interval = config.http.stats_interval,
          .ready_max_age = config.http.ready_max_age,
          .serving = !config.http.listen.empty(),
          .retry = config.retry,
          .retention = config.retention};
}

}  // namespace

class Operations::Impl {
 public:
  Impl(const Config& config, observe::Registry& registry, RelayTotalsFn relay, LogFn log,
       PausedTargetsFn paused_targets)
      : config_(config),
        registry_(registry),
        log_(log),
        status_(StatusOptionsOf(config), config.database, ProbedSinks(config), registry, log,
                std::move(relay), [paused = std::move(paused_targets)] {
                  std::vector<observe::PausedTarget> targets;
                  if (!paused) return targets;
                  for (Relay::PausedTarget& target : paused()) {
                    targets.push_back(
                        {.name = std::move(target.name), .reason = std::move(target.reason)});
                  }
                  return targets;
                }) {}

  ~Impl() { Stop(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void SetWalCheck(WalCheckFn check) { status_.SetWalCheck(std::move(check)); }

  void SetManyDatabases(ManyDatabases many) {
    many_ = std::move(many);
    status_.SetExtraCheck([this] { return DatabaseLines(); });
  }

  // /readyz with many databases: one line for all, one per database not relayed (not failing:
  // one database down of 500 is not the process's to answer for), and the discovery's problem.
  // Not ready only when databases are named and none is relayed.
  std::vector<observe::StatusService::CheckLine> DatabaseLines() const {
    std::vector<observe::StatusService::CheckLine> lines;
    const std::vector<TenantRelays::DatabaseState> states =
        many_.states ? many_.states() : std::vector<TenantRelays::DatabaseState>{};
    std::size_t relaying = 0;
    for (const auto& state : states) relaying += state.relaying ? 1 : 0;
    lines.push_back({.ok = states.empty() || relaying > 0,
                     .text = "databases: " + std::to_string(relaying) + " of " +
                             std::to_string(states.size()) + " relayed"});
    for (const auto& state : states) {
      if (state.relaying) continue;
      lines.push_back(
          {.ok = true,
           .text = "database " + state.name + ": not relayed: " + MaskPassword(state.problem)});
    }
    if (many_.discovery_problem) {
      if (auto problem = many_.discovery_problem()) {
        lines.push_back({.ok = true, .text = "discovery: " + MaskPassword(*problem)});
      }
    }
    return lines;
  }

  void Start() {
    status_.Start();
    if (config_.http.listen.empty()) return;
    server_ = std::make_unique<http::Server>(ServerOptions(), Routes(), log_);
    try {
      server_->Start();
    } catch (const std::exception& failure) {
      Stop();
      // The server names the address, the OS's reason and the step ("Address already in use
      // (bind)", "Cannot assign requested address (bind)").
      throw std::runtime_error(std::string{"[http] listen: "} + failure.what());
    }
    Log(LogLevel::kInfo,
        "serving /metrics, /api/outbox, /api/messages, /ui, /healthz and /readyz on http://" +
            config_.http.listen +
            (config_.http.token.empty() ? " (no token: the /api/messages routes answer 403)"
                                        : " (bearer token required)"));
    if (auto warning = ExposureWarning(config_.http)) Log(LogLevel::kWarn, *warning);
  }

  void BeginDrain() { status_.BeginDrain(); }

  std::optional<Response> AnswerRaw(std::string_view bytes) {
    if (raw_routes_.empty()) raw_routes_ = Routes();
    return http::AnswerRawRequest(bytes, ServerOptions(), raw_routes_);
  }

  void Stop() {
    if (server_) server_->Stop();
    status_.Stop();
  }

  Readiness CheckReadiness() { return status_.CheckReadiness(); }

 private:
  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  http::ServerOptions ServerOptions() {
    http::ServerOptions options;
    options.host = config_.http.host();
    options.port = config_.http.port();
    options.header_timeout = kHeaderTimeout;
    options.body_timeout = kBodyTimeout;
    options.write_timeout = kWriteTimeout;
    options.max_body_bytes = kMaxRequestBodyBytes;
    options.not_found_text =
        "404 (paths: /ui, /metrics, /api/outbox, /api/messages, /healthz, /readyz)\n";
    options.guard = [this](const http::Request& request) -> std::optional<Response> {
      // The dashboard's files hold no data (the page asks for the token and sends it with every
      // request of its own), so a browser can load them without one.
      if (request.path == "/healthz" || IsUiPath(request.path)) return std::nullopt;
      if (config_.http.token.empty()) {
        // Messages (payloads included) are never shown, and never changed, without a token.
        if (!request.path.starts_with("/api/messages")) return std::nullopt;
        return ErrorReply(403,
                          "the /api/messages routes need a token: set [http] token or "
                          "OUTBOX_HTTP_TOKEN");
      }
      if (BearerTokenMatches(request.Header("Authorization"), config_.http.token)) {
        return std::nullopt;
      }
      Response refused =
          Response::Text(401, "401 unauthorized: send Authorization: Bearer <token>\n");
      refused.headers.emplace_back("WWW-Authenticate", "Bearer");
      return refused;
    };
    return options;
  }

  // One of the dashboard's files, with the headers that keep it to itself: a strict
  // Content-Security-Policy, nosniff, no framing; revalidated by its strong ETag (304 when the
  // browser has it already).
  static Response UiFile(const http::Request& request, std::string_view name) {
    const auto add_headers = [](Response& response) {
      response.headers.emplace_back("Content-Security-Policy",
                                    std::string{kUiContentSecurityPolicy});
      response.headers.emplace_back("X-Content-Type-Options", "nosniff");
      response.headers.emplace_back("X-Frame-Options", "DENY");
      response.headers.emplace_back("Referrer-Policy", "no-referrer");
    };
    for (const UiAsset& asset : UiAssets()) {
      if (asset.name != name) continue;
      Response response;
      add_headers(response);
      response.headers.emplace_back("ETag", std::string{asset.etag});
      response.headers.emplace_back("Cache-Control", "no-cache");
      if (request.Header("If-None-Match") == asset.etag) {
        response.status = 304;
        response.body.clear();
        return response;
      }
      response.content_type = std::string{asset.content_type};
      response.body = std::string{asset.body};
      return response;
    }
    Response missing = Response::Text(404, "404 not found\n");
    add_headers(missing);
    return missing;
  }

  // GET /api/outbox/relay: this relay, as the dashboard shows it.
  // With many databases, "databases": each one's name, whether it is relayed (and why not), and
  // its counts; the admin routes then need ?database=NAME.
  Json RelayJson() const {
    const observe::RelayTotals totals = status_.Totals();
    Json relay = Json{{"instance", config_.relay.instance},
                      {"version", kVersion},
                      {"database", config_.database_type},
                      {"admin_api", !config_.http.token.empty()},
                      {"partitions_owned", totals.partitions_owned},
                      {"takeovers", totals.takeovers},
                      {"published", totals.published},
                      {"failed", totals.failed},
                      {"unconfirmed", totals.unconfirmed}};
    if (config_.many_databases()) {
      Json databases = Json::array();
      if (many_.states) {
        for (const auto& state : many_.states()) {
          databases.push_back(Json{{"name", state.name},
                                   {"relaying", state.relaying},
                                   {"problem", MaskPassword(state.problem)},
                                   {"published", state.published},
                                   {"failed", state.failed}});
        }
      }
      relay["databases"] = std::move(databases);
    }
    return relay;
  }

  static Json RelaysJson(const RelayOverview& overview) {
    Json relays = Json::array();
    for (const RelayStatus& relay : overview.relays) {
      relays.push_back(
          Json{{"owner", relay.owner},
               {"started_at", apps::FormatTime(relay.started_at)},
               {"heartbeat_at", apps::FormatTime(relay.heartbeat_at)},
               {"expires_at", apps::FormatTime(relay.expires_at)},
               {"partitions", relay.partitions},
               {"next_lease_expiry", relay.next_lease_expiry
                                         ? Json(apps::FormatTime(*relay.next_lease_expiry))
                                         : Json(nullptr)}});
    }
    return Json{{"partition_count", overview.partition_count},
                {"unowned_partitions", overview.unowned_partitions},
                {"lease_acquisitions", overview.lease_acquisitions},
                {"database_now", apps::FormatTime(overview.database_now)},
                {"relays", std::move(relays)}};
  }

  // Probes and scrapes run on the I/O thread (they read caches in memory); the admin API, which
  // waits for the database, on the worker pool.
  std::vector<http::Route> Routes() {
    using http::Lane;
    using http::Request;
    std::vector<http::Route> routes;
    const auto add = [&](std::string method, std::string path, Lane lane, http::Handler handler,
                         bool prefix = false) {
      routes.push_back(http::Route{.method = std::move(method),
                                   .path = std::move(path),
                                   .prefix = prefix,
                                   .lane = lane,
                                   .handler = std::move(handler)});
    };
    add("GET", "/healthz", Lane::kInline,
        [](const Request&) { return Response::Text(200, "ok\n"); });
    add("GET", "/readyz", Lane::kInline, [this](const Request&) {
      const Readiness readiness = status_.CheckReadiness();
      return Response::Text(readiness.ready ? 200 : 503, readiness.report);
    });
    add("GET", "/metrics", Lane::kInline, [this](const Request&) {
      (void)status_.CheckReadiness();  // refreshes outbox_ready and outbox_stats_age_seconds
      Response response = Response::Text(200, registry_.RenderPrometheus());
      response.content_type = std::string{kPrometheusContentType};
      return response;
    });
    add("GET", "/api/outbox", Lane::kInline, [this](const Request&) {
      (void)status_.CheckReadiness();
      Response response = Response::Text(200, registry_.RenderJson());
      response.content_type = "application/json";
      return response;
    });
    // For the dashboard: the relay's counters a second apart, and what this relay is.
    add("GET", "/api/outbox/rates", Lane::kInline, [this](const Request&) {
      Response response = Response::Text(200, status_.RatesJson() + "\n");
      response.content_type = "application/json";
      return response;
    });
    add("GET", "/api/outbox/relay", Lane::kInline,
        [this](const Request&) { return JsonReply(200, RelayJson()); });
    // Every live relay of the database with the partitions it holds (the store's Admin::Relays).
    add("GET", "/api/outbox/relays", Lane::kWorker, [this](const Request& request) {
      return WithAdmin(request,
                       [&](Admin& admin) { return JsonReply(200, RelaysJson(admin.Relays())); });
    });
    // The dashboard: "/ui" and "/ui/" are its page, "/ui/<file>" its files (compiled in).
    add("GET", "/ui", Lane::kInline,
        [](const Request& request) { return UiFile(request, "index.html"); });
    add("GET", "/ui/", Lane::kInline,
        [](const Request& request) { return UiFile(request, "index.html"); });
    add(
        "GET", "/ui/", Lane::kInline,
        [](const Request& request) {
          return UiFile(request, std::string_view{request.path}.substr(4));
        },
        /*prefix=*/true);
    // /api/messages: list, show, replay, abandon, over the store's Admin on a connection of its
    // own.
    add("GET", "/api/messages", Lane::kWorker, [this](const Request& request) {
      return BadInputIs400([&] {
        const ListQuery query = ParseListQuery(request);
        return WithAdmin(request, [&](Admin& admin) {
          const MessagePage page = admin.List(query.filter, query.limit, query.after);
          Json messages = Json::array();
          for (const auto& message : page.messages) messages.push_back(apps::SummaryJson(message));
          return JsonReply(
              200, Json{{"messages", std::move(messages)},
                        {"more", page.more},
                        {"next_after",
                         page.more ? Json(page.messages.back().id.ToString()) : Json(nullptr)}});
        });
      });
    });
    add(
        "GET", "/api/messages/", Lane::kWorker,
        [this](const Request& request) {
          return BadInputIs400([&] {
            const std::string_view text =
                std::string_view{request.path}.substr(std::string_view{"/api/messages/"}.size());
            CheckValue("the message id", text, /*text=*/false);
            const MessageId id = apps::ParseMessageId(text);
            return WithAdmin(request, [&](Admin& admin) {
              const auto found = admin.Show(id);
              if (!found) return ErrorReply(404, "message " + id.ToString() + " not found");
              return JsonReply(200, apps::DetailJson(*found));
            });
          });
        },
        /*prefix=*/true);
    add("POST", "/api/messages/replay", Lane::kWorker,
        [this](const Request& request) { return Change(request, ChangeKind::kReplay); });
    add("POST", "/api/messages/skip", Lane::kWorker,
        [this](const Request& request) { return Change(request, ChangeKind::kSkip); });
    add("POST", "/api/messages/abandon", Lane::kWorker,
        [this](const Request& request) { return Change(request, ChangeKind::kAbandon); });
    return routes;
  }

  enum class ChangeKind : std::uint8_t { kReplay, kSkip, kAbandon };

  // The body is read as JSON whatever its Content-Type says: `curl -d` labels it a form.
  Response Change(const http::Request& request, ChangeKind kind) {
    return BadInputIs400([&] {
      ChangeRequest change = ParseChangeRequest(request.body);
      if (kind == ChangeKind::kAbandon && change.reason.empty()) {
        throw std::invalid_argument("abandon needs a \"reason\" (it is kept in last_error)");
      }
      if (kind == ChangeKind::kSkip) {
        // As for replay and abandon, every message is not a selection: "held": true says it.
        if (change.filter.MatchesEverything()) {
          throw std::invalid_argument(
              "skip: refusing to act on every message; select by ids, a filter, or \"held\": "
              "true (every message that holds its stream)");
        }
        change.filter.held = true;  // only held messages are skipped
      }
      return WithAdmin(request, [&](Admin& admin) {
        const ChangeResult result =
            kind == ChangeKind::kReplay ? admin.Replay(change.filter, change.dry_run)
            : kind == ChangeKind::kSkip
                ? admin.Skip(change.filter, change.dry_run)
                : admin.Abandon(change.filter, change.reason, change.dry_run);
        Json ids = Json::array();
        for (std::size_t i = 0; i < result.ids.size() && i < kMaxIdsPerRequest; ++i) {
          ids.push_back(result.ids[i].ToString());
        }
        const std::string verb = kind == ChangeKind::kReplay ? "replay"
                                 : kind == ChangeKind::kSkip ? "skip"
                                                             : "abandon";
        const std::string what =
            (change.dry_run ? "would " + verb
                            : (kind == ChangeKind::kSkip ? "skipped" : verb + "ed")) +
            " " + std::to_string(result.count) + " messages";
        Log(change.dry_run ? LogLevel::kInfo : LogLevel::kWarn,
            "admin API (" + request.remote_address + "): " + what +
                (change.reason.empty() ? "" : "; reason: " + change.reason) +
                (result.ids.empty() ? "" : "; first " + result.ids.front().ToString()));
        return JsonReply(200, Json{{"dry_run", change.dry_run},
                                   {"count", result.count},
                                   {"ids", std::move(ids)},
                                   {"ids_truncated", result.ids.size() > kMaxIdsPerRequest}});
      });
    });
  }

  // `answer()`, or 400 with its message when it refuses the request's input
  // (std::invalid_argument): the request is checked before it needs the database.
  template <typename Answer>
  static Response BadInputIs400(Answer&& answer) {
    try {
      return answer();
    } catch (const std::invalid_argument& bad) {
      return ErrorReply(400, bad.what());
    }
  }

  // Runs `work` on the admin connection (opened on first use, reopened after a failure) and
  // maps its errors: bad input 400, database unreachable, busy or not migrated 503, else 500 (the
  // database's error in the log, not in the reply). One request at a time: another one meanwhile
  // gets 503 at once rather than holding a worker while it waits.
  // With many databases, the request's `database` parameter names the one (400 without it, 404
  // for a name not served); the connection is kept for the next request to the same database.
  template <typename Work>
  Response WithAdmin(const http::Request& request, Work&& work) {
    std::shared_ptr<const StoreSettings> store = config_.database;
    std::string name;
    if (config_.many_databases()) {
      if (request.QueryCount("database") != 1) {
        return ErrorReply(400, "outboxd relays many databases: name one with ?database=NAME");
      }
      for (const auto& [key, value] : request.query) {
        if (key == "database") name = value;
      }
      store = many_.find ? many_.find(name) : nullptr;
      if (!store) return ErrorReply(404, "no database named " + Quoted(name) + " is relayed here");
    }
    std::unique_lock lock(admin_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      return ErrorReply(503, "busy: another admin request is still running; try again");
    }
    try {
      if (admin_ && admin_database_ != name) admin_.reset();
      if (!admin_) {
        try {
          admin_ = store->OpenAdmin(kAdminStatementTimeout);
        } catch (const StoreError& failure) {
          // The database's state, not the request's fault nor a failure of outboxd's: not reached,
          // or its outbox schema not migrated (or older than this build). Its reason, masked,
          // tells the operator what to do (run outboxctl migrate); 503: try again afterwards.
          const std::string reason = MaskPassword(failure.what());
          Log(LogLevel::kWarn, "admin API: " + reason);
          return ErrorReply(503, reason);
        }
        admin_database_ = name;
      }
      return work(*admin_);
    } catch (const std::invalid_argument& bad) {
      return ErrorReply(400, bad.what());
    } catch (const StoreError& failure) {
      admin_.reset();  // a fresh connection next time
      const bool unavailable = failure.kind() == FailureKind::kUnavailable;
      // Unreachable or busy: the reason, masked, helps whoever retries. Anything else is not
      // the request's fault (bad input is refused before it reaches the database): the database's
      // own text goes to the log, not into the reply.
      if (unavailable) return ErrorReply(503, MaskPassword(failure.what()));
      Log(LogLevel::kError, "admin API: " + MaskPassword(failure.what()));
      return ErrorReply(500, "the database failed the request (outboxd's log has its error)");
    }
  }

  const Config& config_;
  observe::Registry& registry_;
  LogFn log_;
  ManyDatabases many_;  // set before Start
  observe::StatusService status_;

  // The admin API's Admin (and connection), opened on first use; one request at a time.
  std::mutex admin_mutex_;
  std::unique_ptr<Admin> admin_;  // guarded by admin_mutex_
  std::string admin_database_;    // whose admin_ is (many databases); guarded likewise

  std::unique_ptr<http::Server> server_;
  std::vector<http::Route> raw_routes_;  // AnswerRaw's, built on first use
};

Operations::Operations(const Config& config, observe::Registry& registry, RelayTotalsFn relay,
                       LogFn log, PausedTargetsFn paused_targets)
    : impl_(std::make_unique<Impl>(config, registry, std::move(relay), std::move(log),
                                   std::move(paused_targets))) {}

Operations::RelayTotalsFn Operations::TotalsOf(const RelayCounters& relay) {
  return [&relay] {
    return observe::RelayTotals{
        .published = relay.published.load(),
        .failed = relay.failed.load(),
        .unconfirmed = relay.unconfirmed.load(),
        .takeovers = relay.takeovers.load(),
        .partitions_owned = relay.partitions_owned.load(),
        .broker_unavailable = relay.broker_unavailable.load(),
    };
  };
}

void Operations::SetManyDatabases(ManyDatabases many) { impl_->SetManyDatabases(std::move(many)); }

Operations::~Operations() = default;

void Operations::SetWalCheck(WalCheckFn check) { impl_->SetWalCheck(std::move(check)); }
void Operations::Start() { impl_->Start(); }
void Operations::BeginDrain() { impl_->BeginDrain(); }
void Operations::Stop() { impl_->Stop(); }
Operations::Readiness Operations::CheckReadiness() { return impl_->CheckReadiness(); }
std::optional<http::Response> Operations::AnswerRaw(std::string_view bytes) {
  return impl_->AnswerRaw(bytes);
}

}  // namespace outbox::outboxd
