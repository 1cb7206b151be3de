#include <nlohmann/json.hpp>
#include <stdexcept>

#include "handle.h"
#include "outbox/core/error.h"
#include "outbox/core/partition.h"
#include "outbox/store/sqlite.h"

namespace outbox::sqlite {

MessageId Writer::Enqueue(sqlite3* db, const NewMessage& message) const {
  return Enqueue(db, std::span{&message, 1}).front();
}

std::vector<MessageId> Writer::Enqueue(sqlite3* db, std::span<const NewMessage> messages) const {
  if (sqlite3_get_autocommit(db) != 0) {
    throw std::logic_error(
        "outbox enqueue: no open transaction on this connection; call BEGIN first (the writer "
        "never commits for you)");
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (auto error = ValidateMessage(messages[i], limits_); !error.empty()) {
      throw InvalidMessage("outbox enqueue: message " + std::to_string(i) + ": " + error);
    }
  }
  Statement settings{db, "SELECT partition_count FROM outbox_settings"};
  if (!settings.Step()) {
    throw StoreError(FailureKind::kPermanent, "outbox enqueue: the database is not migrated");
  }
  const int partition_count = static_cast<int>(settings.Int(0));
  Statement next_seq{db,
                     "INSERT INTO outbox_streams (stream_key, last_seq) VALUES (?, 1) "
                     "ON CONFLICT (stream_key) DO UPDATE SET last_seq = last_seq + 1 "
                     "RETURNING last_seq"};
  Statement insert{db, std::string{"INSERT INTO outbox_messages (id, topic, stream_key, "
                                   "stream_seq, partition, target, type, payload, content_type, "
                                   "headers, available_at, created_at) VALUES (?, ?, ?, ?, ?, ?, "
                                   "?, ?, ?, ?, "} +
                           kNowMillis + ", " + kNowMillis + ")"};
  std::vector<MessageId> ids;
  for (const auto& message : messages) {
    const MessageId id = NewUuidV7();
    insert.Bind(1, id.ToString()).Bind(2, message.topic).BindOptional(3, message.stream_key);
    if (message.stream_key && message.sequenced.value_or(true)) {
      next_seq.Bind(1, *message.stream_key);
      next_seq.Step();
      insert.Bind(4, next_seq.Int(0));
      next_seq.Reset();
    } else {
      insert.BindNull(4);
    }
    nlohmann::json headers = nlohmann::json::object();
    for (const auto& [name, value] : message.headers) headers[name] = value;
    insert.Bind(5, std::int64_t{PartitionFor(message.stream_key, id, partition_count)})
        .Bind(6, message.target)
        .BindOptional(7, message.type)
        .BindBlob(8, message.payload)
        .Bind(9, message.content_type)
        .Bind(10, headers.dump());
    insert.Step();
    insert.Reset();
    ids.push_back(id);
  }
  return ids;
}

}  // namespace outbox::sqlite
