#pragma once
// What the tests of every sink type's [sinks.<name>] table share
// (tests/<sink>/<sink>_type_test.cpp): the table parsed from TOML text with a fake environment, its
// --check-config text, and the ConfigError a bad table gives.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
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

}  // namespace outbox::testing
