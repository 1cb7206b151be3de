// libFuzzer target for outboxd's configuration reader: ParseConfig on any text (without the
// environment), then Describe on what it accepts. A ConfigError is the expected rejection. A
// finding is a crash, a sanitizer report, a hang, running out of memory, any other exception, or
// one of the checks below failing (each prints what it saw, then aborts):
// - an error message longer than the limits promise (values are quoted cut, lines too);
// - text that passes config::CheckTomlLimits but that toml11 parses into a deeper tree than that
//   scan allows (the scan is what keeps toml11's recursion off the end of the stack);
// - a description (--check-config) that does not parse back to itself (masked secrets aside).
//
//   scripts/fuzz config                              # build and run it (see scripts/fuzz --help)
//   build/fuzz/bin/outbox_fuzz_config crash-<sha1>   # run it on one input again

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <toml.hpp>
#include <vector>

#include "config.h"
#include "outbox/config/toml_table.h"
#include "outbox/core/error.h"

namespace {

const char* NoEnvironment(const char* /*name*/) { return nullptr; }

[[noreturn]] void Finding(const std::string& what, std::string_view detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%.*s\n", what.c_str(), static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

// Arrays and tables from `value` down (0 for anything else).
std::size_t Depth(const outbox::config::TomlValue& value) {
  std::size_t deepest = 0;
  if (value.is_array()) {
    for (const auto& element : value.as_array()) deepest = std::max(deepest, Depth(element));
    return deepest + 1;
  }
  if (value.is_table()) {
    for (const auto& [key, element] : value.as_table()) deepest = std::max(deepest, Depth(element));
    return deepest + 1;
  }
  return 0;
}

// The scan before toml11 (CheckTomlLimits) must bound how deep toml11 goes. It counts [[a]] and
// the header [a.b] below it as 2 each, while the tree holds a table in an array in a table: so
// the tree may be up to twice as deep as the scan's limit, never more.
void CheckScanBoundsDepth(std::string_view text) {
  try {
    outbox::config::CheckTomlLimits(text, "fuzz.toml");
  } catch (const outbox::ConfigError&) {
    return;  // refused before toml11: nothing to compare
  }
  outbox::config::TomlValue root;
  try {
    std::istringstream stream{std::string{text}};
    root = toml::parse<toml::discard_comments, std::map, std::vector>(stream, "fuzz.toml");
  } catch (const std::exception&) {
    return;  // not TOML
  }
  const std::size_t depth = Depth(root) - 1;  // the root table does not count
  if (depth > 2 * outbox::config::kMaxTomlNesting) {
    Finding("CheckTomlLimits let through text " + std::to_string(depth) + " levels deep", text);
  }
}

// `description` without its lines that hold a masked secret.
std::string WithoutMasked(std::string_view description) {
  std::string kept;
  std::size_t start = 0;
  while (start < description.size()) {
    std::size_t end = description.find('\n', start);
    end = end == std::string_view::npos ? description.size() : end + 1;
    const std::string_view line = description.substr(start, end - start);
    if (line.find("***") == std::string_view::npos) kept += line;
    start = end;
  }
  return kept;
}

void CheckMessage(const outbox::ConfigError& error) {
  // A key of at most 256 bytes, lines of at most 1 KiB, 4 KiB in all (ParseConfig's last guard),
  // each cut marked "… (N bytes)".
  const std::string_view what = error.what();
  std::size_t start = 0;
  while (start < what.size()) {
    std::size_t end = what.find('\n', start);
    if (end == std::string_view::npos) end = what.size();
    if (end - start > 1400)
      Finding("an error line of " + std::to_string(end - start) + " bytes", what);
    start = end + 1;
  }
  if (what.size() > 5000) Finding("an error of " + std::to_string(what.size()) + " bytes", what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text{reinterpret_cast<const char*>(data), size};
  CheckScanBoundsDepth(text);
  std::string described;
  try {
    described =
        outbox::outboxd::Describe(outbox::outboxd::ParseConfig(text, "fuzz.toml", NoEnvironment));
  } catch (const outbox::ConfigError& error) {
    CheckMessage(error);
    return 0;
  }
  // --check-config's output is a configuration that describes itself the same way, but for
  // what was masked: a masked secret is lossy on purpose (a connection string that does not
  // parse is shown as "***" and a reason).
  try {
    const std::string again = outbox::outboxd::Describe(
        outbox::outboxd::ParseConfig(described, "described.toml", NoEnvironment));
    if (WithoutMasked(again) != WithoutMasked(described)) {
      Finding("the description of the description differs", described + "\n-- then:\n" + again);
    }
  } catch (const outbox::ConfigError& error) {
    Finding(std::string{"the description does not parse back: "} + error.what(), described);
  }
  return 0;
}
