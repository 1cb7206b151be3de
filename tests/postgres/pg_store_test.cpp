// The C++ writer in the caller's transaction, and the relay-side store under concurrency,
// outages and bad configuration, against a real PostgreSQL.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "outbox/core/error.h"
#include "support/header_limits.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

class PgStoreTest : public ::testing::Test {
 protected:
  TestSchema schema_;
  postgres::Writer writer_{schema_.name()};

  std::unique_ptr<Store> OpenStore() { return OpenTestStore(schema_); }
  static NewMessage Message(std::string topic, std::optional<std::string> key = std::nullopt) {
    return TestMessage(std::move(topic), std::move(key));
  }
  static ClaimRequest Request(std::string owner, int max) {
    ClaimRequest request;
    request.owner = std::move(owner);
    request.max_messages = max;
    return request;
  }
};

TEST_F(PgStoreTest, RolledBackMessagesAreNeverClaimableCommittedOnesAtOnce) {
  auto app = Connect();
  auto store = OpenStore();
  Sql(app.get(), "CREATE TABLE " + schema_.name() + ".orders (id int)");

  Sql(app.get(), "BEGIN");
  Sql(app.get(), "INSERT INTO " + schema_.name() + ".orders VALUES (1)");
  const MessageId rolled_back = writer_.Enqueue(app.get(), Message("orders"));
  EXPECT_TRUE(store->Claim(Request("relay", 10)).empty()) << "uncommitted message visible";
  Sql(app.get(), "ROLLBACK");
  EXPECT_TRUE(store->Claim(Request("relay", 10)).empty());

  Sql(app.get(), "BEGIN");
  Sql(app.get(), "INSERT INTO " + schema_.name() + ".orders VALUES (2)");
  const MessageId committed = writer_.Enqueue(app.get(), Message("orders"));
  Sql(app.get(), "COMMIT");
  const auto batch = store->Claim(Request("relay", 10));
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, committed);
  EXPECT_NE(batch[0].id, rolled_back);
}

TEST_F(PgStoreTest, WriterBatchesInOneTransactionAndNeverCommits) {
  auto app = Connect();
  std::vector<NewMessage> messages;
  for (int i = 0; i < 50; ++i) messages.push_back(Message("t", "k" + std::to_string(i % 3)));
  messages[7].payload = std::string("\x00\x01", 2);
  messages[7].content_type = "application/octet-stream";
  Sql(app.get(), "BEGIN");
  const auto ids = writer_.Enqueue(app.get(), messages);
  ASSERT_EQ(ids.size(), 50U);
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(PQtransactionStatus(app.get()), PQTRANS_INTRANS);  // still the caller's transaction
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages"), "0");
  Sql(app.get(), "COMMIT");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages"), "50");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT encode(payload, 'hex') FROM " + schema_.name() +
                                       ".messages WHERE id = '" + ids[7].ToString() + "'"),
            "0001");
}

TEST_F(PgStoreTest, WriterRefusesWithoutATransactionAndRejectsBadMessagesFirst) {
  auto app = Connect();
  EXPECT_THROW(writer_.Enqueue(app.get(), Message("t")), std::logic_error);
  Sql(app.get(), "BEGIN");
  NewMessage bad = Message("t");
  bad.headers = {{"x", "a\rb"}};
  try {
    writer_.Enqueue(app.get(), std::vector<NewMessage>{Message("t"), bad});
    ADD_FAILURE() << "expected InvalidMessage";
  } catch (const InvalidMessage& error) {
    EXPECT_STREQ(
        error.what(),
        "outbox enqueue: message 1: header 'x': value contains a control character (0x0d)");
  }
  // Refused before sending: the caller's transaction is still usable.
  EXPECT_EQ(PQtransactionStatus(app.get()), PQTRANS_INTRANS);
  writer_.Enqueue(app.get(), Message("t"));
  Sql(app.get(), "COMMIT");
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages"), "1");
}

// Headers at the default limits go through and arrive whole; one header more is refused before
// anything is sent, so the caller's transaction stays usable.
TEST_F(PgStoreTest, WriterTakesHeadersAtTheLimitsAndRefusesOneMoreBeforeSending) {
  auto app = Connect();
  NewMessage message = Message("t");
  message.headers = HeadersAtTheLimits();
  NewMessage more = message;
  more.headers["x-one-more"] = "";
  Sql(app.get(), "BEGIN");
  try {
    writer_.Enqueue(app.get(), more);
    ADD_FAILURE() << "expected InvalidMessage";
  } catch (const InvalidMessage& error) {
    EXPECT_STREQ(error.what(),
                 "outbox enqueue: message 0: headers: 65 headers, over the limit of 64 "
                 "(max_header_count)");
  }
  EXPECT_EQ(PQtransactionStatus(app.get()), PQTRANS_INTRANS);
  writer_.Enqueue(app.get(), message);
  Sql(app.get(), "COMMIT");
  const auto batch = OpenStore()->Claim(Request("relay", 10));
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].headers, message.headers);
}

// A writer given higher limits than the database's settings is refused by the database, naming
// the setting (and the caller's transaction is then aborted).
TEST_F(PgStoreTest, WriterLimitsAboveTheSettingsAreRefusedByTheDatabase) {
  MessageLimits raised;
  raised.max_header_count = 65;
  const postgres::Writer writer{schema_.name(), raised};
  NewMessage message = Message("t");
  message.headers = HeadersAtTheLimits();
  message.headers["x-one-more"] = "";  // one header more, the same bytes in all
  message.headers.at("x-010").resize(message.headers.at("x-010").size() - 10);
  auto app = Connect();
  Sql(app.get(), "BEGIN");
  try {
    writer.Enqueue(app.get(), message);
    ADD_FAILURE() << "expected InvalidMessage";
  } catch (const InvalidMessage& error) {
    EXPECT_NE(std::string{error.what()}.find(
                  "outbox.enqueue: 65 headers, over the limit of 64 (settings.max_header_count)"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(PQtransactionStatus(app.get()), PQTRANS_INERROR);
  Sql(app.get(), "ROLLBACK");
  Sql(schema_.conn(), "UPDATE " + schema_.name() + ".settings SET max_header_count = 65");
  Sql(app.get(), "BEGIN");
  writer.Enqueue(app.get(), message);
  Sql(app.get(), "COMMIT");
}

TEST_F(PgStoreTest, PayloadOverTheDatabaseLimitIsInvalidMessage) {
  Sql(schema_.conn(), "UPDATE " + schema_.name() + ".settings SET max_payload_bytes = 8");
  auto app = Connect();
  Sql(app.get(), "BEGIN");
  std::vector<NewMessage> messages{Message("t"), Message("t")};
  messages[1].payload = "123456789";
  messages[0].payload = "1";
  try {
    writer_.Enqueue(app.get(), messages);
    ADD_FAILURE() << "expected InvalidMessage";
  } catch (const InvalidMessage& error) {
    EXPECT_NE(std::string{error.what()}.find("payload is 9 bytes, over the limit of 8"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(PQtransactionStatus(app.get()), PQTRANS_INERROR);
  Sql(app.get(), "ROLLBACK");
}

TEST_F(PgStoreTest, EightClaimersNeverGetTheSameRow) {
  constexpr int kRows = 40000;
  constexpr int kClaimers = 8;
  Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('t', '{}') FROM generate_series(1, " +
                          std::to_string(kRows) + ")");
  std::vector<std::vector<MessageId>> claimed(kClaimers);
  std::vector<std::thread> claimers;
  for (int c = 0; c < kClaimers; ++c) {
    claimers.emplace_back([&, c] {
      auto store = OpenStore();
      auto probe = Connect();
      const std::string owner = "relay-" + std::to_string(c);
      // A claim that meets another's batch still locked finds nothing there (it skips those rows
      // and does not look past them: that could put a stream's later message ahead), so a claimer
      // stops only once no message is left to claim.
      for (int round = 0; round < 10000; ++round) {
        const auto batch = store->Claim(Request(owner, 500));
        if (batch.empty()) {
          if (Scalar(probe.get(), "SELECT count(*) FROM " + schema_.name() +
                                      ".messages WHERE status = 'pending'") == "0") {
            break;
          }
          continue;
        }
        std::vector<LeasedId> leases;
        for (const auto& envelope : batch) {
          claimed[static_cast<std::size_t>(c)].push_back(envelope.id);
          leases.push_back(LeasedId::Of(envelope));
        }
        EXPECT_EQ(store->Complete(owner, leases).settled, static_cast<std::int64_t>(batch.size()));
      }
    });
  }
  for (auto& claimer : claimers) claimer.join();
  std::set<MessageId> all;
  std::size_t total = 0;
  for (const auto& ids : claimed) {
    total += ids.size();
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(total, std::size_t{kRows}) << "some row was claimed twice or never";
  EXPECT_EQ(all.size(), std::size_t{kRows});
  int busy = 0;
  for (const auto& ids : claimed) busy += ids.empty() ? 0 : 1;
  EXPECT_GE(busy, 2) << "the claimers did not actually run side by side";
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages"), "0");
}

TEST_F(PgStoreTest, ALongOpenTransactionIsDeliveredAfterItCommits) {
  auto slow = Connect();
  auto fast = Connect();
  auto store = OpenStore();
  Sql(slow.get(), "BEGIN");
  const MessageId early = writer_.Enqueue(slow.get(), Message("t"));  // the smaller id
  for (int i = 0; i < 5; ++i) {
    Sql(fast.get(), "BEGIN");
    writer_.Enqueue(fast.get(), Message("t"));
    Sql(fast.get(), "COMMIT");
  }
  auto batch = store->Claim(Request("relay", 100));
  EXPECT_EQ(batch.size(), 5U);
  std::vector<LeasedId> leases;
  for (const auto& envelope : batch) leases.push_back(LeasedId::Of(envelope));
  store->Complete("relay", leases);
  Sql(slow.get(), "COMMIT");
  batch = store->Claim(Request("relay", 100));
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, early);
}

TEST_F(PgStoreTest, ValuesTravelOnlyAsBoundParameters) {
  // What the server would log under log_statement=all is the statement text of each Parse
  // message; the values must be in Bind messages only. libpq's protocol trace shows both.
  auto app = Connect();
  char path[] = "/tmp/outbox-pqtrace-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  FILE* trace = fdopen(fd, "w");
  PQtrace(app.get(), trace);
  Sql(app.get(), "BEGIN");
  NewMessage message = Message("topic-SECRET1", "key-SECRET2");
  message.headers = {{"x-h", "header-SECRET3"}};
  writer_.Enqueue(app.get(), std::vector<NewMessage>{message, message});
  Sql(app.get(), "COMMIT");
  auto store = OpenStore();
  PQuntrace(app.get());
  std::fclose(trace);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  int parses = 0;
  int binds_with_values = 0;
  std::string line;
  while (std::getline(text, line)) {
    if (line.find("\tParse\t") != std::string::npos) {
      ++parses;
      EXPECT_EQ(line.find("SECRET"), std::string::npos) << "value inlined in SQL: " << line;
    }
    if (line.find("\tBind\t") != std::string::npos &&
        line.find("topic-SECRET1") != std::string::npos &&
        line.find("key-SECRET2") != std::string::npos &&
        line.find("header-SECRET3") != std::string::npos) {
      ++binds_with_values;
    }
  }
  EXPECT_EQ(parses, 2);
  EXPECT_EQ(binds_with_values, 2);
}

TEST_F(PgStoreTest, PasswordsNeverAppearInErrors) {
  postgres::StoreOptions options;
  options.conninfo = "postgresql://outbox:Sup3rSecretPw@127.0.0.1:1/outbox_test";
  options.schema = schema_.name();
  try {
    postgres::OpenStore(options);
    ADD_FAILURE() << "expected StoreError";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable);
    const std::string what = error.what();
    EXPECT_EQ(what.find("Sup3rSecretPw"), std::string::npos) << what;
    EXPECT_NE(what.find("host=127.0.0.1 port=1 dbname=outbox_test user=outbox"), std::string::npos)
        << what;
  }
  options.conninfo = "host=127.0.0.1 password=Sup3rSecretPw dbname";  // malformed
  try {
    postgres::OpenStore(options);
    ADD_FAILURE() << "expected StoreError";
  } catch (const StoreError& error) {
    EXPECT_EQ(std::string{error.what()}.find("Sup3rSecretPw"), std::string::npos) << error.what();
  }
  // A wrong password is refused by the server; the message names the user, not the password.
  const std::string url = PgUrl();
  options.conninfo = url.substr(0, url.find(':', 13) + 1) + "WrongPw42" + url.substr(url.find('@'));
  try {
    postgres::OpenStore(options);
  } catch (const StoreError& error) {
    EXPECT_EQ(std::string{error.what()}.find("WrongPw42"), std::string::npos) << error.what();
  }
}

TEST_F(PgStoreTest, BadOptionsAreConfigErrors) {
  postgres::StoreOptions options;
  options.conninfo = PgUrl();
  options.schema = "Bad-Name";
  EXPECT_THROW(postgres::OpenStore(options), ConfigError);
  options.schema = schema_.name();
  options.retry.max_attempts = 0;
  EXPECT_THROW(postgres::OpenStore(options), ConfigError);
  options.retry = {};
  options.retention.published = std::chrono::seconds{-1};
  EXPECT_THROW(postgres::OpenStore(options), ConfigError);
}

TEST_F(PgStoreTest, ReconnectsAfterTheConnectionIsKilled) {
  auto store = OpenStore();
  EXPECT_EQ(store->Stats().pending, 0);
  // Terminate the store's backend from the side, as a failover or restart would: this test's
  // only (its schema in the query), not another test's that counts something too (a WAL relay's
  // ledger commit running beside it was cut this way).
  Sql(schema_.conn(),
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
      "pg_backend_pid() AND datname = current_database() AND query LIKE "
      "'%count(*)%' AND query LIKE '%" +
          schema_.name() + "%'");
  std::this_thread::sleep_for(milliseconds{100});
  try {
    store->Stats();  // may notice the loss now...
  } catch (const StoreError& error) {
    EXPECT_TRUE(error.kind() == FailureKind::kOutcomeUnknown ||
                error.kind() == FailureKind::kUnavailable)
        << error.what();
  }
  EXPECT_EQ(store->Stats().pending, 0);  // ...and works again on the next call
}

// The claim is a statement prepared on the store's session: a new session must prepare it again.
TEST_F(PgStoreTest, TheClaimIsPreparedAgainOnANewSession) {
  auto store = OpenStore();
  const auto enqueue_one = [&] {
    Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('t', '{}')");
  };
  enqueue_one();
  const auto first = store->Claim(Request("relay", 10));
  ASSERT_EQ(first.size(), 1U);
  // The store's session, whose last statement was the claim (the start of its text is kept).
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> "
                   "pg_backend_pid() AND datname = current_database() AND query LIKE "
                   "'%WITH settled AS%' AND query LIKE '%" +
                       schema_.name() + "%'"),
            "1");
  std::this_thread::sleep_for(milliseconds{100});
  enqueue_one();
  std::vector<Envelope> second;
  for (int attempt = 0; attempt < 2 && second.empty(); ++attempt) {
    try {
      second = store->Claim(Request("relay", 10));  // the first may notice the loss
    } catch (const StoreError& error) {
      EXPECT_EQ(attempt, 0) << error.what();
    }
  }
  ASSERT_EQ(second.size(), 1U);
  EXPECT_NE(second[0].id, first[0].id);
  const std::vector<LeasedId> leases{LeasedId::Of(first[0]), LeasedId::Of(second[0])};
  EXPECT_EQ(store->Complete("relay", leases).settled, 2);
}

TEST_F(PgStoreTest, StatsEstimateAboveTheExactLimit) {
  Sql(schema_.conn(),
      "SELECT " + schema_.name() + ".enqueue('t', '{}') FROM generate_series(1, 300)");
  Sql(schema_.conn(), "ANALYZE " + schema_.name() + ".messages");
  postgres::StoreOptions options;
  options.conninfo = PgUrl();
  options.schema = schema_.name();
  options.exact_count_limit = 100;
  auto store = postgres::OpenStore(std::move(options));
  const auto stats = store->Stats();
  EXPECT_TRUE(stats.counts_estimated);
  EXPECT_NEAR(static_cast<double>(stats.pending), 300.0, 30.0);
}

}  // namespace
}  // namespace outbox::testing
