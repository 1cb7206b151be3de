#pragma once
// How a sink type plugs into outboxd: it registers its name (the `type` of a [sinks.<name>]
// table), a parser for that table and, through what the parser returns, its factory, its part of
// --check-config and the address its readiness is probed at. outboxd loops over the registry; a
// new sink type adds its own files (include/outbox/sink/<type>*.h, src/sink/<type>/) and one
// registration line (apps/outboxd/sinks.cpp).

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/config/registry.h"
#include "outbox/config/toml_table.h"
#include "outbox/core/log.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/sink.h"

namespace outbox {

// Where the readiness check connects (TCP) to see whether a sink's broker is up. An empty host:
// the configured address has none that can be probed (then the sink never reads as ready).
struct SinkEndpoint {
  std::string host;
  int port = 0;
};

// What the program that opens a sink tells it besides its settings.
struct SinkContext {
  // Where the sink logs what its client library reports and its own warnings at start (e.g. a
  // deduplication window shorter than the lease); unset: the sink logs nothing of its own.
  LogFn log;
  // The relay's lease: a message whose outcome was unknown may be published again, by this relay
  // or by one that took its claims over, up to about this long after the first attempt. A sink
  // whose server deduplicates by message id compares its window with it. 0: not known.
  std::chrono::milliseconds lease{0};
};

// One [sinks.<name>] table, read and checked by its sink type. Immutable once parsed.
class SinkSettings {
 public:
  virtual ~SinkSettings() = default;
  // The table's keys with their effective values (defaults included), secrets masked, for
  // --check-config; the caller has written the section header and the type.
  virtual void Describe(config::TomlWriter& out) const = 0;
  // A new sink with these settings. Throws ConfigError for what only opening can tell.
  [[nodiscard]] virtual std::unique_ptr<Sink> Open(const SinkContext& context) const = 0;
  // The broker's address, when the readiness check should probe one.
  [[nodiscard]] virtual std::optional<SinkEndpoint> Endpoint() const { return std::nullopt; }
  // Every secret the table holds (passwords, tokens, header values, signing secrets), in each
  // form the broker may quote it back (core/secrets.h: HeaderSecretForms, UrlSecretForms), for
  // the process's redactor: outboxd keeps them out of every log line, last_error and API answer.
  [[nodiscard]] virtual std::vector<std::string> Secrets() const { return {}; }
};

struct SinkType {
  std::string name;  // `type = "<name>"`, e.g. "rabbitmq"
  // Reads the table of sink `sink_name` (its `type` already read), rejecting unknown keys by
  // name (Section::AllowOnly, with "type" among them) and bad values through config::Fail.
  // Secrets may come from the environment through `getenv` (see SinkSecretEnv).
  std::function<std::unique_ptr<const SinkSettings>(
      const config::Section& table, std::string_view sink_name, const config::GetenvFn& getenv)>
      parse;
};

// The environment variable that may hold sink `sink_name`'s `key` (a secret such as its url):
// OUTBOX_SINK_<NAME>_<KEY>, the name upper-cased with '-' as '_' ("audit-log", "url" ->
// OUTBOX_SINK_AUDIT_LOG_URL).
inline std::string SinkSecretEnv(std::string_view sink_name, std::string_view key) {
  std::string name = "OUTBOX_SINK_";
  const auto append = [&name](std::string_view text) {
    for (const char c : text) {
      if (c >= 'a' && c <= 'z') {
        name += static_cast<char>(c - 'a' + 'A');
      } else {
        name += c == '-' ? '_' : c;
      }
    }
  };
  append(sink_name);
  name += '_';
  append(key);
  return name;
}

// Reads, for every sink type, `envelope` ("full", "external" or
// "cloudevents"), and with "cloudevents" `cloudevents_mode` (one of `modes`: "binary", and
// "structured" where the binding defines it) and `cloudevents_source` (a template,
// sink/cloudevents.h). Either cloudevents_* key with another envelope is an error. The sink's
// AllowOnly list names both keys.
inline void ReadEnvelope(const config::Section& table, EnvelopeStyle& style,
                         cloudevents::Options& options,
                         std::initializer_list<std::string_view> modes = {"binary", "structured"}) {
  std::string name;
  if (table.ReadChoice(kEnvelopeKey, {"full", "external", "cloudevents"}, name)) {
    style = ParseEnvelopeStyle(name).value_or(EnvelopeStyle::kFull);
  }
  if (style != EnvelopeStyle::kCloudEvents) {
    for (const std::string_view key : {cloudevents::kModeKey, cloudevents::kSourceKey}) {
      if (const config::TomlValue* value = table.Find(key); value != nullptr) {
        config::Fail(table.Key(key), "is only read with envelope = \"cloudevents\"", value);
      }
    }
    return;
  }
  std::string mode;
  if (table.ReadChoice(cloudevents::kModeKey, modes, mode)) {
    options.mode =
        mode == "structured" ? cloudevents::Mode::kStructured : cloudevents::Mode::kBinary;
  }
  table.Read(cloudevents::kSourceKey, options.source);
  table.Check([&options] { cloudevents::ValidateOptions(options); });
}

// The keys ReadEnvelope read, for --check-config.
inline void DescribeEnvelope(config::TomlWriter& out, EnvelopeStyle style,
                             const cloudevents::Options& options) {
  out.String(kEnvelopeKey, EnvelopeStyleName(style));
  if (style != EnvelopeStyle::kCloudEvents) return;
  out.String(cloudevents::kModeKey, cloudevents::ModeName(options.mode));
  out.String(cloudevents::kSourceKey, options.source);
}

// The sink types a program knows (outboxd: apps/outboxd/sinks.cpp).
class SinkRegistry : public config::Registry<SinkType> {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor): a registry is its list of types
  SinkRegistry(std::initializer_list<SinkType> types = {}) : Registry("sink", types) {}
};

}  // namespace outbox
