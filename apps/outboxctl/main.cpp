// outboxctl: the admin CLI (migrate, status, list, show, replay, abandon, purge).
//
// Exit codes: 0 success, 1 runtime failure, 2 bad command line, 3 not implemented yet.

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "outbox/core/version.h"

namespace {
constexpr int kExitNotImplemented = 3;
}

int main(int argc, char** argv) {
  CLI::App app{"outboxctl: inspect and repair an outbox", "outboxctl"};
  app.set_version_flag("--version", std::string{"outboxctl "} + outbox::kVersion);
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);

  std::cerr << "outboxctl " << outbox::kVersion << ": no commands are implemented yet.\n";
  return kExitNotImplemented;
}
