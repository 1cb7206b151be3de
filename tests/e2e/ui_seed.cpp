// The dashboard test's seeder (tests/e2e/ui_browser_test.py): writes messages into an outbox with
// the store's own API, PostgreSQL or SQLite, and abandons some of them as an operator would, so
// that the browser test finds a realistic state without SQL of its own.
//
//   outbox_ui_seed --postgres URL --schema NAME   (migrates the schema first)
//   outbox_ui_seed --sqlite PATH                  (migrates the file first)
//
// Reads one JSON object a line from standard input: {"topic": ..., "payload": ...,
// "stream": ..., "type": ..., "target": ..., "headers": {...}, "abandon": "<reason>"}; prints
// the id of each message, one a line, in input order. Exit status 0, or 1 with the reason.

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "outbox/store/admin.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_admin.h"
#include "outbox/store/sqlite.h"

namespace {

int Run(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::unique_ptr<outbox::Store> store;
  std::unique_ptr<outbox::Admin> admin;
  if (args.size() == 4 && args[0] == "--postgres" && args[2] == "--schema") {
    outbox::postgres::Migrate(args[1], args[3]);
    store = outbox::postgres::OpenStore({.conninfo = args[1], .schema = args[3]});
    admin = outbox::postgres::OpenAdmin(args[1], args[3]);
  } else if (args.size() == 2 && args[0] == "--sqlite") {
    outbox::sqlite::Migrate(args[1]);
    store = outbox::sqlite::OpenStore({.path = args[1]});
    admin = outbox::sqlite::OpenAdmin(args[1]);
  } else {
    std::cerr << "usage: outbox_ui_seed --postgres URL --schema NAME | --sqlite PATH\n";
    return 1;
  }
  std::vector<outbox::NewMessage> messages;
  std::vector<std::string> abandon;  // per message: the reason, or ""
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    const auto json = nlohmann::json::parse(line);
    outbox::NewMessage message;
    message.topic = json.at("topic").get<std::string>();
    message.payload = json.value("payload", std::string{});
    if (json.contains("stream")) message.stream_key = json["stream"].get<std::string>();
    if (json.contains("type")) message.type = json["type"].get<std::string>();
    if (json.contains("target")) message.targets = {json["target"].get<std::string>()};
    if (json.contains("headers")) {
      for (const auto& [key, value] : json["headers"].items()) {
        message.headers[key] = value.get<std::string>();
      }
    }
    messages.push_back(std::move(message));
    abandon.push_back(json.value("abandon", std::string{}));
  }
  const std::vector<outbox::MessageId> ids = store->Enqueue(messages);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (abandon[i].empty()) continue;
    outbox::MessageFilter filter;
    filter.ids = std::vector<outbox::MessageId>{ids[i]};
    admin->Abandon(filter, abandon[i], /*dry_run=*/false);
  }
  for (const auto& id : ids) std::cout << id.ToString() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& failure) {
    std::cerr << "outbox_ui_seed: " << failure.what() << "\n";
    return 1;
  }
}
