// Writes a business row and its event in one SQLite transaction, then claims and completes the
// event as a relay would. Run: examples/sqlite_enqueue [database file]   (default: a temporary
// file, removed at the end). No server needed.
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "outbox/store/sqlite.h"

namespace {

struct DbCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};

bool Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) == SQLITE_OK) return true;
  std::cerr << sql << ": " << (error != nullptr ? error : sqlite3_errmsg(db)) << "\n";
  sqlite3_free(error);
  return false;
}

// The application's side, then the relay's: 0 on success.
int Run(const std::string& path) {
  outbox::sqlite::Migrate(path);  // the outbox tables; idempotent

  sqlite3* raw = nullptr;
  const int opened = sqlite3_open(path.c_str(), &raw);
  std::unique_ptr<sqlite3, DbCloser> db{raw};
  if (opened != SQLITE_OK) {
    std::cerr << "cannot open " << path << ": " << sqlite3_errmsg(db.get()) << "\n";
    return 1;
  }
  sqlite3_busy_timeout(db.get(), 5000);  // wait for the relay's short write transactions
  if (!Exec(db.get(), "CREATE TABLE IF NOT EXISTS orders (id INTEGER, total REAL)")) return 1;

  // BEGIN IMMEDIATE takes the write lock at the start. A deferred transaction that reads first
  // and writes later cannot wait for the lock in WAL mode: it fails with SQLITE_BUSY_SNAPSHOT
  // when another connection (the relay) wrote in between, and must start again.
  outbox::sqlite::Writer writer;
  if (!Exec(db.get(), "BEGIN IMMEDIATE") ||
      !Exec(db.get(), "INSERT INTO orders VALUES (42, 99.50)")) {
    return 1;
  }
  outbox::NewMessage event{.topic = "orders", .payload = R"({"id":42})", .stream_key = "order-42"};
  const outbox::MessageId id = writer.Enqueue(db.get(), event);  // it never commits for you
  if (!Exec(db.get(), "COMMIT")) return 1;
  std::cout << "enqueued " << id.ToString() << "\n";

  // What outboxd does with it: claim under a lease, publish, complete.
  auto store = outbox::sqlite::OpenStore({.path = path});
  for (const auto& message : store->Claim({.owner = "example-relay", .max_messages = 100})) {
    std::cout << "claimed  " << message.id.ToString() << " topic=" << message.topic
              << " stream=" << message.stream_key.value_or("-")
              << " seq=" << message.stream_seq.value_or(0) << " payload=" << message.payload
              << "\n";
    const outbox::LeasedId lease = outbox::LeasedId::Of(message);
    store->Complete("example-relay", std::span{&lease, 1});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool temporary = argc < 2;
  const std::string path = temporary
                               ? (std::filesystem::temp_directory_path() /
                                  ("outbox-sqlite-example-" + std::to_string(::getpid()) + ".db"))
                                     .string()
                               : argv[1];
  int status = 1;
  try {
    status = Run(path);
  } catch (const std::exception& error) {
    std::cerr << "example failed: " << error.what() << "\n";
  }
  if (temporary) {
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  }
  return status;
}
