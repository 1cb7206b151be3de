// Writes a business row and its event in one transaction, then claims and completes the event as
// a relay would. Run: examples/postgres_enqueue [conninfo]   (default: OUTBOX_TEST_PG_URL)
#include <libpq-fe.h>

#include <cstdlib>
#include <iostream>
#include <memory>

#include "outbox/store/postgres.h"

namespace {

struct ConnCloser {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};

bool Exec(PGconn* conn, const char* sql) {
  std::unique_ptr<PGresult, decltype(&PQclear)> result{PQexec(conn, sql), &PQclear};
  if (PQresultStatus(result.get()) == PGRES_COMMAND_OK) return true;
  std::cerr << sql << ": " << PQerrorMessage(conn);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("OUTBOX_TEST_PG_URL");
  const std::string conninfo = argc > 1 ? argv[1] : env != nullptr ? env : "";
  try {
    outbox::postgres::Migrate(conninfo, "example");

    std::unique_ptr<PGconn, ConnCloser> conn{PQconnectdb(conninfo.c_str())};
    if (!Exec(conn.get(), "CREATE TABLE IF NOT EXISTS example.orders (id int, total numeric)")) {
      return 1;
    }
    outbox::postgres::Writer writer{"example"};
    if (!Exec(conn.get(), "BEGIN") ||
        !Exec(conn.get(), "INSERT INTO example.orders VALUES (42, 99.50)")) {
      return 1;
    }
    outbox::NewMessage event{
        .topic = "orders", .payload = R"({"id":42})", .stream_key = "order-42"};
    const outbox::MessageId id = writer.Enqueue(conn.get(), event);
    if (!Exec(conn.get(), "COMMIT")) return 1;
    std::cout << "enqueued " << id.ToString() << "\n";

    auto store = outbox::postgres::OpenStore({.conninfo = conninfo, .schema = "example"});
    for (const auto& message : store->Claim({.owner = "example-relay", .max_messages = 100})) {
      std::cout << "claimed  " << message.id.ToString() << " topic=" << message.topic
                << " stream=" << message.stream_key.value_or("-")
                << " seq=" << message.stream_seq.value_or(0) << " payload=" << message.payload
                << "\n";
      const outbox::LeasedId lease = outbox::LeasedId::Of(message);
      store->Complete("example-relay", std::span{&lease, 1});
    }
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "example failed: " << error.what() << "\n";
    return 1;
  }
}
