#pragma once
// What the tests of every sink type's [sinks.<name>] table share
// (tests/<sink>/<sink>_type_test.cpp): the table parsed from TOML text with a fake environment, its
// --check-config text, and the ConfigError a bad table gives.

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <toml.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/sink/registry.h"

namespace outbox::testing {

// Environment variables by name; an absent one is unset.
using FakeEnvironment = std::map<std::string, std::string>;

// Parses "[sinks.events]\ntype = <type.name>\n" + `body` through `type`, reading `env` as the
// environment.
inline std::unique_ptr<const SinkSettings> ParseSinkTable(const SinkType& type,
                                                          const std::string& body,
                                                          FakeEnvironment env = {}) {
  std::istringstream stream("[sinks.events]\ntype = \"" + type.name + "\"\n" + body);
  const config::TomlValue root =
      toml::parse<toml::discard_comments, std::map, std::vector>(stream, "test.toml");
  const config::Section table{&root.at("sinks").at("events"), "sinks.events"};
  const config::GetenvFn getenv = [env = std::move(env)](const char* name) -> const char* {
    const auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  };
  return type.parse(table, "events", getenv);
}

// What --check-config prints for the table (below its header and type).
inline std::string DescribeSink(const std::unique_ptr<const SinkSettings>& settings) {
  config::TomlWriter out;
  settings->Describe(out);
  return out.Take();
}

// The key and message of the ConfigError that parsing `body` throws; a test failure when it
// throws none.
inline std::pair<std::string, std::string> SinkTableError(const SinkType& type,
                                                          const std::string& body,
                                                          FakeEnvironment env = {}) {
  try {
    ParseSinkTable(type, body, std::move(env));
  } catch (const ConfigError& error) {
    return {error.key(), error.what()};
  }
  ADD_FAILURE() << "no ConfigError for:\n" << body;
  return {};
}

// The `envelope` key every sink type takes (sink/envelope_style.h), for a table that is valid
// with `body`: "full" by default and shown so by Describe, "external" read and shown, anything
// else refused naming the key and the choices. `style_of` reads the parsed style back.
template <typename StyleOf>
void ExpectEnvelopeKey(const SinkType& type, const std::string& body, StyleOf style_of) {
  const auto defaults = ParseSinkTable(type, body);
  EXPECT_EQ(style_of(*defaults), EnvelopeStyle::kFull);
  EXPECT_NE(DescribeSink(defaults).find("\nenvelope = \"full\"\n"), std::string::npos)
      << DescribeSink(defaults);

  const auto external = ParseSinkTable(type, body + "envelope = \"external\"\n");
  EXPECT_EQ(style_of(*external), EnvelopeStyle::kExternal);
  const std::string described = DescribeSink(external);
  EXPECT_NE(described.find("\nenvelope = \"external\"\n"), std::string::npos) << described;
  // --check-config's text is a valid table that reads back the same.
  EXPECT_EQ(DescribeSink(ParseSinkTable(type, described)), described);

  EXPECT_EQ(style_of(*ParseSinkTable(type, body + "envelope = \"full\"\n")), EnvelopeStyle::kFull);

  const auto [key, message] = SinkTableError(type, body + "envelope = \"stripped\"\n");
  EXPECT_EQ(key, "sinks.events.envelope") << message;
  EXPECT_NE(message.find("sinks.events.envelope"), std::string::npos) << message;
  EXPECT_NE(message.find("\"full\", \"external\""), std::string::npos) << message;
  EXPECT_NE(message.find("\"stripped\""), std::string::npos) << message;
  // Names are case-sensitive, like every other choice.
  EXPECT_EQ(SinkTableError(type, body + "envelope = \"External\"\n").first,
            "sinks.events.envelope");
  EXPECT_EQ(SinkTableError(type, body + "envelope = true\n").first, "sinks.events.envelope");
}

// envelope = "cloudevents" and its keys (sink/cloudevents.h) for a sink type that speaks it, for a
// table that is valid with `body`: read and shown by Describe (which reads back the same), the
// modes `modes` names accepted and others refused, an empty source or a bad placeholder refused
// naming cloudevents_source, and either key refused with another envelope. `options_of` reads the
// parsed cloudevents::Options back.
template <typename OptionsOf>
void ExpectCloudEventsKeys(const SinkType& type, const std::string& body, OptionsOf options_of,
                           std::initializer_list<std::string_view> modes) {
  const std::string ce = body + "envelope = \"cloudevents\"\n";
  const auto defaults = ParseSinkTable(type, ce);
  EXPECT_EQ(options_of(*defaults).source, cloudevents::kDefaultSource);
  const std::string described = DescribeSink(defaults);
  EXPECT_NE(described.find("\nenvelope = \"cloudevents\"\ncloudevents_mode = \""),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("\ncloudevents_source = \"/outbox/{target}\"\n"), std::string::npos)
      << described;
  EXPECT_EQ(DescribeSink(ParseSinkTable(type, described)), described);
  for (const std::string_view mode : modes) {
    const auto parsed = ParseSinkTable(type, ce + "cloudevents_mode = \"" + std::string{mode} +
                                                 "\"\ncloudevents_source = \"/s/{topic}\"\n");
    EXPECT_EQ(cloudevents::ModeName(options_of(*parsed).mode), mode);
    EXPECT_EQ(options_of(*parsed).source, "/s/{topic}");
  }
  for (const std::string_view mode : {"binary", "structured"}) {
    if (std::find(modes.begin(), modes.end(), mode) != modes.end()) continue;
    const auto [key, message] =
        SinkTableError(type, ce + "cloudevents_mode = \"" + std::string{mode} + "\"\n");
    EXPECT_EQ(key, "sinks.events.cloudevents_mode") << message;
  }
  auto [key, message] = SinkTableError(type, ce + "cloudevents_mode = \"Binary\"\n");
  EXPECT_EQ(key, "sinks.events.cloudevents_mode") << message;
  EXPECT_NE(message.find("\"Binary\""), std::string::npos) << message;
  std::tie(key, message) = SinkTableError(type, ce + "cloudevents_source = \"\"\n");
  EXPECT_EQ(key, "sinks.events.cloudevents_source") << message;
  EXPECT_NE(message.find("must not be empty"), std::string::npos) << message;
  std::tie(key, message) = SinkTableError(type, ce + "cloudevents_source = \"/x/{id}\"\n");
  EXPECT_EQ(key, "sinks.events.cloudevents_source") << message;
  std::tie(key, message) = SinkTableError(type, body + "cloudevents_source = \"/x\"\n");
  EXPECT_EQ(key, "sinks.events.cloudevents_source") << message;
  EXPECT_NE(message.find("only read with envelope = \"cloudevents\""), std::string::npos)
      << message;
  std::tie(key, message) =
      SinkTableError(type, body + "envelope = \"external\"\ncloudevents_mode = \"binary\"\n");
  EXPECT_EQ(key, "sinks.events.cloudevents_mode") << message;
}

}  // namespace outbox::testing
