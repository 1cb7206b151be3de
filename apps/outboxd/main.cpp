// outboxd: the relay daemon. Publishes committed outbox messages to brokers.
//
// Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad command line or configuration,
// 3 not implemented yet (the relay engine is under construction; see README).

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "outbox/core/version.h"

namespace {
constexpr int kExitUsage = 2;
constexpr int kExitNotImplemented = 3;
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outboxd: publishes committed outbox messages to brokers, with confirms", "outboxd"};
  app.set_version_flag("--version", std::string{"outboxd "} + outbox::kVersion);
  std::string config_path;
  app.add_option("-c,--config", config_path, "TOML configuration file")->check(CLI::ExistingFile);
  bool check_config = false;
  app.add_flag("--check-config", check_config, "Validate the configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" that exit 0; everything else is a usage error: 2.
    return app.exit(error) == 0 ? 0 : kExitUsage;
  }

  std::cerr << "outboxd " << outbox::kVersion
            << ": the relay engine is not implemented yet; only --version and --help work.\n";
  return kExitNotImplemented;
}
