#pragma once
// The writer contract as tests, run against every SQL store: what enqueue does when an application
// calls it in SQL (its validation, limits and errors, ids, stream_seq, partitions, fan-out,
// topic_settings, headers, locking between writers) and what the C++ Writer does. A store's test
// binary provides a WriterHarness and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Postgres, WriterContractTest, ::testing::Values(&harness));
//
// The harness renders each call in its database's syntax (PostgreSQL's named arguments,
// MariaDB's positional CALL) and reads the messages back in a common form, so that one test says
// what every store promises. Errors are compared by the database's message text: the stores word
// them alike ("outbox.enqueue: topic must not be empty").

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/core/uuid.h"

namespace outbox::testing {

// One call of enqueue as an application writes it. Unset fields are left to their defaults (SQL
// NULL); `null_topic` and `null_payload` pass an explicit NULL.
struct EnqueueCall {
  std::string topic = "t";
  bool null_topic = false;
  std::string payload = "{}";  // JSON text, or bytes when `bytes`
  bool null_payload = false;
  bool bytes = false;  // the bytes form (PostgreSQL: bytea; MariaDB: enqueue_bytes)
  std::optional<std::string> content_type;  // bytes only
  std::optional<std::string> stream_key;
  std::optional<std::string> type;
  std::optional<std::string> headers;  // JSON text
  std::optional<std::string> target;
  std::optional<std::vector<std::string>> targets;  // the fan-out form
  std::optional<std::string> correlation_id;
  std::optional<std::string> causation_id;
  std::optional<bool> sequenced;
};

// A row of the messages table, read back.
struct StoredMessage {
  MessageId id;
  std::optional<MessageId> event_id;
  std::string topic;
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;
  int partition = 0;
  std::string target;
  std::optional<std::string> type;
  std::string payload;
  std::string content_type;
  Headers headers;
  std::string status;
  int attempts = 0;
};

// What the database refused: its message text, and whether it asks the caller to run the
// transaction again (a deadlock or a serialization failure).
class EnqueueError : public std::runtime_error {
 public:
  EnqueueError(const std::string& message, bool retry)
      : std::runtime_error(message), retry_(retry) {}
  [[nodiscard]] bool retry() const { return retry_; }

 private:
  bool retry_;
};

enum class Isolation { kReadCommitted, kRepeatableRead };

// One connection to the outbox's database, as an application's.
class WriterSession {
 public:
  virtual ~WriterSession() = default;
  virtual void Begin(Isolation isolation = Isolation::kReadCommitted) = 0;
  virtual void Commit() = 0;
  virtual void Rollback() = 0;
  // enqueue in SQL: the event id (single-target forms) or each copy's id (the `targets` form).
  // Throws EnqueueError.
  virtual std::vector<MessageId> Enqueue(const EnqueueCall& call) = 0;
  // enqueue_batch with `json` (a JSON array): (ordinal, id) per copy. Throws EnqueueError.
  virtual std::vector<std::pair<std::int64_t, MessageId>> EnqueueBatch(const std::string& json) = 0;
  // The C++ Writer on this connection (in its open transaction). Throws what the Writer throws.
  virtual std::vector<std::vector<MessageId>> WriterEnqueue(
      std::span<const NewMessage> messages) = 0;
};

class WriterHarness {
 public:
  virtual ~WriterHarness() = default;
  // Starts from a fresh, migrated outbox.
  virtual void Reset() = 0;
  // A new connection. A waiting statement gives up after `lock_timeout` with EnqueueError
  // (retry: false); a deadlock is detected within about 100 ms.
  virtual std::unique_ptr<WriterSession> Connect(
      std::chrono::milliseconds lock_timeout = std::chrono::seconds{10}) = 0;
  // Every message, in id order.
  virtual std::vector<StoredMessage> Messages() = 0;
  // settings.<column> = value.
  virtual void SetSetting(const std::string& column, std::int64_t value) = 0;
  virtual std::int64_t Setting(const std::string& column) = 0;
  // A topic_settings row. Throws EnqueueError when the database refuses it.
  virtual void SetTopic(const std::string& topic, std::optional<bool> sequenced,
                        std::optional<std::vector<std::string>> targets) = 0;
  // Pretends the last message of a (target, stream) got `id` (a clock ahead of this one).
  virtual void SetStreamLastId(const std::string& target, const std::string& stream_key,
                               const MessageId& id) = 0;
};

class WriterContractTest : public ::testing::TestWithParam<WriterHarness*> {
 protected:
  void SetUp() override { GetParam()->Reset(); }
  WriterHarness& harness() { return *GetParam(); }
};

}  // namespace outbox::testing
