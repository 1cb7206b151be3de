// An application that uses an installed outbox: migrates a schema of its own, enqueues one
// message in its transaction, commits, reads it back, drops the schema. Exits non-zero on any
// failure. Run: outbox_consumer [conninfo]   (default: $OUTBOX_TEST_PG_URL)
#include <libpq-fe.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "outbox/core/version.h"
#include "outbox/store/postgres.h"

namespace {

using Connection = std::unique_ptr<PGconn, decltype(&PQfinish)>;
using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// Runs `sql` (parameters: `param`, if not null) and returns its result; throws on an error.
Result Exec(PGconn* conn, const std::string& sql, const char* param = nullptr) {
  Result result{param == nullptr
                    ? PQexec(conn, sql.c_str())
                    : PQexecParams(conn, sql.c_str(), 1, nullptr, &param, nullptr, nullptr, 0),
                &PQclear};
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error(sql + ": " + PQerrorMessage(conn));
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("OUTBOX_TEST_PG_URL");
  const std::string conninfo = argc > 1 ? argv[1] : env != nullptr ? env : "";
  if (conninfo.empty()) {
    std::cerr << "usage: outbox_consumer <conninfo> (or set OUTBOX_TEST_PG_URL)\n";
    return 2;
  }
  const std::string schema = "outbox_consumer_" + std::to_string(getpid());
  Connection conn{PQconnectdb(conninfo.c_str()), &PQfinish};
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    std::cerr << "outbox_consumer: cannot connect: " << PQerrorMessage(conn.get());
    return 1;
  }
  int status = 0;
  try {
    outbox::postgres::Migrate(conn.get(), schema);
    std::cout << "outbox " << outbox::kVersion << ": schema " << schema << " at version "
              << outbox::postgres::LatestSchemaVersion() << "\n";

    const outbox::postgres::Writer writer{schema};
    Exec(conn.get(), "BEGIN");
    const outbox::MessageId id = writer.Enqueue(
        conn.get(), outbox::NewMessage{.topic = "orders", .payload = R"({"order":42})"});
    Exec(conn.get(), "COMMIT");

    const std::string id_text = id.ToString();
    const Result count = Exec(
        conn.get(), "SELECT count(*) FROM " + schema + ".messages WHERE id = $1", id_text.c_str());
    const std::string found = PQgetvalue(count.get(), 0, 0);
    if (found != "1") {
      throw std::runtime_error("message " + id_text + " committed, but " + found + " rows found");
    }
    std::cout << "enqueued and committed message " << id_text << "\n";
  } catch (const std::exception& error) {
    std::cerr << "outbox_consumer: " << error.what() << "\n";
    status = 1;
  }
  try {
    if (PQtransactionStatus(conn.get()) != PQTRANS_IDLE) Exec(conn.get(), "ROLLBACK");
    Exec(conn.get(), "SET client_min_messages TO warning");  // no list of what the drop drops
    Exec(conn.get(), "DROP SCHEMA IF EXISTS " + schema + " CASCADE");
  } catch (const std::exception& error) {
    std::cerr << "outbox_consumer: " << error.what() << "\n";
    status = 1;
  }
  return status;
}
