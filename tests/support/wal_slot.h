#pragma once
// A schema that delivers by WAL (issue #20) for as long as a test needs it: its replication slot
// (postgres::EnsureWalSlot) and settings.delivery = 'wal'. The slot is dropped when the guard
// dies, retrying for up to a minute (a killed relay's walsender may hold it a moment; the server
// may be restarting), on a connection of its own (the test's may be broken): a leaked slot keeps
// WAL forever and takes one of the server's few slots.

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "support/pg_test_support.h"

namespace outbox::testing {

class WalSlot {
 public:
  explicit WalSlot(const std::string& schema) : schema_(schema) {
    try {
      auto conn = Connect();
      // Creating a slot waits for every running write transaction of the server to end.
      Sql(conn.get(), "SET statement_timeout = '90s'");
      slot_ = postgres::EnsureWalSlot(conn.get(), schema_);
      Sql(conn.get(), "UPDATE " + schema_ + ".settings SET delivery = 'wal'");
    } catch (...) {
      Drop();
      throw;
    }
  }
  ~WalSlot() { Drop(); }
  WalSlot(const WalSlot&) = delete;
  WalSlot& operator=(const WalSlot&) = delete;

  [[nodiscard]] const std::string& name() const { return slot_; }

  // The server's WAL insert position now (an LSN as text), for ConfirmedUpTo.
  static std::string InsertPosition() {
    auto conn = Connect();
    return Scalar(conn.get(), "SELECT pg_current_wal_insert_lsn()::text");
  }

  // True once the slot's reader has confirmed the WAL up to `position`: an idle WAL relay confirms
  // what the server sent only when everything it read is published and recorded.
  [[nodiscard]] bool ConfirmedUpTo(const std::string& position) const {
    auto conn = Connect();
    return Scalar(conn.get(),
                  "SELECT coalesce(confirmed_flush_lsn >= '" + position +
                      "'::pg_lsn, false)::text FROM pg_replication_slots WHERE slot_name = '" +
                      slot_ + "'") == "true";
  }

  // True once the slot is gone.
  bool Drop() noexcept {
    if (dropped_) return true;
    std::string last;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{60};
    while (std::chrono::steady_clock::now() < until) {
      try {
        auto conn = Connect();
        postgres::DropWalSlot(conn.get(), schema_);
        dropped_ = true;
        return true;
      } catch (const std::exception& error) {
        last = error.what();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{250});
    }
    std::fprintf(stderr, "[ wal ] COULD NOT DROP the replication slot of schema %s: %s\n",
                 schema_.c_str(), last.c_str());
    return false;
  }

 private:
  std::string schema_;
  std::string slot_;
  bool dropped_ = false;
};

}  // namespace outbox::testing
