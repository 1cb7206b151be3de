// A consumer that applies each outbox message from a RabbitMQ queue to a table exactly once,
// however often the broker delivers it: the inbox record and the table row are written in one
// PostgreSQL transaction, and the delivery is acked only after that commit.
//
//   rabbitmq_inbox_consumer --amqp amqp://guest:guest@127.0.0.1:5672/ --queue orders
//       --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
//       [--table applied_orders]
//
// Runs until SIGTERM/SIGINT, then prints what it did. A message out of order (its stream's
// previous message not processed yet) is requeued; one that did not come from an outbox (no
// UUID message_id) is rejected without requeue.

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <libpq-fe.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "outbox/inbox/inbox.h"
#include "outbox/inbox/rabbitmq.h"
#include "outbox/store/postgres.h"

namespace {

std::atomic<bool> stopping{false};

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

// Connects, opens channel 1 with prefetch and starts consuming; nullptr if the broker is away.
Amqp ConnectAndConsume(const std::string& url_text, const std::string& queue) {
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
  amqp_basic_qos(conn.get(), 1, 0, 100, 0);
  amqp_basic_consume(conn.get(), 1, amqp_cstring_bytes(queue.c_str()), amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  if (amqp_get_rpc_reply(conn.get()).reply_type != AMQP_RESPONSE_NORMAL) return nullptr;
  return conn;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Applies outbox messages from a RabbitMQ queue to a table exactly once"};
  std::string amqp_url = "amqp://guest:guest@127.0.0.1:5672/";
  std::string queue, db, schema = "outbox", consumer = "example-consumer", table = "applied";
  app.add_option("--amqp", amqp_url, "RabbitMQ URL");
  app.add_option("--queue", queue, "queue to consume")->required();
  app.add_option("--db", db, "PostgreSQL connection string")->required();
  app.add_option("--schema", schema, "outbox schema (holds the inbox tables)");
  app.add_option("--consumer", consumer, "inbox consumer name");
  app.add_option("--table", table, "table to apply messages to (created if missing)");
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGTERM, [](int) { stopping = true; });
  std::signal(SIGINT, [](int) { stopping = true; });

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
  long processed = 0, duplicates = 0, requeued = 0, rejected = 0;

  Amqp amqp;
  while (!stopping) {
    if (!amqp && !(amqp = ConnectAndConsume(amqp_url, queue))) {
      std::this_thread::sleep_for(std::chrono::milliseconds{200});
      continue;
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
      std::fprintf(stderr, "rejecting a message that is not from an outbox: %s\n", error.c_str());
      ++rejected;
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
        }
      } catch (const std::exception& failure) {
        Run(pg.get(), "ROLLBACK");
        std::fprintf(stderr, "will retry %s: %s\n", delivery->id.ToString().c_str(),
                     failure.what());
        requeue = true;
      }
    }
    if (ack) {
      amqp_basic_ack(amqp.get(), 1, envelope.delivery_tag, 0);
    } else {
      amqp_basic_reject(amqp.get(), 1, envelope.delivery_tag, requeue ? 1 : 0);
    }
    amqp_destroy_envelope(&envelope);
  }
  std::printf("processed %ld, duplicates %ld, requeued out of order %ld, rejected %ld\n", processed,
              duplicates, requeued, rejected);
  return 0;
}
