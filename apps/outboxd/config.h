#pragma once
// outboxd's configuration: a TOML file (every key is documented, with its default, in
// apps/outboxd/outbox.example.toml), validated as a whole before anything starts. Unknown keys are
// rejected by name, so that a typo is an error and not a silently ignored setting.
//
// Secrets may come from the environment instead of the file; a set, non-empty variable wins over
// the file:
//   OUTBOX_DATABASE_URL       [database] url of a postgres store (ignored by type = "sqlite")
//   OUTBOX_SINK_<NAME>_URL    [sinks.<name>] url of a rabbitmq sink (SinkSecretEnv); <NAME> is
//                             the sink's name upper-cased with '-' replaced by '_' (sink
//                             "audit-log" reads OUTBOX_SINK_AUDIT_LOG_URL)
//   OUTBOX_HTTP_TOKEN         [http] token

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "database_list.h"
#include "outbox/config/toml_file.h"
#include "outbox/config/toml_table.h"
#include "outbox/core/retry_policy.h"
#include "outbox/relay/dispatcher.h"
#include "outbox/relay/relay_config.h"
#include "outbox/relay/tenant_relays.h"
#include "outbox/sink/claim_check.h"
#include "outbox/sink/registry.h"
#include "outbox/store/catalog.h"
#include "outbox/store/registry.h"
#include "outbox/store/store.h"

namespace outbox::outboxd {

// [sinks.<name>]: a sink of a registered type (SinkTypes()), with the settings its type read.
struct SinkConfig {
  std::string name;  // the message target it serves; "default" serves messages without a target
  std::string type;  // "rabbitmq", "file", ...
  std::shared_ptr<const SinkSettings> settings;
  // `max_rate` and `max_burst`, which every sink type takes (read here, not by the type).
  std::optional<RateLimit> rate_limit;
  // What an abandoned keyed message does to its stream when its topic does not say
  // (topic_settings.on_abandon wins): "continue" (the stream goes on past it) or "hold" (the
  // stream waits until an operator replays or skips it; RetryPolicy::hold_targets).
  std::string on_abandon = "continue";
};

// The sink types outboxd knows, one registration line each (sinks.cpp).
const SinkRegistry& SinkTypes();

// [http]: the operations listener (/metrics, /api/outbox, /healthz, /readyz).
struct HttpConfig {
  // host:port to listen on ("[::1]:9780" for IPv6); "" disables the listener. Port 1..65535.
  std::string listen = "127.0.0.1:9780";
  // When not empty, every path but /healthz requires "Authorization: Bearer <token>".
  // OUTBOX_HTTP_TOKEN wins over the file. Printable ASCII without spaces, at most 256 bytes.
  std::string token;
  // How often the message counts are read from the database (on a connection of their own);
  // requests are served from this cache, never from the database.
  std::chrono::milliseconds stats_interval{5000};
  // /readyz fails when the last successful read of the counts (or probe of a broker) is older.
  // At least twice stats_interval.
  std::chrono::milliseconds ready_max_age{15000};
  // Listening beyond loopback (listens_beyond_loopback()) without a token is refused unless
  // this is true: anyone who reaches the port could then read /metrics and /api/outbox. outboxd
  // warns at every start when it is in effect.
  bool allow_unauthenticated = false;

  // listen split into host and port; only meaningful when listen is not empty.
  [[nodiscard]] std::string host() const;
  [[nodiscard]] int port() const;
  // Whether the listener is on and its host is not a loopback address (127.0.0.0/8, ::1, an
  // IPv4-mapped 127.x, "localhost"). Every other host counts as beyond: "0.0.0.0" and "[::]"
  // (all interfaces), other addresses, and host names, whatever they resolve to.
  [[nodiscard]] bool listens_beyond_loopback() const;
};

// The store types outboxd knows, one registration line each (stores.cpp).
const StoreRegistry& StoreTypes();

using apps::DiscoveredDatabase;
using apps::DiscoveryConfig;

struct Config {
  // [database]: a store of a registered type (StoreTypes()), "postgres" unless `type` says
  // otherwise, with the settings its type read (url and schema; or path for "sqlite"). Null when
  // the file names many databases instead (many_databases()).
  std::string database_type = "postgres";
  std::shared_ptr<const StoreSettings> database;

  // [[databases]]: the databases one outboxd serves, each a [database] table with a `name`
  // (tenant_relays.h); and/or [discovery], which names more while outboxd runs. Either or both
  // instead of [database].
  std::vector<NamedDatabase> databases;
  std::optional<DiscoveryConfig> discovery;
  [[nodiscard]] bool many_databases() const { return !databases.empty() || discovery; }

  RelaySection relay;  // [relay], read by the relay library (outbox/relay/relay_config.h)

  RetryPolicy retry;          // [retry]
  RetentionPolicy retention;  // [retention]

  // [log]
  std::string log_level = "info";   // trace|debug|info|warn|error
  std::string log_format = "text";  // text|json

  HttpConfig http;  // [http]

  // [claim_check]: the claim check of every sink without a table of its own, and the defaults of
  // those with one (sink/claim_check_type.h); unset: none.
  std::optional<claim_check::Options> claim_check;

  // [sinks.<name>]: at least one, in the order the file defines them. A message goes to the sink
  // named like its target ("default" unless the writer chose another).
  std::vector<SinkConfig> sinks;
};

using config::GetenvFn;

// The largest configuration file (or text) read: 1 MiB (outbox/config/toml_file.h).
using config::kMaxConfigBytes;

// Reads and validates the file at `path`. Throws outbox::ConfigError whose key() is the full
// dotted key as written ("relay.batch_size", "sinks.default.confirm_window") for an unknown key
// or section, a value of the wrong type or out of range, a malformed duration, an unknown sink
// type or a missing required key; with key "file" when the file cannot be read, is not a
// regular file (a FIFO, a device or a directory is refused without waiting on it), is larger
// than kMaxConfigBytes, or is refused by config::CheckTomlLimits (not UTF-8, nested deeper than
// config::kMaxTomlNesting, too many values on long lines), or is not valid TOML (the message
// then carries toml11's line and column). Messages never contain a password, and quote at most
// a short prefix of a long value, key or line.
Config LoadConfig(
    const std::string& path,
    const GetenvFn& getenv = [](const char* name) -> const char* { return std::getenv(name); });

// LoadConfig on text already read (the same limits apply); `origin` names it in messages
// (usually the path).
Config ParseConfig(std::string_view toml_text, const std::string& origin, const GetenvFn& getenv);

// The effective configuration as TOML (it parses back to the same values), with every password
// in a URL or connection string replaced by ***. For --check-config.
std::string Describe(const Config& config);

// Every secret of the configuration, in the forms it may be quoted back in: the database's and
// each sink's (StoreSettings/SinkSettings::Secrets) and [http] token. For the process's redactor
// (outbox/core/secrets.h), which keeps them out of log lines, last_error and API answers.
std::vector<std::string> Secrets(const Config& config);

using config::MaskPassword;

}  // namespace outbox::outboxd
