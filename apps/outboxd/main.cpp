// outboxd: the relay daemon. Publishes committed outbox messages to brokers.
//
// Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad command line or configuration,
// 3 not implemented yet (the relay engine is under construction; see README).

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "outbox/core/version.h"

namespace {
constexpr int kExitNotImplemented = 3;
}

int main(int argc, char** argv) {
  CLI::App app{"outboxd: publishes committed outbox messages to brokers, with confirms", "outboxd"};
  app.set_version_flag("--version", std::string{"outboxd "} + outbox::kVersion);
  std::string config_path;
  app.add_option("-c,--config", config_path, "TOML configuration file")->check(CLI::ExistingFile);
  bool check_config = false;
  app.add_flag("--check-config", check_config, "Validate the configuration and exit");
  CLI11_PARSE(app, argc, argv);

  std::cerr << "outboxd " << outbox::kVersion
            << ": the relay engine is not implemented yet; only --version and --help work.\n";
  return kExitNotImplemented;
}
