#pragma once
// The SQLite store: the embedded default, for one relay instance in the same process or on the
// same host (SQLite has no network protocol and no NOTIFY). WAL mode and a busy timeout let
// writers and the relay work side by side; writers of one database serialize on SQLite's write
// lock, which also makes stream_seq gap-free and in commit order.
//
// Wake-ups: a writer in the relay's process hands ids over (RelayOptions::hand_off); other
// writers are found by the relay's sweep, so give it a short sweep_interval (it costs one indexed
// query per sweep on a local file).

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/core/random.h"
#include "outbox/core/retry_policy.h"
#include "outbox/store/admin.h"
#include "outbox/store/store.h"
#include "outbox/store/wakeup.h"

struct sqlite3;  // SQLite's connection type, declared so that this header does not include
                 // sqlite3.h

namespace outbox::sqlite {

// Creates or upgrades the outbox tables in the database at `path` (created if missing) and
// switches it to WAL mode; idempotent. Throws StoreError when the file cannot be opened.
void Migrate(const std::string& path, int partition_count = 64);
void Migrate(sqlite3* db, int partition_count = 64);

// Writes messages in the caller's open transaction on `db` (std::logic_error if there is none:
// call BEGIN first). Never commits. Throws InvalidMessage for a bad message (nothing written).
// A message goes to each of its targets (NewMessage::targets), or when it names none to its
// topic's default targets (the outbox_topic_settings table), else to "default".
class Writer {
 public:
  explicit Writer(MessageLimits limits = {}) : limits_(limits) {}
  // Returns, per message, its event id: the id of its first copy (its only one when it goes to
  // one target).
  std::vector<MessageId> Enqueue(sqlite3* db, std::span<const NewMessage> messages) const;
  MessageId Enqueue(sqlite3* db, const NewMessage& message) const;
  // The same, returning the ids of all copies of each message, in the order of its targets.
  std::vector<std::vector<MessageId>> EnqueueCopies(sqlite3* db,
                                                    std::span<const NewMessage> messages) const;

 private:
  MessageLimits limits_;
};

struct StoreOptions {
  std::string path;  // the database file
  RetryPolicy retry;
  RetentionPolicy retention;
  MessageLimits limits;
  std::chrono::milliseconds busy_timeout{5000};
  UniformRandom random;  // retry jitter; DefaultRandom() when empty
};

// Opens the relay-side Store on a connection of its own. The database must have been migrated.
// Throws ConfigError for bad options, StoreError when the file cannot be opened.
std::unique_ptr<Store> OpenStore(StoreOptions options);

// Opens the operator's side (outbox/store/admin.h) on a connection of its own. The database must
// have been migrated: StoreError(kPermanent) otherwise, StoreError when the file cannot be opened,
// std::invalid_argument for an empty path or a negative busy_timeout.
std::unique_ptr<Admin> OpenAdmin(const std::string& path,
                                 std::chrono::milliseconds busy_timeout = std::chrono::seconds{5});

// A Wakeup with no database side: Wait sleeps until Interrupt (the hand-off) or the deadline.
std::unique_ptr<Wakeup> OpenWakeup();

}  // namespace outbox::sqlite
