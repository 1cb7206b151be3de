#include <chrono>
#include <cstdint>
#include <toml.hpp>  // brokers and librdkafka properties: values of any type

#include "outbox/core/error.h"
#include "outbox/sink/kafka_type.h"

namespace outbox::kafka {
namespace {

using config::Fail;
using config::Quoted;
using std::chrono::milliseconds;

// The properties whose values may come from the environment (IsSecretProperty's names).
constexpr std::string_view kSecretProperties[] = {
    "sasl.password",           "ssl.key.password",
    "ssl.keystore.password",   "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config", "ssl.key.pem"};

// OUTBOX_SINK_<NAME>_LIBRDKAFKA_<PROPERTY>, '.' as '_'.
std::string PropertyEnv(std::string_view sink_name, std::string_view property) {
  std::string key = "librdkafka_" + std::string{property};
  for (char& c : key) {
    if (c == '.') c = '_';
  }
  return SinkSecretEnv(sink_name, key);
}

// A librdkafka property's value as written: strings as they are, integers and booleans in the
// form librdkafka reads.
std::string PropertyValue(const config::Section& table, const std::string& name,
                          const config::TomlValue& value) {
  if (value.is_string()) return value.as_string().str;
  if (value.is_integer()) return std::to_string(value.as_integer());
  if (value.is_boolean()) return value.as_boolean() ? "true" : "false";
  Fail(table.Key(name),
       "expected a string (or an integer or boolean), got " + config::TypeName(value.type()),
       &value);
}

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink,
                                                  std::string_view name,
                                                  const config::GetenvFn& getenv) {
  sink.AllowOnly({"type", "brokers", "topic", "compression", "linger", "max_in_flight",
                  "header_style", "max_message_bytes", "envelope", "cloudevents_mode", "cloudevents_source", "librdkafka"});
  SinkOptions options;
  options.brokers.clear();

  // brokers: a string or an array of strings; the environment wins.
  const std::string brokers_env = SinkSecretEnv(name, "brokers");
  const config::TomlValue* brokers_value = sink.Find("brokers");
  if (brokers_value != nullptr && brokers_value->is_array()) {
    for (const config::TomlValue& entry : brokers_value->as_array()) {
      if (!entry.is_string()) {
        Fail(sink.Key("brokers"), "expected an array of \"host:port\" strings", &entry);
      }
      options.brokers += (options.brokers.empty() ? "" : ",") + entry.as_string().str;
    }
  } else {
    sink.Read("brokers", options.brokers);
  }
  config::ValueSource brokers{.key = sink.Key("brokers"), .env = {}, .value = brokers_value};
  if (auto from_env = config::Env(getenv, brokers_env)) {
    options.brokers = std::move(*from_env);
    brokers = {.key = sink.Key("brokers"), .env = brokers_env, .value = nullptr};
  }
  if (options.brokers.empty()) brokers.Fail("is required (or set " + brokers_env + ")");
  sink.Read("topic", options.topic);
  sink.ReadChoice("compression", {"none", "gzip", "snappy", "lz4", "zstd"}, options.compression);
  sink.ReadDuration("linger", milliseconds{0}, std::chrono::minutes{15}, options.linger);
  sink.ReadInteger("max_in_flight", 1, 5, options.max_in_flight);
  std::string style = "outbox";
  sink.ReadChoice("header_style", {"outbox", "debezium"}, style);
  options.header_style = style == "debezium" ? HeaderStyle::kDebezium : HeaderStyle::kOutbox;
  sink.ReadInteger("max_message_bytes", 1000, 1000000000, options.max_message_bytes);
  ReadEnvelope(sink, options.envelope, options.cloudevents);

  const config::Section properties = sink.Table("librdkafka");
  for (const auto& [property, value] : properties.Entries()) {
    options.properties.emplace_back(property, PropertyValue(properties, property, *value));
  }
  for (const std::string_view property : kSecretProperties) {
    if (auto secret = config::Env(getenv, PropertyEnv(name, property))) {
      std::erase_if(options.properties, [&](const auto& entry) { return entry.first == property; });
      options.properties.emplace_back(std::string{property}, std::move(*secret));
    }
  }

  // The values themselves (the brokers, the topic template, a property the sink sets itself, an
  // unknown property, a bad value), checked where the sink and librdkafka check them, once.
  brokers.shown = config::MaskPassword(options.brokers);
  sink.Check([&] { ValidateOptions(options); }, {&brokers});
  return std::make_unique<const SinkSettings>(std::string{name}, std::move(options));
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  out.String("brokers", config::MaskPassword(options_.brokers));
  out.String("topic", options_.topic);
  out.String("compression", options_.compression);
  out.Duration("linger", options_.linger);
  out.Integer("max_in_flight", options_.max_in_flight);
  out.String("header_style",
             options_.header_style == HeaderStyle::kDebezium ? "debezium" : "outbox");
  out.Integer("max_message_bytes", static_cast<std::int64_t>(options_.max_message_bytes));
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
  if (options_.properties.empty()) return;
  out.Header("sinks." + sink_name_ + ".librdkafka");
  for (const auto& [property, value] : options_.properties) {
    out.String(config::TomlString(property), IsSecretProperty(property) ? "***" : value);
  }
}

std::vector<std::string> SinkSettings::Secrets() const {
  std::vector<std::string> secrets;
  for (const auto& [property, value] : options_.properties) {
    if (IsSecretProperty(property)) secrets.push_back(value);
  }
  return secrets;
}

// librdkafka's lines go to the program's log (they went to stderr before).
std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& context) const {
  SinkOptions options = options_;
  if (!options.log) options.log = context.log;
  return OpenSink(std::move(options));
}

std::optional<SinkEndpoint> SinkSettings::Endpoint() const {
  const auto brokers = ParseBrokers(options_.brokers);
  if (!brokers) return SinkEndpoint{};
  return SinkEndpoint{brokers->front().host, brokers->front().port};
}

SinkType Type() { return {.name = std::string{kSinkName}, .parse = Parse}; }

}  // namespace outbox::kafka
