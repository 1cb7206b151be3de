// A consumer that applies each outbox message from a RabbitMQ queue to a table exactly once,
// however often the broker delivers it: the inbox record and the table row are written in one
// PostgreSQL transaction, and the delivery is acked only after that commit.
//
//   rabbitmq_inbox_consumer --amqp amqp://guest:guest@127.0.0.1:5672/ --queue orders
//       --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
//       [--table applied_orders] [--dead-letter orders.dead-letter]
//
// On connecting it declares its queue (durable) with a dead-letter exchange (RabbitMQ's
// x-dead-letter-exchange), and that exchange (fanout, durable) with one durable queue bound to
// it, both named by --dead-letter (default "<queue>.dead-letter"). If the queue already exists
// with other arguments the broker refuses, and the consumer exits with status 1 saying so:
// declare the queue with x-dead-letter-exchange = "<dead-letter>", or delete it.
//
// Each delivery is
//   - acked after the commit when the inbox says processed or duplicate;
//   - requeued when it is out of order (its stream's previous message is not processed yet) or
//     the database failed, after a delay that doubles from 50 ms to 1 s while nothing else is
//     processed, so that a consumer waiting for a predecessor does not spin;
//   - rejected without requeue, so that the broker moves it to the dead-letter queue once, and
//     logged once, when it is invalid (a stream_seq out of range or an unreadable outbox header:
//     it could never be processed) or not from an outbox (no UUID message_id).
// Runs until SIGTERM/SIGINT, then prints what it did.

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <libpq-fe.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "outbox/inbox/inbox.h"
#include "outbox/inbox/rabbitmq.h"
#include "outbox/store/postgres.h"

namespace {

using std::chrono::milliseconds;

std::atomic<bool> stopping{false};

// The wait before requeueing a delivery that cannot be processed yet: doubles from kFirstDelay
// to kMaxDelay while nothing is processed, and starts again after a success.
constexpr milliseconds kFirstDelay{50};
constexpr milliseconds kMaxDelay{1000};

// Sleeps for `delay`, or less when asked to stop.
void Pause(milliseconds delay) {
  const auto until = std::chrono::steady_clock::now() + delay;
  while (!stopping && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::min(milliseconds{20}, delay));
  }
}

// The broker's setup is wrong in a way that retrying will not fix.
struct SetupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct AmqpCloser {
  void operator()(amqp_connection_state_t conn) const noexcept {
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
  }
};
using Amqp = std::unique_ptr<amqp_connection_state_t_, AmqpCloser>;

struct PgCloser {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
using Pg = std::unique_ptr<PGconn, PgCloser>;

bool Run(PGconn* conn, const char* sql) {
  std::unique_ptr<PGresult, decltype(&PQclear)> result{PQexec(conn, sql), &PQclear};
  return PQresultStatus(result.get()) == PGRES_COMMAND_OK;
}

std::string Text(const amqp_bytes_t& bytes) {
  return {static_cast<const char*>(bytes.bytes), bytes.len};
}

// The reply code and text of a channel.close the broker answered an RPC with (0 and "" when it
// did not).
std::pair<int, std::string> ChannelClose(const amqp_rpc_reply_t& reply) {
  if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
      reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
    return {close->reply_code, Text(close->reply_text)};
  }
  return {0, ""};
}

// Declares the dead-letter exchange and its queue, then `queue` dead-lettering to them. Returns
// false if the broker went away; throws SetupError if it refused the declarations.
bool DeclareQueues(amqp_connection_state_t conn, const std::string& queue,
                   const std::string& dead_letter) {
  // True when the last RPC succeeded, false when the connection failed (try again later).
  const auto answered = [&](const std::string& what) {
    const auto reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type == AMQP_RESPONSE_NORMAL) return true;
    const auto [code, text] = ChannelClose(reply);
    if (code == 0) return false;
    throw SetupError(what + " refused by the broker: " + text);
  };
  const amqp_bytes_t dead = amqp_cstring_bytes(dead_letter.c_str());
  amqp_exchange_declare(conn, 1, dead, amqp_cstring_bytes("fanout"), /*passive=*/0,
                        /*durable=*/1, /*auto_delete=*/0, /*internal=*/0, amqp_empty_table);
  if (!answered("exchange.declare of " + dead_letter)) return false;
  amqp_queue_declare(conn, 1, dead, /*passive=*/0, /*durable=*/1, /*exclusive=*/0,
                     /*auto_delete=*/0, amqp_empty_table);
  if (!answered("queue.declare of " + dead_letter)) return false;
  amqp_queue_bind(conn, 1, dead, dead, amqp_empty_bytes, amqp_empty_table);
  if (!answered("queue.bind of " + dead_letter)) return false;
  amqp_table_entry_t argument{};
  argument.key = amqp_cstring_bytes("x-dead-letter-exchange");
  argument.value.kind = AMQP_FIELD_KIND_UTF8;
  argument.value.value.bytes = dead;
  amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue.c_str()), /*passive=*/0, /*durable=*/1,
                     /*exclusive=*/0, /*auto_delete=*/0, amqp_table_t{1, &argument});
  try {
    return answered("queue.declare of " + queue);
  } catch (const SetupError& error) {
    throw SetupError(std::string{error.what()} + " (does queue '" + queue +
                     "' exist without x-dead-letter-exchange = \"" + dead_letter +
                     "\"? declare it with that argument, or delete it)");
  }
}

// Connects, opens channel 1, declares the queues, sets the prefetch and starts consuming;
// nullptr if the broker is away.
Amqp ConnectAndConsume(const std::string& url_text, const std::string& queue,
                       const std::string& dead_letter) {
  std::string url = url_text;
  amqp_connection_info info{};
  if (amqp_parse_url(url.data(), &info) != AMQP_STATUS_OK) return nullptr;
  Amqp conn{amqp_new_connection()};
  timeval timeout{2, 0};
  if (amqp_socket_open_noblock(amqp_tcp_socket_new(conn.get()), info.host, info.port, &timeout) !=
      AMQP_STATUS_OK) {
    return nullptr;
  }
  const char* vhost = info.vhost[0] == '\0' ? "/" : info.vhost;
  if (amqp_login(conn.get(), vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password)
          .reply_type != AMQP_RESPONSE_NORMAL) {
    return nullptr;
  }
  amqp_channel_open(conn.get(), 1);
  if (amqp_get_rpc_reply(conn.get()).reply_type != AMQP_RESPONSE_NORMAL) return nullptr;
  if (!DeclareQueues(conn.get(), queue, dead_letter)) return nullptr;
  amqp_basic_qos(conn.get(), 1, 0, 100, 0);
  amqp_basic_consume(conn.get(), 1, amqp_cstring_bytes(queue.c_str()), amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  if (amqp_get_rpc_reply(conn.get()).reply_type != AMQP_RESPONSE_NORMAL) return nullptr;
  return conn;
}

}  // namespace

int main(int argc, char** argv) {
  // First, so that a stop that comes while the program starts ends it cleanly (exit 0).
  std::signal(SIGTERM, [](int) { stopping = true; });
  std::signal(SIGINT, [](int) { stopping = true; });
  CLI::App app{"Applies outbox messages from a RabbitMQ queue to a table exactly once"};
  std::string amqp_url = "amqp://guest:guest@127.0.0.1:5672/";
  std::string queue, db, schema = "outbox", consumer = "example-consumer", table = "applied";
  std::string dead_letter;
  app.add_option("--amqp", amqp_url, "RabbitMQ URL");
  app.add_option("--queue", queue, "queue to consume")->required();
  app.add_option("--db", db, "PostgreSQL connection string")->required();
  app.add_option("--schema", schema, "outbox schema (holds the inbox tables)");
  app.add_option("--consumer", consumer, "inbox consumer name");
  app.add_option("--table", table, "table to apply messages to (created if missing)");
  app.add_option(
      "--dead-letter", dead_letter,
      "dead-letter exchange and queue for invalid deliveries (default <queue>.dead-letter)");
  CLI11_PARSE(app, argc, argv);
  if (dead_letter.empty()) dead_letter = queue + ".dead-letter";

  outbox::postgres::Migrate(db, schema);
  Pg pg{PQconnectdb(db.c_str())};
  const std::string create = "CREATE TABLE IF NOT EXISTS " + table +
                             " (id uuid, stream_key text, stream_seq bigint, payload text)";
  PQclear(PQexec(pg.get(), "SET client_min_messages = warning"));
  if (!Run(pg.get(), create.c_str())) {
    std::fprintf(stderr, "cannot create %s: %s", table.c_str(), PQerrorMessage(pg.get()));
    return 1;
  }
  const outbox::inbox::Inbox inbox({.consumer = consumer, .schema = schema});
  const std::string insert = "INSERT INTO " + table + " VALUES ($1, $2, $3, $4)";
  long processed = 0, duplicates = 0, requeued = 0, dead_lettered = 0;
  std::fprintf(stderr, "rabbitmq_inbox_consumer: consuming queue '%s' into %s as '%s'\n",
               queue.c_str(), table.c_str(), consumer.c_str());
  milliseconds delay{0};  // before the next requeue; see kFirstDelay

  Amqp amqp;
  while (!stopping) {
    try {
      if (!amqp && !(amqp = ConnectAndConsume(amqp_url, queue, dead_letter))) {
        std::this_thread::sleep_for(milliseconds{200});
        continue;
      }
    } catch (const SetupError& error) {
      std::fprintf(stderr, "cannot consume: %s\n", error.what());
      return 1;
    }
    amqp_maybe_release_buffers(amqp.get());
    amqp_envelope_t envelope{};
    timeval timeout{0, 200000};
    const auto reply = amqp_consume_message(amqp.get(), &envelope, &timeout, 0);
    if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        reply.library_error == AMQP_STATUS_TIMEOUT) {
      continue;
    }
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
      amqp.reset();  // broker gone: unacked deliveries come back after we reconnect
      continue;
    }
    std::string error;
    const auto delivery = outbox::inbox::FromAmqp(envelope.message.properties, &error);
    bool ack = false, requeue = false;
    if (!delivery) {
      std::fprintf(stderr, "dead-lettering a message that is not from an outbox: %s\n",
                   error.c_str());
      ++dead_lettered;
    } else if (const std::string invalid = outbox::inbox::Validate(*delivery); !invalid.empty()) {
      // Inbox::Process would say kInvalid: it can never be processed, so it is not requeued.
      std::fprintf(stderr, "dead-lettering message %s: %s\n", delivery->id.ToString().c_str(),
                   invalid.c_str());
      ++dead_lettered;
    } else {
      const std::string body(static_cast<const char*>(envelope.message.body.bytes),
                             envelope.message.body.len);
      try {
        if (PQstatus(pg.get()) != CONNECTION_OK) PQreset(pg.get());
        if (!Run(pg.get(), "BEGIN")) throw std::runtime_error(PQerrorMessage(pg.get()));
        const auto result = inbox.Process(pg.get(), *delivery, [&](pg_conn* c) {
          const std::string id = delivery->id.ToString();
          const std::string seq = delivery->stream_seq ? std::to_string(*delivery->stream_seq) : "";
          const char* values[] = {id.c_str(),
                                  delivery->stream_key ? delivery->stream_key->c_str() : nullptr,
                                  delivery->stream_seq ? seq.c_str() : nullptr, body.c_str()};
          std::unique_ptr<PGresult, decltype(&PQclear)> r{
              PQexecParams(c, insert.c_str(), 4, nullptr, values, nullptr, nullptr, 0), &PQclear};
          if (PQresultStatus(r.get()) != PGRES_COMMAND_OK)
            throw std::runtime_error(PQerrorMessage(c));
        });
        if (!Run(pg.get(), "COMMIT")) throw std::runtime_error(PQerrorMessage(pg.get()));
        switch (result) {
          case outbox::inbox::Result::kProcessed:
            ++processed;
            ack = true;
            break;
          case outbox::inbox::Result::kDuplicate:
            ++duplicates;
            ack = true;
            break;
          case outbox::inbox::Result::kOutOfOrder:
            ++requeued;
            requeue = true;
            break;
          case outbox::inbox::Result::kInvalid:  // Validate said otherwise above
            std::fprintf(stderr, "dead-lettering message %s: invalid\n",
                         delivery->id.ToString().c_str());
            ++dead_lettered;
            break;
        }
      } catch (const std::exception& failure) {
        Run(pg.get(), "ROLLBACK");
        std::fprintf(stderr, "will retry %s: %s\n", delivery->id.ToString().c_str(),
                     failure.what());
        requeue = true;
      }
    }
    if (ack) {
      delay = milliseconds{0};
      amqp_basic_ack(amqp.get(), 1, envelope.delivery_tag, 0);
    } else if (requeue) {
      // Not yet: wait a little (longer each time nothing else moves), then hand it back.
      delay = std::clamp(delay * 2, kFirstDelay, kMaxDelay);
      Pause(delay);
      amqp_basic_reject(amqp.get(), 1, envelope.delivery_tag, /*requeue=*/1);
    } else {
      amqp_basic_reject(amqp.get(), 1, envelope.delivery_tag, /*requeue=*/0);  // dead-lettered
    }
    amqp_destroy_envelope(&envelope);
  }
  std::printf("processed %ld, duplicates %ld, requeued out of order %ld, dead-lettered %ld\n",
              processed, duplicates, requeued, dead_lettered);
  return 0;
}
