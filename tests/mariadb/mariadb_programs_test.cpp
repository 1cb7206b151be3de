// The programs on MariaDB: the real outboxctl (migrate, migrate --print-sql run by the `mariadb`
// client, status, list, show, replay, skip, abandon, purge) and outboxd (--check-config with good
// and bad [database] tables; serving /readyz, /metrics, the admin API and the dashboard while it
// relays) with `[database] type = "mariadb"`, each test in a database of its own.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "connection.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/mariadb_test_support.h"
#include "support/wait.h"

extern char** environ;  // NOLINT: POSIX

namespace outbox::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

constexpr const char* kToken = "mariadb-programs-token";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Outcome {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs `argv` with stdin from `input` (a file; empty: /dev/null), stdout and stderr into one
// file, without OUTBOX_DATABASE_URL (which would win over the configuration's url); waits for
// it (the programs bound their own waits).
Outcome RunProgram(const std::vector<std::string>& argv, const fs::path& dir,
                   const std::string& input = {}) {
  const fs::path in = dir / "stdin";
  const fs::path out = dir / "output";
  std::ofstream(in) << input;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, in.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));  // NOLINT
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::string_view{*entry}.starts_with("OUTBOX_DATABASE_URL=")) continue;
    env.push_back(*entry);
  }
  env.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  Outcome outcome;
  if (spawned != 0) {
    outcome.output = "cannot run " + argv[0] + ": " + std::strerror(spawned);
    return outcome;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  outcome.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.output = ReadFile(out);
  return outcome;
}

class MariaDbProgramsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // outboxd (a ChildProcess) inherits the environment: its url would win over the files'.
    ::unsetenv("OUTBOX_DATABASE_URL");
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("outbox-mariadb-programs-" + std::to_string(::getpid()) + "-" + schema_.name());
    fs::create_directories(dir_);
    config_ = WriteConfig("outbox.toml", {});
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An outboxd configuration on this test's database, with `database_lines` added to its
  // [database] table (and `url` / `schema` replaced when they are among them).
  fs::path WriteConfig(const std::string& name, const std::string& database_lines,
                       const std::string& more = {}) {
    const fs::path path = dir_ / name;
    std::ofstream out(path);
    out << "[database]\ntype = \"mariadb\"\n";
    if (database_lines.find("url =") == std::string::npos) {
      out << "url = \"" << MariaDbUrl() << "\"\n";
    }
    if (database_lines.find("schema =") == std::string::npos) {
      out << "schema = \"" << schema_.name() << "\"\n";
    }
    out << database_lines << "\n"
        << more << "\n[sinks.default]\ntype = \"file\"\npath = \""
        << (dir_ / "events.jsonl").string() << "\"\n";
    return path;
  }

  Outcome Ctl(std::vector<std::string> args, const fs::path& config = {}) {
    args.insert(args.begin(), {OUTBOXCTL_PATH, "--config", (config.empty() ? config_ : config)});
    return RunProgram(args, dir_);
  }

  // Expects `outboxctl args` to exit `code` with output containing each of `fragments`.
  void ExpectCtl(int code, std::vector<std::string> args, const std::vector<std::string>& fragments,
                 const fs::path& config = {}) {
    std::string command;
    for (const auto& arg : args) command += " " + arg;
    const Outcome outcome = Ctl(std::move(args), config);
    EXPECT_EQ(outcome.code, code) << "outboxctl" << command << ":\n" << outcome.output;
    for (const auto& fragment : fragments) {
      EXPECT_NE(outcome.output.find(fragment), std::string::npos)
          << "outboxctl" << command << ": '" << fragment << "' not in:\n"
          << outcome.output;
    }
  }

  std::unique_ptr<Store> OpenStore(std::vector<std::string> hold_targets = {}) {
    mariadb::StoreOptions options;
    options.url = MariaDbUrl();
    options.schema = schema_.name();
    options.retry.max_attempts = 1;
    options.retry.hold_targets = std::move(hold_targets);
    return mariadb::OpenStore(std::move(options));
  }

  std::string Scalar(const std::string& sql) {
    return MariaDbScalar(schema_.conn(), sql).value_or("NULL");
  }

  MariaDbTestSchema schema_{/*migrate=*/false};
  fs::path dir_;
  fs::path config_;
};

TEST_F(MariaDbProgramsTest, OutboxctlMigratesAndRunsEveryCommand) {
  const std::string what = "MariaDB database " + schema_.name() + " on 127.0.0.1:13306";
  const std::string latest = std::to_string(mariadb::LatestSchemaVersion());
  ExpectCtl(1, {"status"}, {"is not migrated", "run outboxctl migrate"});
  ExpectCtl(0, {"migrate"}, {what + " migrated from version 0 to " + latest});
  ExpectCtl(0, {"migrate"}, {what + " is up to date (version " + latest + ")"});
  ExpectCtl(2, {"migrate", "--wal-slot"}, {"has no WAL mode (only PostgreSQL has one)"});
  ExpectCtl(2, {"migrate", "--print-sql", "--from", "99"}, {"no schema version 99"});
  ExpectCtl(0, {"status"},
            {"pending     0\nprocessing  0\nfailed      0\nabandoned   0\n", "delivery    table"});

  // Four messages written with the store's API, one abandoned, one holding its stream.
  auto store = OpenStore({"held"});
  std::vector<NewMessage> messages(5);
  const char* topics[] = {"orders", "orders", "orders", "refunds", "orders"};
  for (std::size_t i = 0; i < messages.size(); ++i) {
    messages[i].topic = topics[i];
    messages[i].stream_key = "o-" + std::to_string(i);
    messages[i].payload = R"({"n":)" + std::to_string(i) + "}";
  }
  messages[3].headers = {{"x-h", "v"}};
  messages[4].targets = {"held"};
  const auto ids = store->Enqueue(messages);
  {
    ClaimRequest request;
    request.owner = "test-relay";
    std::vector<FailedMessage> failures;
    std::vector<LeasedId> others;
    for (const auto& envelope : store->Claim(request)) {
      if (envelope.id == ids[1] || envelope.id == ids[4]) {
        failures.push_back(
            FailedMessage::Of(envelope, Failure{FailureKind::kRejected, "rejected: nack"}));
      } else {
        others.push_back(LeasedId::Of(envelope));
      }
    }
    ASSERT_EQ(store->Fail(request.owner, failures).settled, 2);
    store->Release(request.owner, others);
  }
  const auto id = [&](std::size_t i) { return ids[i].ToString(); };

  ExpectCtl(0, {"status"}, {"pending     3\nprocessing  0\nfailed      0\nabandoned   2"});
  ExpectCtl(0, {"status", "--json"},
            {R"("pending":3,"processing":0,"failed":0,"abandoned":2,)", R"("streams_held":1)",
             R"("delivery":"table")"});
  ExpectCtl(0, {"list"}, {"ID", id(0), id(1), id(2), id(3), id(4)});
  ExpectCtl(0, {"list", "--status", "abandoned", "--target", "default"}, {id(1), "rejected"});
  ExpectCtl(0, {"list", "--topic", "orders", "--limit", "2"}, {"more: --after " + id(1)});
  ExpectCtl(0, {"list", "--topic", "refunds", "--json"},
            {R"({"messages":[{"id":")" + id(3) + "\"", R"("more":false)"});
  ExpectCtl(0, {"list", "--held"}, {id(4)});
  ExpectCtl(0, {"list", "--older-than", "1h"}, {"no messages match"});
  ExpectCtl(0, {"show", id(3)}, {"headers\n  x-h: v\n", "payload (7 bytes, text)\n{\"n\":3}"});
  ExpectCtl(0, {"show", id(1), "--json"}, {R"("status":"abandoned")"});
  const std::string missing = "00000000-0000-7000-8000-000000000000";
  ExpectCtl(3, {"show", missing}, {"message " + missing + " not found"});

  ExpectCtl(0, {"replay", "--all-abandoned", "--dry-run"}, {"would replay 2 messages"});
  ExpectCtl(0, {"skip", "--all-held", "--dry-run"}, {"would skip 1 message: " + id(4)});
  ExpectCtl(0, {"skip", "--all-held"}, {"skipped 1 message: " + id(4)});
  EXPECT_EQ(Scalar("SELECT CONCAT(status, ' ', holds_stream) FROM " + schema_.name() +
                   ".messages WHERE id = UNHEX(REPLACE('" + id(4) + "', '-', ''))"),
            "abandoned 0");
  ExpectCtl(0, {"replay", id(1)}, {"replayed 1 message: " + id(1)});
  ExpectCtl(0, {"status"}, {"pending     4\nprocessing  0\nfailed      0\nabandoned   1"});
  ExpectCtl(0, {"abandon", "--topic", "refunds", "--reason", "no such customer"},
            {"abandoned 1 message: " + id(3)});
  ExpectCtl(0, {"show", id(3)}, {"abandoned by operator: no such customer"});
  ExpectCtl(3, {"abandon", missing, "--reason", "x"}, {"message " + missing + " not found"});
  ExpectCtl(0, {"purge"}, {"purged 0 messages"});
  ExpectCtl(0, {"purge", "--abandoned", "0s"}, {"purged 2 messages"});
  ExpectCtl(0, {"status"}, {"pending     3\nprocessing  0\nfailed      0\nabandoned   0"});
  ExpectCtl(2, {"list", "--limit", "0"}, {"--limit must be between 1 and 10000, got 0"});
  ExpectCtl(2, {"replay"}, {"replay: say which messages"});
}

// The script --print-sql prints is one the `mariadb` client runs: it brings an empty database to
// the latest version, after which migrate finds nothing to do; and from a version on, only what
// follows it.
TEST_F(MariaDbProgramsTest, PrintSqlIsAScriptTheMariaDbClientRuns) {
  const Outcome script = Ctl({"migrate", "--print-sql"});
  ASSERT_EQ(script.code, 0) << script.output;
  ASSERT_NE(script.output.find("DELIMITER //"), std::string::npos);
  const mariadb::Url url = mariadb::ParseUrl(MariaDbUrl());
  const std::vector<std::string> client{"mariadb",
                                        "--host=" + url.host,
                                        "--port=" + std::to_string(url.port),
                                        "--user=" + url.user,
                                        "--password=" + url.password,
                                        "--batch"};
  const Outcome ran = RunProgram(client, dir_, script.output);
  ASSERT_EQ(ran.code, 0) << ran.output;
  const std::string latest = std::to_string(mariadb::LatestSchemaVersion());
  EXPECT_EQ(Scalar("SELECT MAX(version) FROM " + schema_.name() + ".schema_version"), latest);
  ExpectCtl(0, {"migrate"}, {"is up to date (version " + latest + ")"});
  ExpectCtl(0, {"status"}, {"pending     0"});
  // The store works on what the client made: the procedures are there.
  NewMessage message;
  message.topic = "t";
  message.payload = "{}";
  EXPECT_EQ(OpenStore()->Enqueue(std::span{&message, 1}).size(), 1U);
  ExpectCtl(0, {"status"}, {"pending     1"});

  // From the latest version, nothing but the version table, which the client runs as a no-op.
  const Outcome nothing = Ctl({"migrate", "--print-sql", "--from", latest});
  ASSERT_EQ(nothing.code, 0) << nothing.output;
  EXPECT_EQ(nothing.output.find("CREATE TABLE IF NOT EXISTS `" + schema_.name() + "`.messages"),
            std::string::npos)
      << nothing.output;
  const Outcome no_op = RunProgram(client, dir_, nothing.output);
  EXPECT_EQ(no_op.code, 0) << no_op.output;
  ExpectCtl(0, {"status"}, {"pending     1"});
}

TEST_F(MariaDbProgramsTest, OutboxctlRefusesBadDatabaseTablesNamingTheKey) {
  const auto expect_refused = [&](const std::string& lines, const std::string& key,
                                  const std::string& words) {
    const fs::path bad = WriteConfig("bad.toml", lines);
    ExpectCtl(2, {"status"}, {bad.string() + ": " + key + ": " + words}, bad);
  };
  expect_refused("mode = \"wal\"", "database.mode", "MariaDB has no WAL mode");
  expect_refused("url = \"postgresql://outbox:pw-secret@127.0.0.1/x\"", "database.url",
                 "the URL must start with mariadb:// or mysql://");
  expect_refused("schema = \"out-box\"", "database.schema", "must be a plain identifier");
  expect_refused("sslmode = \"require\"", "database.sslmode", "unknown key");
  // Wrong password: the server refuses (exit 1), and the password is not quoted.
  const fs::path wrong =
      WriteConfig("wrong.toml", "url = \"mariadb://outbox:pw-secret@127.0.0.1:13306/outbox_test\"");
  const Outcome refused = Ctl({"status"}, wrong);
  EXPECT_EQ(refused.code, 1) << refused.output;
  EXPECT_NE(refused.output.find("Access denied"), std::string::npos) << refused.output;
  EXPECT_EQ(refused.output.find("pw-secret"), std::string::npos) << refused.output;
}

TEST_F(MariaDbProgramsTest, CheckConfigShowsTheTableMaskedAndRefusesBadOnes) {
  const fs::path good = WriteConfig("good.toml",
                                    "url = \"mariadb://outbox:pw-secret@127.0.0.1:13306/app\"\n"
                                    "statement_deadline = \"20s\"");
  const Outcome valid =
      RunProgram({OUTBOXD_PATH, "--config", good.string(), "--check-config"}, dir_);
  EXPECT_EQ(valid.code, 0) << valid.output;
  EXPECT_NE(
      valid.output.find("[database]\ntype = \"mariadb\"\n"
                        "url = \"mariadb://outbox:***@127.0.0.1:13306/app\"\n"
                        "schema = \"" +
                        schema_.name() + "\"\nmode = \"table\"\nstatement_deadline = \"20s\"\n"),
      std::string::npos)
      << valid.output;
  EXPECT_NE(valid.output.find("is valid"), std::string::npos) << valid.output;
  EXPECT_EQ(valid.output.find("pw-secret"), std::string::npos) << valid.output;

  for (const auto& [lines, words] : std::vector<std::pair<std::string, std::string>>{
           {"url = \"mariadb://outbox:pw-secret@127.0.0.1:0/app\"", "database.url: bad port '0'"},
           {"url = \"https://outbox:pw-secret@db/app\"",
            "database.url: the URL must start with mariadb:// or mysql://"},
           {"pool = 4", "database.pool: unknown key"},
           {"mode = \"wal\"", "database.mode: MariaDB has no WAL mode"},
           {"schema = \"1outbox\"", "database.schema: must be a plain identifier"},
           {"statement_deadline = \"0s\"", "database.statement_deadline: must be at least 1s"}}) {
    const fs::path bad = WriteConfig("bad.toml", lines);
    const Outcome refused =
        RunProgram({OUTBOXD_PATH, "--config", bad.string(), "--check-config"}, dir_);
    EXPECT_EQ(refused.code, 2) << lines << ":\n" << refused.output;
    EXPECT_NE(refused.output.find(words), std::string::npos) << lines << ":\n" << refused.output;
    EXPECT_EQ(refused.output.find("pw-secret"), std::string::npos) << refused.output;
  }
}

// The real outboxd on MariaDB: it relays what is written, and its HTTP listener answers from the
// database: readiness, the counts and the backlog by topic, the admin API, the dashboard.
TEST_F(MariaDbProgramsTest, OutboxdRelaysAndServesItsHttpListener) {
  mariadb::Migrate(MariaDbUrl(), schema_.name());
  auto store = OpenStore();
  std::vector<NewMessage> messages(5);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    messages[i].topic = "orders";
    messages[i].stream_key = "order-" + std::to_string(i);
    messages[i].payload = R"({"order":)" + std::to_string(i) + "}";
  }
  const auto ids = store->Enqueue(messages);
  MessageFilter parked;
  parked.ids = std::vector<MessageId>{ids[2]};
  ASSERT_EQ(mariadb::OpenAdmin(MariaDbUrl(), schema_.name())
                ->Abandon(parked, "parked by the test", false)
                .count,
            1);

  const int port = FreePort();
  const fs::path config = WriteConfig(
      "outboxd.toml", "",
      "[relay]\ninstance = \"mariadb-programs\"\n[http]\nlisten = \"127.0.0.1:" +
          std::to_string(port) + "\"\ntoken = \"" + kToken + "\"\nstats_interval = \"100ms\"\n");
  const fs::path log = dir_ / "outboxd.log";
  ChildProcess outboxd({OUTBOXD_PATH, "--config", config.string()}, log.string(), Ready::Notify());
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(10, 0);
  const httplib::Headers auth{{"Authorization", std::string{"Bearer "} + kToken}};
  const auto get = [&](const std::string& path) { return client.Get(path.c_str(), auth); };
  const auto sample = [](const std::string& metrics, const std::string& series) -> double {
    const std::size_t at = metrics.find("\n" + series + " ");
    return at == std::string::npos ? -1 : std::stod(metrics.substr(at + series.size() + 2));
  };
  const fs::path events = dir_ / "events.jsonl";

  // It relays the four that are pending, and /metrics says so from the database.
  std::string metrics;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto reply = get("/metrics");
        metrics = reply && reply->status == 200 ? reply->body : "";
        return sample(metrics, R"(outbox_messages{status="pending"})") == 0 &&
               sample(metrics, R"(outbox_messages{status="abandoned"})") == 1 &&
               sample(metrics, "outbox_published_total") == 4;
      },
      seconds{20}))
      << metrics << "\nlog:\n"
      << ReadFile(log);
  EXPECT_EQ(
      sample(metrics,
             R"(outbox_messages_by_topic{status="abandoned",target="default",topic="orders"})"),
      1)
      << metrics;
  const auto ready = get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
  EXPECT_NE(ready->body.find("database: ok"), std::string::npos) << ready->body;

  // The admin API lists the abandoned one and replays it; the relay publishes it.
  const auto listed = get("/api/messages?status=abandoned");
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->status, 200) << listed->body;
  const auto page = nlohmann::json::parse(listed->body);
  ASSERT_EQ(page["messages"].size(), 1U) << listed->body;
  EXPECT_EQ(page["messages"][0]["id"], ids[2].ToString());
  EXPECT_EQ(page["messages"][0]["last_error"], "abandoned by operator: parked by the test");
  const auto shown = get("/api/messages/" + ids[2].ToString());
  ASSERT_TRUE(shown);
  EXPECT_EQ(shown->status, 200) << shown->body;
  const auto bad = get("/api/messages?status=done");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  const auto replayed =
      client.Post("/api/messages/replay", auth, R"({"ids": [")" + ids[2].ToString() + R"("]})",
                  "application/json");
  ASSERT_TRUE(replayed);
  ASSERT_EQ(replayed->status, 200) << replayed->body;
  EXPECT_EQ(nlohmann::json::parse(replayed->body)["count"], 1);
  EXPECT_TRUE(WaitUntil(
      [&] { return ReadFile(events).find(ids[2].ToString()) != std::string::npos; }, seconds{20}))
      << ReadFile(log);
  for (const auto& id : ids) {
    EXPECT_NE(ReadFile(events).find(id.ToString()), std::string::npos) << id.ToString();
  }

  // The dashboard is served.
  const auto ui = client.Get("/ui");
  ASSERT_TRUE(ui);
  EXPECT_EQ(ui->status, 200);
  EXPECT_NE(ui->body.find("<html"), std::string::npos);

  EXPECT_EQ(outboxd.Stop(SIGTERM, seconds{20}), 0) << ReadFile(log);
  EXPECT_EQ(ReadFile(log).find("outbox:outbox@"), std::string::npos) << "a password in the log";
}

}  // namespace
}  // namespace outbox::testing
