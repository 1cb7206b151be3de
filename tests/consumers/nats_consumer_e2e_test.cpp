// NATS: outboxd's nats sink publishes to a JetStream stream, examples/node/nats_inbox_consumer.js
// reads it through a durable pull consumer and applies each message through the SQL inbox; the
// writer is examples/node/place_orders.js (exactly_once_scenario.h). Node's packages (nats, pg)
// are installed with npm from examples/node/package.json into the build directory on first use.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "exactly_once_scenario.h"
#include "nats_test_support.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// examples/node's packages in NODE_EXAMPLES_DIR; empty when they are there, else why not.
std::string EnsureNodePackages() {
  if (Shell("command -v node >/dev/null 2>&1") != 0) {
    return "node (Node.js) is not installed: the NATS consumer example runs on Node.js";
  }
  const std::string dir = NODE_EXAMPLES_DIR;
  if (std::filesystem::exists(dir + "/node_modules/nats/package.json") &&
      std::filesystem::exists(dir + "/node_modules/pg/package.json")) {
    return {};
  }
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(EXAMPLES_DIR "/node/package.json", dir + "/package.json",
                             std::filesystem::copy_options::overwrite_existing);
  if (Shell("npm install --prefix '" + dir + "' --no-audit --no-fund --silent >/dev/null 2>&1") !=
      0) {
    return "npm install of examples/node/package.json into " + dir +
           " failed (is npm installed and the npm registry reachable?)";
  }
  return {};
}

TEST(NatsConsumerE2eTest, NodeConsumerAppliesEveryCommittedEventOnceThroughKills) {
  const std::string problem = EnsureNodePackages();
  ASSERT_TRUE(problem.empty()) << problem;
  TestSchema schema;
  JetStreamClient client;
  const std::string stream = "ORDERS_" + schema.name();
  const std::string subject = "consumers." + schema.name();
  client.AddStream({.name = stream, .subjects = {subject}});
  const std::string node = "NODE_PATH=" NODE_EXAMPLES_DIR "/node_modules";
  RunExactlyOnce({
      .schema = schema.name(),
      .sinks = "[sinks.default]\ntype = \"nats\"\nurl = \"" + NatsUrl() + "\"\nsubject = \"" +
               subject + "\"\n",
      .writer = {"/usr/bin/env", node, "node", EXAMPLES_DIR "/node/place_orders.js", "--orders",
                 "3000"},
      .consumer = {"/usr/bin/env", node, "node", EXAMPLES_DIR "/node/nats_inbox_consumer.js",
                   "--nats", NatsUrl(), "--stream", stream, "--db", PgUrl(), "--schema",
                   schema.name(), "--table", AppliedTable(schema.name())},
      .consumer_ready = "nats_inbox_consumer: consuming stream",
  });
  client.DeleteStream(stream);
}

}  // namespace
}  // namespace outbox::testing
