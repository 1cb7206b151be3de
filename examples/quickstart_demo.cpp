// The quickstart (scripts/quickstart runs it): an application writes orders and their events in
// SQLite transactions, rolling some back on purpose, while outboxd -- the real relay binary, in a
// process of its own -- publishes every committed event to a JSON-lines file. At the end the file
// is checked against what the application committed: nothing lost, nothing rolled back
// published, no event that was never written, each stream in order. Exit code 0 only when every
// check passes.
//
//   quickstart_demo [--orders 10000] [--streams 100] [--rollback-percent 10] [--dir DIR]
//                   [--outboxd PATH] [--timeout 60] [--seed 1] [--postgres URL --amqp URL]
//                   [--postgres URL --kafka [BROKERS|mock]]
//
// Everything lives in DIR (default: a new /tmp/outbox-quickstart-XXXXXX, kept afterwards):
// app.db (the application's database, which also holds the outbox), outboxd.toml, outboxd.log and
// events.jsonl (what outboxd published).
//
// With --postgres URL --amqp URL the same run uses the servers instead: the application writes in
// PostgreSQL transactions (orders and outbox in a schema of its own, quickstart_<pid>), outboxd
// publishes to RabbitMQ (a durable queue of the demo's own, outbox-quickstart-<pid>-orders), and
// this program consumes that queue (manual acks) instead of reading a file. The schema and the
// queue are dropped at the end, pass or fail; DIR then holds outboxd.toml and outboxd.log only.
//
// With --postgres URL --kafka BROKERS it is the same with Kafka: outboxd publishes with its kafka
// sink to a topic of the demo's own (outbox-quickstart-<pid>-orders, created with the admin API
// when the cluster allows it, deleted at the end), and this program reads every partition of it
// with a plain librdkafka consumer: the record key is the stream, the headers message_id and
// outbox-stream-seq the event id and its place in the stream. With --kafka alone (or --kafka mock)
// it starts outbox-kafka-mock (librdkafka's mock cluster: a protocol mock, not Kafka) as a child
// process, whose log is DIR/kafka-mock.log, and stops it at the end.
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "outbox/core/wire_names.h"
#include "outbox/store/postgres.h"
#include "outbox/store/sqlite.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Options {
  int orders = 10000;
  int streams = 100;
  int rollback_percent = 10;
  std::string dir;
  std::string outboxd;
  int timeout_seconds = 60;
  std::uint64_t seed = 1;
  std::string postgres;  // with amqp or kafka: the run on the servers
  std::string amqp;
  bool kafka_given = false;  // --kafka: outboxd publishes to Kafka instead of RabbitMQ
  std::string kafka;         // its bootstrap servers; "" or "mock": outbox-kafka-mock, started here
  std::string kafka_mock;    // the outbox-kafka-mock binary (default: next to this one)
  [[nodiscard]] bool UsesServers() const { return !postgres.empty(); }
  [[nodiscard]] bool UsesKafka() const { return kafka_given; }
  [[nodiscard]] bool StartsMock() const {
    return kafka_given && (kafka.empty() || kafka == "mock");
  }
};

// 12345678 -> "12,345,678"
std::string Grouped(std::int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  for (std::size_t at = digits.size(); at > 3; at -= 3) digits.insert(at - 3, ",");
  return value < 0 ? "-" + digits : digits;
}

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

std::string Fixed(double value, int decimals) {
  std::array<char, 64> text{};
  std::snprintf(text.data(), text.size(), "%.*f", decimals, value);
  return text.data();
}

std::string TomlString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// dashboard.toml next to the demo's files: outboxd on the same SQLite database with its HTTP
// listener on 127.0.0.1:9780 and a random token (mode 0600), for a look at the dashboard after the
// demo. Published messages are kept for a day from then on. Returns its path.
std::string WriteDashboardConfig(const std::filesystem::path& dir, const std::string& db_path,
                                 const std::string& events_path) {
  std::random_device random;
  std::string token;
  constexpr std::string_view kHex = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) token += kHex[random() % 16];
  const std::string path = (dir / "dashboard.toml").string();
  {
    std::ofstream config(path);
    config << "# Written by quickstart_demo: outboxd on the demo's SQLite database, with the\n"
           << "# dashboard at http://127.0.0.1:9780/ui. Stop it with Ctrl-C.\n"
           << "[database]\ntype = \"sqlite\"\npath = " << TomlString(db_path) << "\n\n"
           << "[relay]\ninstance = \"quickstart\"\nsweep_interval = \"200ms\"\n\n"
           << "[retention]\npublished = \"1d\"\n\n"
           << "[http]\nlisten = \"127.0.0.1:9780\"\ntoken = " << TomlString(token) << "\n\n"
           << "[sinks.default]\ntype = \"file\"\npath = " << TomlString(events_path) << "\n";
  }
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);  // the token
  return path;
}

// "scheme://user:password@host/..." -> "scheme://user:***@host/..."; other text unchanged.
std::string Redacted(const std::string& url) {
  const std::size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const std::size_t at = url.find('@', scheme + 3);
  if (at == std::string::npos) return url;
  const std::size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

// An order's events: every order is placed; every third one is also paid at once. One or two
// events, in the order's transaction, ordered within the customer's stream.
std::vector<outbox::NewMessage> OrderEvents(std::int64_t id, const std::string& stream,
                                            std::int64_t total_cents) {
  std::vector<outbox::NewMessage> events;
  const nlohmann::json placed = {
      {"order_id", id}, {"customer", stream}, {"total_cents", total_cents}};
  events.push_back(
      {.topic = "orders", .payload = placed.dump(), .stream_key = stream, .type = "OrderPlaced"});
  if (id % 3 == 0) {
    const nlohmann::json paid = {{"order_id", id}, {"customer", stream}};
    events.push_back(
        {.topic = "orders", .payload = paid.dump(), .stream_key = stream, .type = "OrderPaid"});
  }
  return events;
}

std::int64_t OrderTotalCents(int id) { return 500 + (id * 7919) % 20000; }

// Called with an order's event ids just before its transaction commits or rolls back, so that the
// checks know of an event before the relay can publish it.
using RecordEvents = std::function<void(const std::vector<outbox::MessageId>&)>;

// The application: writes order `id` and its events in one transaction, rolled back instead of
// committed when `roll_back` (a declined payment, say).
class Shop {
 public:
  virtual ~Shop() = default;
  virtual void PlaceOrder(int id, int customer, bool roll_back, const RecordEvents& record) = 0;
};

// ---- The application on SQLite: one transaction per order, its events written by the outbox ----

struct DbCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
struct StatementFinalizer {
  void operator()(sqlite3_stmt* statement) const noexcept { sqlite3_finalize(statement); }
};

class SqliteShop final : public Shop {
 public:
  explicit SqliteShop(const std::string& path) {
    sqlite3* raw = nullptr;
    const int code = sqlite3_open(path.c_str(), &raw);
    db_.reset(raw);
    if (code != SQLITE_OK) Fail("open " + path);
    // The relay writes the same file (claims, completions): wait for its short transactions.
    sqlite3_busy_timeout(db_.get(), 10000);
    Exec("PRAGMA synchronous = NORMAL");  // WAL (set by Migrate) + NORMAL: durable at checkpoints
    Exec(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL,"
        " total_cents INTEGER NOT NULL)");
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_.get(), "INSERT INTO orders VALUES (?, ?, ?)", -1, &statement,
                           nullptr) != SQLITE_OK) {
      Fail("prepare");
    }
    insert_order_.reset(statement);
  }

  void PlaceOrder(int id, int customer, bool roll_back, const RecordEvents& record) override {
    // BEGIN IMMEDIATE takes the write lock at the start, waiting (busy_timeout) while the relay
    // holds it. A plain BEGIN would start as a reader; in WAL mode its first write then fails at
    // once with SQLITE_BUSY_SNAPSHOT whenever the relay committed in between, and the whole
    // transaction would have to be retried.
    Exec("BEGIN IMMEDIATE");
    try {
      const std::string stream = "customer-" + std::to_string(customer);
      const std::int64_t total_cents = OrderTotalCents(id);
      sqlite3_bind_int64(insert_order_.get(), 1, id);
      sqlite3_bind_text(insert_order_.get(), 2, stream.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(insert_order_.get(), 3, total_cents);
      const int code = sqlite3_step(insert_order_.get());
      sqlite3_reset(insert_order_.get());
      if (code != SQLITE_DONE) Fail("insert order");

      record(writer_.Enqueue(db_.get(), OrderEvents(id, stream, total_cents)));
      Exec(roll_back ? "ROLLBACK" : "COMMIT");
    } catch (...) {
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

 private:
  void Exec(const char* sql) {
    if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) Fail(sql);
  }
  [[noreturn]] void Fail(const std::string& what) {
    throw std::runtime_error("application database: " + what + ": " +
                             (db_ ? sqlite3_errmsg(db_.get()) : "out of memory"));
  }

  std::unique_ptr<sqlite3, DbCloser> db_;
  std::unique_ptr<sqlite3_stmt, StatementFinalizer> insert_order_;
  outbox::sqlite::Writer writer_;
};

// ---- The application on PostgreSQL: the same, in a schema of its own ----

struct ConnCloser {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
using PgConn = std::unique_ptr<PGconn, ConnCloser>;
using PgResult = std::unique_ptr<PGresult, decltype(&PQclear)>;

PgConn PgConnect(const std::string& url) {
  PgConn conn{PQconnectdb(url.c_str())};
  if (!conn || PQstatus(conn.get()) != CONNECTION_OK) {
    std::string reason = conn ? PQerrorMessage(conn.get()) : "out of memory";
    while (!reason.empty() && reason.back() == '\n') reason.pop_back();
    throw std::runtime_error("cannot connect to PostgreSQL at " + Redacted(url) + ": " + reason);
  }
  return conn;
}

// Runs `sql`; returns its command tag ("COMMIT", "ROLLBACK", ...). Throws when it fails.
std::string PgExec(PGconn* conn, const std::string& sql) {
  const PgResult result{PQexec(conn, sql.c_str()), &PQclear};
  if (PQresultStatus(result.get()) != PGRES_COMMAND_OK) {
    std::string reason = PQerrorMessage(conn);
    while (!reason.empty() && reason.back() == '\n') reason.pop_back();
    throw std::runtime_error("PostgreSQL: " + sql + ": " + reason);
  }
  return PQcmdStatus(result.get());
}

class PostgresShop final : public Shop {
 public:
  PostgresShop(const std::string& url, const std::string& schema)
      : conn_(PgConnect(url)), writer_(schema) {
    PgExec(conn_.get(), "SET synchronous_commit = on");
    PgExec(conn_.get(), "CREATE TABLE IF NOT EXISTS " + schema +
                            ".orders (id bigint PRIMARY KEY, customer text NOT NULL,"
                            " total_cents bigint NOT NULL)");
    const std::string insert = "INSERT INTO " + schema + ".orders VALUES ($1, $2, $3)";
    const PgResult prepared{PQprepare(conn_.get(), "insert_order", insert.c_str(), 3, nullptr),
                            &PQclear};
    if (PQresultStatus(prepared.get()) != PGRES_COMMAND_OK) {
      throw std::runtime_error("PostgreSQL: prepare: " + std::string{PQerrorMessage(conn_.get())});
    }
  }

  void PlaceOrder(int id, int customer, bool roll_back, const RecordEvents& record) override {
    PgExec(conn_.get(), "BEGIN");
    try {
      const std::string stream = "customer-" + std::to_string(customer);
      const std::int64_t total_cents = OrderTotalCents(id);
      const std::string id_text = std::to_string(id);
      const std::string total_text = std::to_string(total_cents);
      const std::array<const char*, 3> values{id_text.c_str(), stream.c_str(), total_text.c_str()};
      const PgResult inserted{
          PQexecPrepared(conn_.get(), "insert_order", 3, values.data(), nullptr, nullptr, 0),
          &PQclear};
      if (PQresultStatus(inserted.get()) != PGRES_COMMAND_OK) {
        throw std::runtime_error("PostgreSQL: insert order: " +
                                 std::string{PQerrorMessage(conn_.get())});
      }
      record(writer_.Enqueue(conn_.get(), OrderEvents(id, stream, total_cents)));
      // COMMIT of a failed transaction "succeeds" with the tag ROLLBACK: check the tag.
      const std::string tag = PgExec(conn_.get(), roll_back ? "ROLLBACK" : "COMMIT");
      if (tag != (roll_back ? "ROLLBACK" : "COMMIT")) {
        throw std::runtime_error("PostgreSQL: the transaction of order " + id_text +
                                 " ended with " + tag);
      }
    } catch (...) {
      PQclear(PQexec(conn_.get(), "ROLLBACK"));
      throw;
    }
  }

 private:
  PgConn conn_;
  outbox::postgres::Writer writer_;
};

// ---- What outboxd published ----

struct Delivery {
  std::string id;
  std::string stream_key;       // "" when null
  std::int64_t stream_seq = 0;  // 0 when null
  std::int64_t order_id = -1;   // from the payload; -1 when missing
};

// Every delivery seen so far, by whatever means: the JSON-lines file or the RabbitMQ queue.
class Published {
 public:
  virtual ~Published() = default;

  // Takes in what arrived since the last call. Never throws: a failure is kept in error().
  virtual void Poll() = 0;
  // After outboxd stopped: takes in the rest of what it published.
  virtual void Finish() { Poll(); }

  [[nodiscard]] const std::vector<Delivery>& deliveries() const { return deliveries_; }
  [[nodiscard]] std::size_t distinct() const { return seen_.size(); }
  [[nodiscard]] bool Contains(const std::string& id) const { return seen_.contains(id); }
  [[nodiscard]] std::size_t malformed() const { return malformed_; }
  [[nodiscard]] const std::string& error() const { return error_; }

 protected:
  void Add(Delivery delivery) {
    seen_.insert(delivery.id);
    deliveries_.push_back(std::move(delivery));
  }
  void AddMalformed() { ++malformed_; }
  void SetError(std::string error) {
    if (error_.empty()) error_ = std::move(error);
  }

 private:
  std::vector<Delivery> deliveries_;  // every delivery, duplicates included, in arrival order
  std::unordered_set<std::string> seen_;
  std::size_t malformed_ = 0;
  std::string error_;
};

// The payload's order_id, -1 when it has none.
std::int64_t PayloadOrderId(const nlohmann::json& payload) {
  if (payload.is_object() && payload.contains("order_id") &&
      payload["order_id"].is_number_integer()) {
    return payload["order_id"].get<std::int64_t>();
  }
  return -1;
}

// The JSON-lines file, read as it grows.
class PublishedFile final : public Published {
 public:
  explicit PublishedFile(std::string path) : path_(std::move(path)) {}
  ~PublishedFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  PublishedFile(const PublishedFile&) = delete;
  PublishedFile& operator=(const PublishedFile&) = delete;

  // Reads the complete lines appended since the last call (none while the file does not exist).
  void Poll() override {
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;
    std::array<char, 65536> buffer{};
    for (;;) {
      const ssize_t count = ::read(fd_, buffer.data(), buffer.size());
      if (count < 0 && errno == EINTR) continue;
      if (count <= 0) break;
      partial_.append(buffer.data(), static_cast<std::size_t>(count));
    }
    std::size_t start = 0;
    for (std::size_t end = partial_.find('\n'); end != std::string::npos;
         end = partial_.find('\n', start)) {
      Parse(std::string_view{partial_}.substr(start, end - start));
      start = end + 1;
    }
    partial_.erase(0, start);
  }

 private:
  void Parse(std::string_view line) {
    if (line.empty()) return;
    const nlohmann::json json = nlohmann::json::parse(line, nullptr, false);
    if (json.is_discarded() || !json.is_object() || !json.contains("id") ||
        !json["id"].is_string()) {
      AddMalformed();
      return;
    }
    Delivery delivery;
    delivery.id = json["id"].get<std::string>();
    if (json.contains("stream_key") && json["stream_key"].is_string()) {
      delivery.stream_key = json["stream_key"].get<std::string>();
    }
    if (json.contains("stream_seq") && json["stream_seq"].is_number_integer()) {
      delivery.stream_seq = json["stream_seq"].get<std::int64_t>();
    }
    if (json.contains("payload")) delivery.order_id = PayloadOrderId(json["payload"]);
    Add(std::move(delivery));
  }

  std::string path_;
  int fd_ = -1;
  std::string partial_;
};

// ---- What outboxd published to RabbitMQ: a plain rabbitmq-c consumer of the demo's queue ----

struct AmqpConnDeleter {
  void operator()(amqp_connection_state_t conn) const noexcept {
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
  }
};
using AmqpConn = std::unique_ptr<amqp_connection_state_t_, AmqpConnDeleter>;

std::string AmqpReplyText(const amqp_rpc_reply_t& reply) {
  switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return "ok";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return amqp_error_string2(reply.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD ||
          reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        // Both methods start with reply_code and reply_text.
        const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
        return std::to_string(close->reply_code) + " " +
               std::string(static_cast<const char*>(close->reply_text.bytes),
                           close->reply_text.len);
      }
      return "refused by the broker";
    default:
      return "no reply";
  }
}

// Connects to `url` and opens channel 1. Throws when it cannot.
AmqpConn AmqpConnect(const std::string& url) {
  std::string parsed = url;  // amqp_parse_url cuts it up in place
  amqp_connection_info info{};
  amqp_default_connection_info(&info);
  if (amqp_parse_url(parsed.data(), &info) != AMQP_STATUS_OK) {
    throw std::runtime_error("not an amqp:// URL: " + Redacted(url));
  }
  const std::string where = "RabbitMQ at " + Redacted(url);
  AmqpConn conn{amqp_new_connection()};
  amqp_socket_t* socket = amqp_tcp_socket_new(conn.get());
  if (socket == nullptr) throw std::runtime_error(where + ": cannot create a socket");
  timeval timeout{5, 0};
  const int opened = amqp_socket_open_noblock(socket, info.host, info.port, &timeout);
  if (opened != AMQP_STATUS_OK) {
    throw std::runtime_error("cannot connect to " + where + ": " + amqp_error_string2(opened));
  }
  const char* vhost = info.vhost[0] == '\0' ? "/" : info.vhost;  // "amqp://host/" means "/"
  const amqp_rpc_reply_t login =
      amqp_login(conn.get(), vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password);
  if (login.reply_type != AMQP_RESPONSE_NORMAL) {
    throw std::runtime_error("cannot log in to " + where + ": " + AmqpReplyText(login));
  }
  amqp_channel_open(conn.get(), 1);
  const amqp_rpc_reply_t opened_channel = amqp_get_rpc_reply(conn.get());
  if (opened_channel.reply_type != AMQP_RESPONSE_NORMAL) {
    throw std::runtime_error(where + ": channel.open: " + AmqpReplyText(opened_channel));
  }
  return conn;
}

void DeleteQueue(const std::string& url, const std::string& queue) {
  const AmqpConn conn = AmqpConnect(url);
  amqp_queue_delete(conn.get(), 1, amqp_cstring_bytes(queue.c_str()), 0, 0);
  const amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn.get());
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
    throw std::runtime_error("queue.delete " + queue + ": " + AmqpReplyText(reply));
  }
}

// Declares `queue` (durable) and consumes it with manual acks, as any independent consumer would:
// message_id is the event id, the headers outbox-stream-key and outbox-stream-seq its stream and
// place in it, the body its payload. Polled from one thread.
class QueueConsumer final : public Published {
 public:
  QueueConsumer(const std::string& url, std::string queue)
      : queue_(std::move(queue)), conn_(AmqpConnect(url)) {
    amqp_queue_declare(conn_.get(), 1, amqp_cstring_bytes(queue_.c_str()), /*passive=*/0,
                       /*durable=*/1, /*exclusive=*/0, /*auto_delete=*/0, amqp_empty_table);
    Check("queue.declare " + queue_);
    amqp_basic_qos(conn_.get(), 1, 0, /*prefetch_count=*/1000, 0);
    Check("basic.qos");
    amqp_basic_consume(conn_.get(), 1, amqp_cstring_bytes(queue_.c_str()), amqp_empty_bytes,
                       /*no_local=*/0, /*no_ack=*/0, /*exclusive=*/0, amqp_empty_table);
    Check("basic.consume " + queue_);
  }

  // Takes what has arrived (at most a few thousand deliveries, so that progress is shown), then
  // acks all of it at once.
  void Poll() override { Receive(timeval{0, 0}, 5000); }

  // Takes deliveries until none has come for half a second (outboxd has stopped: nothing more is
  // on its way).
  void Finish() override {
    const auto deadline = Clock::now() + std::chrono::seconds{30};
    while (conn_ && Clock::now() < deadline && Receive(timeval{0, 500000}, 5000) > 0) {
    }
  }

  // Closes the connection (what was not acked goes back to the queue).
  void Close() { conn_.reset(); }

 private:
  void Check(const std::string& what) {
    const amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn_.get());
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
      throw std::runtime_error("RabbitMQ: " + what + ": " + AmqpReplyText(reply));
    }
  }

  // Returns the number of deliveries taken.
  int Receive(timeval wait, int max_deliveries) {
    if (!conn_) return 0;
    int taken = 0;
    std::uint64_t last_tag = 0;
    while (taken < max_deliveries) {
      amqp_maybe_release_buffers(conn_.get());
      amqp_envelope_t envelope{};
      timeval timeout = taken == 0 ? wait : timeval{0, 0};
      const amqp_rpc_reply_t reply = amqp_consume_message(conn_.get(), &envelope, &timeout, 0);
      if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
          reply.library_error == AMQP_STATUS_TIMEOUT) {
        break;
      }
      if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        SetError("consuming " + queue_ + ": " + AmqpReplyText(reply));
        conn_.reset();
        return taken;
      }
      Record(envelope.message);
      last_tag = envelope.delivery_tag;
      amqp_destroy_envelope(&envelope);
      ++taken;
    }
    if (last_tag != 0 && amqp_basic_ack(conn_.get(), 1, last_tag, /*multiple=*/1) != 0) {
      SetError("acking on " + queue_ + ": the connection failed");
      conn_.reset();
    }
    return taken;
  }

  void Record(const amqp_message_t& message) {
    const auto text = [](const amqp_bytes_t& bytes) {
      return std::string(static_cast<const char*>(bytes.bytes), bytes.len);
    };
    const amqp_basic_properties_t& properties = message.properties;
    if ((properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) == 0) {
      AddMalformed();
      return;
    }
    Delivery delivery;
    delivery.id = text(properties.message_id);
    if ((properties._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
      for (int i = 0; i < properties.headers.num_entries; ++i) {
        const amqp_table_entry_t& entry = properties.headers.entries[i];
        const std::string key = text(entry.key);
        if (key == outbox::wire::kStreamKeyHeader && entry.value.kind == AMQP_FIELD_KIND_UTF8) {
          delivery.stream_key = text(entry.value.value.bytes);
        } else if (key == outbox::wire::kStreamSeqHeader &&
                   entry.value.kind == AMQP_FIELD_KIND_I64) {
          delivery.stream_seq = entry.value.value.i64;
        }
      }
    }
    const nlohmann::json payload = nlohmann::json::parse(text(message.body), nullptr, false);
    if (!payload.is_discarded()) delivery.order_id = PayloadOrderId(payload);
    Add(std::move(delivery));
  }

  std::string queue_;
  AmqpConn conn_;
};

// ---- What outboxd published to Kafka: a plain librdkafka consumer of the demo's topic ----

struct KafkaDeleter {
  void operator()(rd_kafka_t* handle) const noexcept { rd_kafka_destroy(handle); }
  void operator()(rd_kafka_conf_t* conf) const noexcept { rd_kafka_conf_destroy(conf); }
  void operator()(rd_kafka_topic_t* topic) const noexcept { rd_kafka_topic_destroy(topic); }
  void operator()(rd_kafka_message_t* message) const noexcept { rd_kafka_message_destroy(message); }
  void operator()(rd_kafka_queue_t* queue) const noexcept { rd_kafka_queue_destroy(queue); }
  void operator()(rd_kafka_event_t* event) const noexcept { rd_kafka_event_destroy(event); }
  void operator()(rd_kafka_topic_partition_list_t* list) const noexcept {
    rd_kafka_topic_partition_list_destroy(list);
  }
  void operator()(const rd_kafka_metadata_t* metadata) const noexcept {
    rd_kafka_metadata_destroy(metadata);
  }
};
template <typename T>
using KafkaPtr = std::unique_ptr<T, KafkaDeleter>;

// A client of `brokers` that logs errors only (librdkafka prints them to stderr).
KafkaPtr<rd_kafka_t> KafkaClient(rd_kafka_type_t type, const std::string& brokers) {
  KafkaPtr<rd_kafka_conf_t> conf{rd_kafka_conf_new()};
  std::array<char, 512> error{};
  const std::vector<std::pair<std::string, std::string>> properties = {
      {"bootstrap.servers", brokers},
      {"log_level", "3"},
      {"group.id", "outbox-quickstart"},  // required of a consumer; nothing is committed
      {"enable.auto.commit", "false"},
      {"enable.partition.eof", "false"}};
  for (const auto& [name, value] : properties) {
    if (type == RD_KAFKA_PRODUCER && name != "bootstrap.servers" && name != "log_level") continue;
    if (rd_kafka_conf_set(conf.get(), name.c_str(), value.c_str(), error.data(), error.size()) !=
        RD_KAFKA_CONF_OK) {
      throw std::runtime_error("Kafka: " + name + ": " + error.data());
    }
  }
  KafkaPtr<rd_kafka_t> handle{rd_kafka_new(type, conf.get(), error.data(), error.size())};
  if (!handle) throw std::runtime_error(std::string{"Kafka: "} + error.data());
  static_cast<void>(conf.release());  // rd_kafka_new took it over
  return handle;
}

// The partition count of `topic`, waiting (up to 10 s) until the cluster knows it. A producer's
// metadata request also makes a cluster that auto-creates topics (the mock does) create it.
int TopicPartitions(rd_kafka_t* client, const std::string& topic) {
  const KafkaPtr<rd_kafka_topic_t> handle{rd_kafka_topic_new(client, topic.c_str(), nullptr)};
  std::string reason = "no answer";
  for (int attempt = 0; attempt < 20; ++attempt) {
    const rd_kafka_metadata_t* raw = nullptr;
    const rd_kafka_resp_err_t error = rd_kafka_metadata(client, 0, handle.get(), &raw, 5000);
    const KafkaPtr<const rd_kafka_metadata_t> metadata{raw};
    if (error != RD_KAFKA_RESP_ERR_NO_ERROR) {
      reason = rd_kafka_err2str(error);
    } else if (metadata->topic_cnt == 1 && metadata->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
               metadata->topics[0].partition_cnt > 0) {
      return metadata->topics[0].partition_cnt;
    } else if (metadata->topic_cnt == 1) {
      reason = rd_kafka_err2str(metadata->topics[0].err);
    }
    std::this_thread::sleep_for(milliseconds{500});
  }
  throw std::runtime_error("Kafka: topic " + topic + " is not there: " + reason);
}

// Creates `topic` (`create`: with the cluster's default partitions and replication; a topic that
// exists already counts as created) or deletes it: "" when the cluster did it, otherwise why not.
std::string KafkaAdmin(const std::string& brokers, const std::string& topic, bool create) {
  const KafkaPtr<rd_kafka_t> client = KafkaClient(RD_KAFKA_PRODUCER, brokers);
  const KafkaPtr<rd_kafka_queue_t> queue{rd_kafka_queue_new(client.get())};
  std::array<char, 512> error{};
  if (create) {
    // The cluster's default partition count and replication factor.
    rd_kafka_NewTopic_t* spec =
        rd_kafka_NewTopic_new(topic.c_str(), -1, -1, error.data(), error.size());
    if (spec == nullptr) return error.data();
    rd_kafka_CreateTopics(client.get(), &spec, 1, nullptr, queue.get());
    rd_kafka_NewTopic_destroy(spec);
  } else {
    rd_kafka_DeleteTopic_t* spec = rd_kafka_DeleteTopic_new(topic.c_str());
    rd_kafka_DeleteTopics(client.get(), &spec, 1, nullptr, queue.get());
    rd_kafka_DeleteTopic_destroy(spec);
  }
  const KafkaPtr<rd_kafka_event_t> event{rd_kafka_queue_poll(queue.get(), 15000)};
  if (!event) return "no answer in 15 s";
  if (rd_kafka_event_error(event.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return rd_kafka_event_error_string(event.get());
  }
  std::size_t count = 0;
  const rd_kafka_topic_result_t** results =
      create ? rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event.get()),
                                                   &count)
             : rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(event.get()),
                                                   &count);
  for (std::size_t i = 0; i < count; ++i) {
    const rd_kafka_resp_err_t code = rd_kafka_topic_result_error(results[i]);
    if (code == RD_KAFKA_RESP_ERR_NO_ERROR ||
        (create && code == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)) {
      continue;
    }
    const char* text = rd_kafka_topic_result_error_string(results[i]);
    return text != nullptr ? text : rd_kafka_err2str(code);
  }
  return "";
}

// Reads every partition of `topic` from its beginning, as any independent consumer would (no
// offsets committed): message_id is the event id, the record key its stream, the header
// outbox-stream-seq its place in it, the value its payload. Polled from one thread.
class TopicConsumer final : public Published {
 public:
  TopicConsumer(const std::string& brokers, const std::string& topic)
      : handle_(KafkaClient(RD_KAFKA_CONSUMER, brokers)) {
    const int partitions = TopicPartitions(handle_.get(), topic);
    const KafkaPtr<rd_kafka_topic_partition_list_t> assignment{
        rd_kafka_topic_partition_list_new(partitions)};
    for (int partition = 0; partition < partitions; ++partition) {
      rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), partition)->offset =
          RD_KAFKA_OFFSET_BEGINNING;
    }
    const rd_kafka_resp_err_t error = rd_kafka_assign(handle_.get(), assignment.get());
    if (error != RD_KAFKA_RESP_ERR_NO_ERROR) {
      throw std::runtime_error("Kafka: assigning " + topic + ": " + rd_kafka_err2str(error));
    }
  }

  // Takes what has arrived (at most a few thousand records, so that progress is shown).
  void Poll() override { Receive(0, 5000); }

  // Takes records until none has come for half a second (outboxd has stopped: nothing more is on
  // its way).
  void Finish() override {
    const auto deadline = Clock::now() + std::chrono::seconds{30};
    while (handle_ && Clock::now() < deadline && Receive(500, 5000) > 0) {
    }
  }

  void Close() {
    if (handle_) rd_kafka_consumer_close(handle_.get());
    handle_.reset();
  }

 private:
  // Returns the number of records taken; waits up to `wait_ms` for the first.
  int Receive(int wait_ms, int max_records) {
    if (!handle_) return 0;
    int taken = 0;
    while (taken < max_records) {
      const KafkaPtr<rd_kafka_message_t> message{
          rd_kafka_consumer_poll(handle_.get(), taken == 0 ? wait_ms : 0)};
      if (!message) break;
      if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;  // transient (a broker away)
      Record(*message);
      ++taken;
    }
    return taken;
  }

  void Record(const rd_kafka_message_t& message) {
    const auto header = [&message](const char* name) -> std::optional<std::string> {
      rd_kafka_headers_t* headers = nullptr;
      const void* value = nullptr;
      std::size_t size = 0;
      if (rd_kafka_message_headers(&message, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR ||
          rd_kafka_header_get_last(headers, name, &value, &size) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return std::nullopt;
      }
      return std::string(static_cast<const char*>(value), size);
    };
    const auto id = header(outbox::wire::kMessageId.data());
    const auto seq = header(outbox::wire::kStreamSeqHeader.data());
    const std::string key =
        message.key == nullptr
            ? ""
            : std::string(static_cast<const char*>(message.key), message.key_len);
    // The key is the stream: the header outbox-stream-key must agree with it.
    if (!id || header(outbox::wire::kStreamKeyHeader.data()).value_or("") != key) {
      AddMalformed();
      return;
    }
    Delivery delivery;
    delivery.id = *id;
    delivery.stream_key = key;
    if (seq) delivery.stream_seq = std::strtoll(seq->c_str(), nullptr, 10);
    const nlohmann::json payload = nlohmann::json::parse(
        std::string_view(static_cast<const char*>(message.payload), message.len), nullptr, false);
    if (!payload.is_discarded()) delivery.order_id = PayloadOrderId(payload);
    Add(std::move(delivery));
  }

  KafkaPtr<rd_kafka_t> handle_;
};

// ---- outboxd (and outbox-kafka-mock), as child processes ----

class ChildProcess {
 public:
  // Starts `argv` (argv[0]: the program's path) with standard input from /dev/null and its output
  // appended to `log`; with `pipe_stdout`, its standard output goes to a pipe that FirstLine reads
  // instead. Safe while other threads run (librdkafka's): everything is prepared before fork, and
  // the child makes only async-signal-safe calls until exec.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log,
               bool pipe_stdout = false) {
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error("cannot create " + log + ": " + std::strerror(errno));
    std::array<int, 2> out{-1, -1};
    if (pipe_stdout && ::pipe2(out.data(), O_CLOEXEC) != 0) {
      ::close(log_fd);
      throw std::runtime_error(std::string{"pipe: "} + std::strerror(errno));
    }
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));  // NOLINT
    args.push_back(nullptr);
    const std::string failed = "quickstart_demo: cannot execute " + argv[0] + "\n";
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(log_fd);
      throw std::runtime_error(std::string{"fork: "} + std::strerror(errno));
    }
    if (pid_ == 0) {
      // Only async-signal-safe calls from here on. The relay drains when this program dies.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
      const int null_fd = ::open("/dev/null", O_RDONLY);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      ::dup2(pipe_stdout ? out[1] : log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::close_range(3, ~0U, 0);  // the demo's own connections are not the child's business
      ::execv(args[0], args.data());
      [[maybe_unused]] const ssize_t ignored = ::write(STDERR_FILENO, failed.data(), failed.size());
      ::_exit(127);
    }
    ::close(log_fd);
    if (pipe_stdout) {
      ::close(out[1]);
      stdout_fd_ = out[0];
    }
  }

  ~ChildProcess() {
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    if (!exit_code_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The first line the child writes to its standard output (pipe_stdout), waiting up to
  // `timeout`; nullopt when it exits or says nothing in time.
  std::optional<std::string> FirstLine(milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string line;
    while (stdout_fd_ >= 0 && Clock::now() < deadline) {
      pollfd fd{.fd = stdout_fd_, .events = POLLIN, .revents = 0};
      if (::poll(&fd, 1, 50) <= 0) continue;
      char c = 0;
      if (::read(stdout_fd_, &c, 1) != 1) return std::nullopt;
      if (c == '\n') return line;
      line += c;
    }
    return std::nullopt;
  }

  // The exit code once it has exited (128 + n for signal n), nullopt while it runs.
  std::optional<int> Poll() {
    if (exit_code_) return exit_code_;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return exit_code_;
  }

  // SIGTERM (outboxd drains and exits), then waits up to `timeout`; nullopt when it did not exit.
  std::optional<int> Stop(milliseconds timeout) {
    if (Poll()) return exit_code_;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    while (!Poll() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds{20});
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::optional<int> exit_code_;
};

std::string Tail(const std::string& path, std::size_t max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out = lines.empty() ? "    (empty)\n" : "";
  for (std::size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size();
       ++i) {
    out += "    " + lines[i] + "\n";
  }
  return out;
}

// ---- The run ----

// The demo's schema and queue on the servers, dropped when the run ends, pass or fail.
class ServerObjects {
 public:
  ServerObjects(const Options& options, std::string schema, std::string queue)
      : options_(options), schema_(std::move(schema)), queue_(std::move(queue)) {}
  ~ServerObjects() {
    try {
      Drop();
    } catch (...) {  // NOLINT(bugprone-empty-catch): best effort while a failure propagates
    }
  }
  ServerObjects(const ServerObjects&) = delete;
  ServerObjects& operator=(const ServerObjects&) = delete;

  // Drops what was created; says what it did (or what it could not do).
  std::string Drop() {
    std::string done;
    if (schema_created) {
      schema_created = false;
      try {
        const PgConn conn = PgConnect(options_.postgres);
        PgExec(conn.get(), "SET lock_timeout = '10s'");
        PgExec(conn.get(), "SET client_min_messages = warning");  // no NOTICE per dropped table
        PgExec(conn.get(), "DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
        done = "schema " + schema_ + " dropped";
      } catch (const std::exception& error) {
        done = "schema " + schema_ + " NOT dropped (" + error.what() + ")";
      }
    }
    if (queue_declared) {
      queue_declared = false;
      try {
        DeleteQueue(options_.amqp, queue_);
        done += (done.empty() ? "" : ", ") + ("queue " + queue_ + " deleted");
      } catch (const std::exception& error) {
        done += (done.empty() ? "" : ", ") +
                ("queue " + queue_ + " NOT deleted (" + error.what() + ")");
      }
    }
    if (topic_created) {  // the queue's name is the topic's
      topic_created = false;
      const std::string why = KafkaAdmin(kafka_brokers, queue_, /*create=*/false);
      done += (done.empty() ? "" : ", ") +
              ("topic " + queue_ + " " + (why.empty() ? "deleted" : "NOT deleted (" + why + ")"));
    }
    return done;
  }

  bool schema_created = false;  // set before the attempt: dropping what is not there is fine
  bool queue_declared = false;
  bool topic_created = false;  // on kafka_brokers, a cluster given with --kafka
  std::string kafka_brokers;

 private:
  const Options& options_;
  std::string schema_;
  std::string queue_;
};

// What the writer has done so far; the monitor thread reads it.
struct Progress {
  std::atomic<int> orders{0};
  std::atomic<int> rolled_back_orders{0};
  std::atomic<std::int64_t> committed_events{0};
  std::atomic<bool> writer_done{false};
  std::atomic<bool> writer_failed{false};  // stop watching at once
};

// What the application wrote, by event id. Written by the writer; read by others only after
// Progress::writer_done.
struct Ledger {
  std::unordered_map<std::string, std::int64_t> committed;  // event id -> order id
  std::unordered_set<std::string> rolled_back;
};

// How the waiting for outboxd ended.
struct Watch {
  std::optional<Clock::time_point> all_published_at;
  std::optional<int> relay_exit;  // outboxd exited by itself (it should not)
};

bool AllCommittedPublished(const Ledger& ledger, const Published& file) {
  if (file.distinct() < ledger.committed.size()) return false;
  return std::all_of(ledger.committed.begin(), ledger.committed.end(),
                     [&](const auto& entry) { return file.Contains(entry.first); });
}

// Shows progress until every committed event is in the file, outboxd exits, or the timeout after
// the writer finished passes.
Watch Monitor(const Options& options, const Progress& progress, const Ledger& ledger,
              Published& file, ChildProcess& relay, Clock::time_point started) {
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  const milliseconds print_every{tty ? 100 : 1000};
  auto next_print = Clock::now() + print_every;
  std::optional<Clock::time_point> writer_done_at;
  std::optional<std::size_t> checked_distinct;
  Watch watch;
  const auto print = [&](bool last) {
    const double elapsed = Seconds(Clock::now() - started);
    const auto published = static_cast<std::int64_t>(file.distinct());
    std::string line =
        "  orders " + Grouped(progress.orders.load()) + "/" + Grouped(options.orders) + " (" +
        Grouped(progress.rolled_back_orders.load()) +
        " rolled back)  events: " + Grouped(progress.committed_events.load()) + " committed, " +
        Grouped(published) + " published  " +
        Grouped(
            static_cast<std::int64_t>(static_cast<double>(published) / std::max(elapsed, 0.001))) +
        " events/s  " + Fixed(elapsed, 1) + " s";
    if (tty) {
      std::cout << "\r" << line << "\x1b[K" << (last ? "\n" : "") << std::flush;
    } else {
      std::cout << line << "\n" << std::flush;
    }
  };
  for (;;) {
    std::this_thread::sleep_for(milliseconds{25});
    file.Poll();
    if (!watch.relay_exit) watch.relay_exit = relay.Poll();
    if (!writer_done_at && progress.writer_done.load(std::memory_order_acquire)) {
      writer_done_at = Clock::now();
    }
    if (progress.writer_failed.load() || !file.error().empty()) break;
    if (writer_done_at) {
      if (file.distinct() != checked_distinct && AllCommittedPublished(ledger, file)) {
        watch.all_published_at = Clock::now();
        break;
      }
      checked_distinct = file.distinct();
      if (watch.relay_exit) break;
      if (Clock::now() - *writer_done_at > std::chrono::seconds{options.timeout_seconds}) break;
    }
    if (Clock::now() >= next_print) {
      print(false);
      next_print += print_every;
    }
  }
  print(true);
  return watch;
}

// A line of the summary: label, value, verdict.
void Row(const std::string& label, const std::string& value, const std::string& note = "") {
  std::string line = "  " + label;
  line.resize(std::max<std::size_t>(line.size() + 1, 42), ' ');
  std::string padded_value = value;
  if (padded_value.size() < 10) padded_value.insert(0, 10 - padded_value.size(), ' ');
  std::cout << line << padded_value << (note.empty() ? "" : "  " + note) << "\n";
}

int Run(const Options& options) {
  // The working directory and its files, fresh each run.
  fs::path dir;
  if (options.dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "outbox-quickstart-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    dir = pattern;
  } else {
    dir = fs::absolute(options.dir);
    fs::create_directories(dir);
  }
  const std::string db_path = (dir / "app.db").string();
  const std::string config_path = (dir / "outboxd.toml").string();
  const std::string log_path = (dir / "outboxd.log").string();
  const std::string events_path = (dir / "events.jsonl").string();
  for (const std::string& stale :
       {db_path, db_path + "-wal", db_path + "-shm", config_path, log_path, events_path}) {
    fs::remove(stale);
  }
  std::string outboxd = options.outboxd;
  if (outboxd.empty()) {
    outboxd = (fs::read_symlink("/proc/self/exe").parent_path() / "outboxd").string();
  }
  if (::access(outboxd.c_str(), X_OK) != 0) {
    std::cerr << "quickstart_demo: outboxd not found at " << outboxd << " (use --outboxd PATH)\n";
    return 2;
  }

  // --kafka without brokers: outbox-kafka-mock, started first and stopped last.
  std::optional<ChildProcess> mock;
  std::string kafka_brokers = options.kafka;
  if (options.StartsMock()) {
    std::string program = options.kafka_mock;
    if (program.empty()) {
      program = (fs::read_symlink("/proc/self/exe").parent_path() / "outbox-kafka-mock").string();
    }
    if (::access(program.c_str(), X_OK) != 0) {
      std::cerr << "quickstart_demo: outbox-kafka-mock not found at " << program
                << " (use --kafka-mock PATH, or --kafka BROKERS for a Kafka cluster)\n";
      return 2;
    }
    const std::string mock_log = (dir / "kafka-mock.log").string();
    fs::remove(mock_log);
    mock.emplace(std::vector<std::string>{program, "--brokers", "3"}, mock_log,
                 /*pipe_stdout=*/true);
    const auto bootstraps = mock->FirstLine(std::chrono::seconds{10});
    if (!bootstraps) {
      throw std::runtime_error("outbox-kafka-mock printed no bootstrap servers; its log: " +
                               mock_log);
    }
    kafka_brokers = *bootstraps;
  }

  // With the servers: the demo's own schema and queue (or topic), unique per run.
  const std::string pid = std::to_string(::getpid());
  const std::string schema = "quickstart_" + pid;
  const std::string queue = "outbox-quickstart-" + pid + "-orders";
  if (options.UsesServers()) {
    {
      std::ofstream config(config_path);
      config << "# Written by quickstart_demo: outboxd on PostgreSQL, publishing to "
             << (options.UsesKafka() ? "Kafka" : "RabbitMQ") << ".\n"
             << "[database]\ntype = \"postgres\"\nurl = " << TomlString(options.postgres)
             << "\nschema = " << TomlString(schema) << "\n\n[relay]\ninstance = \"quickstart\"\n\n"
             << "[http]\n# No operations listener: the demo never takes a port.\nlisten = \"\"\n\n";
      if (options.UsesKafka()) {
        config << "[sinks.default]\ntype = \"kafka\"\nbrokers = " << TomlString(kafka_brokers)
               << "\n# The demo's own topic, " << queue
               << ".\ntopic = " << TomlString("outbox-quickstart-" + pid + "-{topic}") << "\n";
      } else {
        config << "[sinks.default]\ntype = \"rabbitmq\"\nurl = " << TomlString(options.amqp)
               << "\n# The default exchange routes by queue name: to the demo's own queue, "
               << queue
               << ".\nrouting_key = " << TomlString("outbox-quickstart-" + pid + "-{topic}")
               << "\n";
      }
    }
    fs::permissions(config_path, fs::perms::owner_read | fs::perms::owner_write);  // passwords
    std::cout << "outbox quickstart: " << Grouped(options.orders)
              << " orders, each with its events in one PostgreSQL transaction ("
              << options.rollback_percent << " % rolled back on purpose),\n"
              << "while outboxd relays the events to "
              << (options.UsesKafka() ? "Kafka" : "RabbitMQ")
              << ", where this program consumes them\n"
              << "  database  " << Redacted(options.postgres) << ", schema " << schema
              << " (dropped at the end)\n"
              << "  relay     " << outboxd << " --config " << config_path << "\n";
    if (!options.UsesKafka()) {
      std::cout << "  queue     " << queue << " on " << Redacted(options.amqp)
                << " (deleted at the end)\n\n";
    } else if (mock) {
      std::cout << "  topic     " << queue << " on " << kafka_brokers << "\n"
                << "            outbox-kafka-mock, started here: librdkafka's mock cluster, a "
                   "protocol mock, not Kafka\n            (3 brokers, records in memory only; "
                   "stopped at the end)\n\n";
    } else {
      std::cout << "  topic     " << queue << " on " << kafka_brokers
                << " (deleted at the end)\n\n";
    }
  } else {
    std::ofstream(config_path) << "# Written by quickstart_demo: outboxd on the embedded store.\n"
                               << "[database]\ntype = \"sqlite\"\npath = " << TomlString(db_path)
                               << "\n\n[relay]\ninstance = \"quickstart\"\n"
                               << "# SQLite cannot notify: the sweep finds what other processes "
                                  "commit.\nsweep_interval = \"20ms\"\n\n"
                               << "[http]\n# No operations listener: the demo never takes a port.\n"
                                  "listen = \"\"\n\n"
                               << "[sinks.default]\ntype = \"file\"\npath = "
                               << TomlString(events_path) << "\n";
    std::cout << "outbox quickstart: " << Grouped(options.orders)
              << " orders, each with its events in"
              << " one SQLite transaction (" << options.rollback_percent
              << " % rolled back on purpose),\nwhile outboxd relays the events to a JSON-lines "
                 "file\n"
              << "  database  " << db_path << "\n"
              << "  relay     " << outboxd << " --config " << config_path << "\n"
              << "  output    " << events_path << "\n\n";
  }

  // Declared before the relay: dropped after outboxd is gone, also when the run throws.
  ServerObjects server_objects(options, schema, queue);
  std::unique_ptr<Shop> shop;
  std::unique_ptr<Published> published;
  QueueConsumer* consumer = nullptr;
  TopicConsumer* topic_consumer = nullptr;
  if (options.UsesServers()) {
    server_objects.schema_created = true;
    outbox::postgres::Migrate(options.postgres, schema);
    shop = std::make_unique<PostgresShop>(options.postgres, schema);
    if (options.UsesKafka()) {
      if (!mock) {  // the mock does not implement CreateTopics; it creates a topic when asked
        server_objects.kafka_brokers = kafka_brokers;
        server_objects.topic_created = true;
        const std::string why = KafkaAdmin(kafka_brokers, queue, /*create=*/true);
        if (!why.empty()) std::cout << "  (creating the topic: " << why << ")\n";
      }
      TopicPartitions(KafkaClient(RD_KAFKA_PRODUCER, kafka_brokers).get(), queue);
      auto reader = std::make_unique<TopicConsumer>(kafka_brokers, queue);
      topic_consumer = reader.get();
      published = std::move(reader);
    } else {
      server_objects.queue_declared = true;
      auto queue_consumer = std::make_unique<QueueConsumer>(options.amqp, queue);
      consumer = queue_consumer.get();
      published = std::move(queue_consumer);
    }
  } else {
    outbox::sqlite::Migrate(db_path);  // outboxd does the same at its start; both are idempotent
    shop = std::make_unique<SqliteShop>(db_path);
    published = std::make_unique<PublishedFile>(events_path);
  }
  Published& file = *published;
  ChildProcess relay({outboxd, "--config", config_path}, log_path);

  Progress progress;
  Ledger ledger;
  const auto started = Clock::now();
  Watch watch;
  std::thread monitor([&] { watch = Monitor(options, progress, ledger, file, relay, started); });

  std::mt19937_64 random(options.seed);
  std::int64_t rolled_back_events = 0;
  std::exception_ptr failure;
  try {
    for (int order = 1; order <= options.orders; ++order) {
      const int customer = static_cast<int>(random() % static_cast<std::uint64_t>(options.streams));
      const bool roll_back = random() % 100 < static_cast<std::uint64_t>(options.rollback_percent);
      shop->PlaceOrder(order, customer + 1, roll_back,
                       [&](const std::vector<outbox::MessageId>& ids) {
                         for (const outbox::MessageId& id : ids) {
                           if (roll_back) {
                             ledger.rolled_back.insert(id.ToString());
                           } else {
                             ledger.committed.emplace(id.ToString(), order);
                           }
                         }
                         const auto count = static_cast<std::int64_t>(ids.size());
                         if (roll_back) {
                           rolled_back_events += count;
                           progress.rolled_back_orders.fetch_add(1, std::memory_order_relaxed);
                         } else {
                           progress.committed_events.fetch_add(count, std::memory_order_relaxed);
                         }
                       });
      progress.orders.fetch_add(1, std::memory_order_relaxed);
    }
  } catch (...) {
    failure = std::current_exception();
    progress.writer_failed.store(true);
  }
  const auto written_at = Clock::now();
  progress.writer_done.store(true, std::memory_order_release);
  monitor.join();
  if (failure) std::rethrow_exception(failure);

  const std::optional<int> relay_exit =
      watch.relay_exit ? watch.relay_exit : relay.Stop(std::chrono::seconds{30});
  file.Finish();  // what the drain published
  // The checks need neither server from here on.
  std::string cleanup;
  if (options.UsesServers()) {
    shop.reset();
    if (consumer != nullptr) consumer->Close();
    if (topic_consumer != nullptr) topic_consumer->Close();
    cleanup = server_objects.Drop();
    if (mock) {
      const std::optional<int> code = mock->Stop(std::chrono::seconds{10});
      cleanup += ", outbox-kafka-mock stopped" +
                 (code == 0 ? std::string{} : " (it did not exit cleanly)") +
                 ": the topic lived in its memory";
    }
  }

  // The checks, from the file alone against what the application committed.
  const auto committed = static_cast<std::int64_t>(ledger.committed.size());
  std::int64_t lost = 0;
  for (const auto& entry : ledger.committed) lost += file.Contains(entry.first) ? 0 : 1;
  std::int64_t phantom = 0;
  std::int64_t rolled_back_published = 0;
  std::int64_t payload_mismatch = 0;
  std::set<std::string> streams_out_of_order;
  std::unordered_set<std::string> first_seen;
  std::map<std::string, std::vector<std::int64_t>> stream_seqs;  // first deliveries, file order
  for (const Delivery& delivery : file.deliveries()) {
    if (!first_seen.insert(delivery.id).second) continue;  // a duplicate
    const auto found = ledger.committed.find(delivery.id);
    if (found == ledger.committed.end()) {
      ++phantom;
      if (ledger.rolled_back.contains(delivery.id)) ++rolled_back_published;
      continue;
    }
    if (delivery.order_id != found->second) ++payload_mismatch;
    auto& seqs = stream_seqs[delivery.stream_key];
    if (!seqs.empty() && delivery.stream_seq <= seqs.back()) {
      streams_out_of_order.insert(delivery.stream_key);
    }
    seqs.push_back(delivery.stream_seq);
  }
  // A stream is also broken when its published stream_seq are not exactly 1..n (the rolled back
  // transactions took no number).
  for (auto& [stream, seqs] : stream_seqs) {
    std::sort(seqs.begin(), seqs.end());
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i] != static_cast<std::int64_t>(i) + 1) {
        streams_out_of_order.insert(stream);
        break;
      }
    }
  }
  const auto broken_streams = static_cast<std::int64_t>(streams_out_of_order.size());
  const auto lines = static_cast<std::int64_t>(file.deliveries().size());
  const auto distinct = static_cast<std::int64_t>(file.distinct());
  const bool relay_ok = !watch.relay_exit && relay_exit == 0;
  const bool ok = lost == 0 && phantom == 0 && rolled_back_published == 0 &&
                  payload_mismatch == 0 && broken_streams == 0 && file.malformed() == 0 &&
                  file.error().empty() && relay_ok;

  const auto verdict = [](bool passed) { return std::string{passed ? "ok" : "FAILED"}; };
  const int committed_orders = options.orders - progress.rolled_back_orders.load();
  std::cout << "\nsummary\n";
  Row("orders written", Grouped(options.orders),
      Grouped(committed_orders) + " committed, " + Grouped(progress.rolled_back_orders.load()) +
          " rolled back on purpose");
  Row("events committed", Grouped(committed));
  Row("events published (distinct ids)", Grouped(distinct));
  Row("duplicates", Grouped(lines - distinct), "(at-least-once allows them; ids dedupe)");
  Row("rolled back, never published", Grouped(rolled_back_events - rolled_back_published),
      "of " + Grouped(rolled_back_events) + "  " + verdict(rolled_back_published == 0));
  Row("lost (committed, not published)", Grouped(lost), verdict(lost == 0));
  Row("phantom (published, not committed)", Grouped(phantom), verdict(phantom == 0));
  Row("streams out of order", Grouped(broken_streams),
      "of " + Grouped(static_cast<std::int64_t>(stream_seqs.size())) +
          " (stream_seq 1..n, first deliveries in order)  " + verdict(broken_streams == 0));
  Row("payloads intact", Grouped(distinct - phantom - payload_mismatch),
      verdict(payload_mismatch == 0 && file.malformed() == 0));
  if (watch.relay_exit) {
    Row("outboxd", "exited",
        "by itself with code " + std::to_string(*watch.relay_exit) + "  " + verdict(false));
  } else {
    Row("outboxd stopped by SIGTERM", relay_exit ? "exit " + std::to_string(*relay_exit) : "hung",
        verdict(relay_ok) + (relay_exit ? "" : " (killed after 30 s)"));
  }
  if (!file.error().empty()) {
    Row(options.UsesKafka() ? "Kafka consumer" : "RabbitMQ consumer", "failed",
        file.error() + "  FAILED");
  }
  const double write_seconds = std::max(Seconds(written_at - started), 1e-3);
  std::cout << "  application: " << Grouped(options.orders) << " transactions in "
            << Fixed(write_seconds, 2) << " s ("
            << Grouped(static_cast<std::int64_t>(options.orders / write_seconds)) << " orders/s)\n";
  if (watch.all_published_at) {
    const double relay_seconds = std::max(Seconds(*watch.all_published_at - started), 1e-3);
    std::cout << "  outboxd: every committed event published " << Fixed(relay_seconds, 2)
              << " s after the start ("
              << Grouped(static_cast<std::int64_t>(static_cast<double>(committed) / relay_seconds))
              << " events/s), the last one "
              << Fixed(std::max(0.0, Seconds(*watch.all_published_at - written_at)), 2)
              << " s after the last commit\n";
  } else if (watch.relay_exit) {
    std::cout << "  outboxd: exited before it published every committed event\n";
  } else {
    std::cout << "  outboxd: did not publish every committed event within "
              << options.timeout_seconds << " s after the last commit\n";
  }
  if (!cleanup.empty()) std::cout << "  cleanup: " << cleanup << "\n";
  if (!ok) {
    std::cout << "FAILED. outboxd's log (" << log_path << "), last lines:\n" << Tail(log_path, 15);
    return 1;
  }
  std::cout << "PASS: " << Grouped(committed) << " committed events published, 0 lost, 0 phantom, "
            << "nothing rolled back published. Files: " << dir.string() << "\n";
  if (!options.UsesServers()) {
    // The SQLite file stays: an operator can look at it in the dashboard (outboxd's /ui).
    const std::string dashboard = WriteDashboardConfig(dir, db_path, events_path);
    std::cout << "Look at this outbox in the dashboard: run\n  " << outboxd << " --config "
              << dashboard << "\nthen open http://127.0.0.1:9780/ui (its token is in that file)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "The outbox quickstart: orders and their events in SQLite transactions, relayed by outboxd "
      "to a JSON-lines file (or, with --postgres and --amqp or --kafka, in PostgreSQL "
      "transactions, relayed to RabbitMQ or Kafka), then checked: nothing lost, nothing rolled "
      "back published",
      "quickstart_demo"};
  Options options;
  app.add_option("--orders", options.orders, "Orders to write")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  app.add_option("--streams", options.streams, "Customers (ordered streams) the orders spread over")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--rollback-percent", options.rollback_percent,
                 "Share of the order transactions rolled back on purpose")
      ->capture_default_str()
      ->check(CLI::Range(0, 90));
  app.add_option("--dir", options.dir,
                 "Working directory (default: a new /tmp/outbox-quickstart-XXXXXX); its app.db, "
                 "events.jsonl, outboxd.toml and outboxd.log are replaced");
  app.add_option("--outboxd", options.outboxd, "The outboxd binary (default: next to this one)");
  app.add_option("--timeout", options.timeout_seconds,
                 "Seconds to wait, after the last commit, for every event to be published")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--seed", options.seed, "Seed choosing customers and rollbacks")
      ->capture_default_str();
  app.add_option("--postgres", options.postgres,
                 "With --amqp: the application and the outbox on this PostgreSQL (a libpq URL), "
                 "in a schema of the demo's own, quickstart_<pid>, dropped at the end");
  app.add_option("--amqp", options.amqp,
                 "With --postgres: outboxd publishes to this RabbitMQ (amqp://user:password@host:"
                 "port/vhost), to a queue of the demo's own that it consumes and deletes at the "
                 "end");
  auto* kafka = app.add_option("--kafka", options.kafka,
                               "With --postgres, instead of --amqp: outboxd publishes to this "
                               "Kafka (host:port,...), to a topic of the demo's own that it reads "
                               "and deletes at the end; with no value (or \"mock\"), to "
                               "outbox-kafka-mock started here (a protocol mock, not Kafka)")
                    ->expected(0, 1);
  app.add_option("--kafka-mock", options.kafka_mock,
                 "The outbox-kafka-mock binary (default: next to this one)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;  // --help exits 0, a bad option 2
  }
  options.kafka_given = kafka->count() > 0;
  if (options.kafka_given && (!options.amqp.empty() || options.postgres.empty())) {
    std::cerr << "quickstart_demo: --kafka "
              << (options.amqp.empty() ? "needs --postgres (PostgreSQL for the application and "
                                         "the outbox, Kafka for outboxd to publish to)"
                                       : "and --amqp: choose one broker")
              << "\n";
    return 2;
  }
  if (!options.kafka_given && options.postgres.empty() != options.amqp.empty()) {
    std::cerr << "quickstart_demo: " << (options.postgres.empty() ? "--amqp" : "--postgres")
              << " needs " << (options.postgres.empty() ? "--postgres" : "--amqp")
              << ": give both (PostgreSQL for the application and the outbox, RabbitMQ for "
                 "outboxd to publish to), --postgres with --kafka, or neither for the SQLite "
                 "demo\n";
    return 2;
  }
  try {
    return Run(options);
  } catch (const std::exception& error) {
    std::cerr << "quickstart_demo: " << error.what() << "\n";
    return 1;
  }
}
