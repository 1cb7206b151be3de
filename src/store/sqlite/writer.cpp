#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "handle.h"
#include "outbox/core/error.h"
#include "outbox/core/partition.h"
#include "outbox/store/sqlite.h"

namespace outbox::sqlite {
namespace {

// The targets of a message that names none, of a topic without a row in outbox_topic_settings.
std::span<const std::string> DefaultTargets() {
  static const std::vector<std::string> targets{std::string{kDefaultTarget}};
  return targets;
}

// Prepares one of the writer's statements; a failure most likely means tables of an older version.
Statement Prepare(sqlite3* db, std::string_view sql) {
  try {
    return Statement{db, sql};
  } catch (const StoreError& error) {
    throw StoreError(error.kind(), std::string{"outbox enqueue: "} + error.what() +
                                       " (are the outbox tables migrated? call "
                                       "outbox::sqlite::Migrate)");
  }
}

// The default targets of `topic` in outbox_topic_settings (`probe`: ?1 the topic), checked like a
// message's own: a non-empty JSON array of distinct valid target names, at most kMaxTargets.
// nullopt when the topic has no row. Throws InvalidMessage naming message `index` and the topic.
std::optional<std::vector<std::string>> TopicTargets(Statement& probe, std::size_t index,
                                                     const std::string& topic) {
  probe.Bind(1, topic);
  if (!probe.Step()) {
    probe.Reset();
    return std::nullopt;
  }
  const std::string text = probe.Text(0);
  probe.Reset();
  const auto bad = [&](const std::string& why) {
    return InvalidMessage("outbox enqueue: message " + std::to_string(index) + ": topic '" + topic +
                          "': its default targets (outbox_topic_settings.targets) " + why);
  };
  std::vector<std::string> targets;
  if (auto why = ParseNameArray(text, targets); !why.empty()) throw bad(why);
  if (auto error = ValidateTargets(targets); !error.empty()) throw bad("are invalid: " + error);
  return targets;
}

// Writes each message once per target, calling on_copy(copy index, id) for each copy, message by
// message, in target order. Everything is checked, and every message's targets resolved, before the
// first row is written.
template <typename OnCopy>
void Write(sqlite3* db, std::span<const NewMessage> messages, const MessageLimits& limits,
           const OnCopy& on_copy) {
  if (sqlite3_get_autocommit(db) != 0) {
    throw std::logic_error(
        "outbox enqueue: no open transaction on this connection; call BEGIN first (the writer "
        "never commits for you)");
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (auto error = ValidateMessage(messages[i], limits); !error.empty()) {
      throw InvalidMessage("outbox enqueue: message " + std::to_string(i) + ": " + error);
    }
  }
  Statement settings{db, "SELECT partition_count FROM outbox_settings"};
  if (!settings.Step()) {
    throw StoreError(FailureKind::kPermanent, "outbox enqueue: the database is not migrated");
  }
  const int partition_count = static_cast<int>(settings.Int(0));

  // The targets of each message: its own, else its topic's defaults (one probe per topic and
  // call; nothing is kept across calls, so a change of outbox_topic_settings applies to the next
  // enqueue), else "default".
  std::vector<std::span<const std::string>> targets(messages.size());
  std::optional<Statement> probe;
  std::deque<std::vector<std::string>> topic_targets;  // stable: `targets` points into it
  std::map<std::string_view, std::span<const std::string>> by_topic;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const NewMessage& message = messages[i];
    if (!message.targets.empty()) {
      targets[i] = message.targets;
      continue;
    }
    if (const auto known = by_topic.find(message.topic); known != by_topic.end()) {
      targets[i] = known->second;
      continue;
    }
    if (!probe) probe = Prepare(db, "SELECT targets FROM outbox_topic_settings WHERE topic = ?1");
    if (auto defaults = TopicTargets(*probe, i, message.topic)) {
      targets[i] = topic_targets.emplace_back(std::move(*defaults));
    } else {
      targets[i] = DefaultTargets();
    }
    by_topic.emplace(message.topic, targets[i]);
  }

  // stream_seq counts per (target, stream). The counter of a pair is one UPDATE; only the first
  // message of a pair runs the INSERT, which starts the pair's count above its floor.
  //
  // The floor is the stream's last_seq in outbox_streams, the counter of the schema before
  // fan-out (one per stream across all targets; read, never written now). Each destination of
  // such a stream may already have seen seqs up to it, and an inbox drops a message whose seq it
  // has already passed as a duplicate: were a pair to restart at 1, its first messages would be
  // dropped unpublished. So a pair continues above the floor, and only a stream that has no row
  // there (first written since the upgrade) starts at 1.
  Statement next_seq = Prepare(db,
                               "UPDATE outbox_target_streams SET last_seq = last_seq + 1"
                               " WHERE target = ?1 AND stream_key = ?2 RETURNING last_seq");
  std::optional<Statement> first_seq;
  const auto stream_seq = [&](const std::string& target, const std::string& stream_key) {
    next_seq.Bind(1, target).Bind(2, stream_key);
    if (next_seq.Step()) {
      const std::int64_t seq = next_seq.Int(0);
      next_seq.Reset();
      return seq;
    }
    next_seq.Reset();
    if (!first_seq) {
      first_seq = Prepare(db,
                          "INSERT INTO outbox_target_streams (target, stream_key, last_seq)"
                          " SELECT ?1, ?2, coalesce((SELECT last_seq FROM outbox_streams"
                          "  WHERE stream_key = ?2), 0) + 1 RETURNING last_seq");
    }
    first_seq->Bind(1, target).Bind(2, stream_key);
    first_seq->Step();
    const std::int64_t seq = first_seq->Int(0);
    first_seq->Reset();
    return seq;
  };

  Statement insert = Prepare(
      db, std::string{"INSERT INTO outbox_messages (id, topic, stream_key, stream_seq, partition, "
                      "target, type, payload, content_type, headers, event_id, available_at, "
                      "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "} +
              kNowMillis + ", " + kNowMillis + ")");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const NewMessage& message = messages[i];
    const bool sequenced = message.stream_key && message.sequenced.value_or(true);
    const std::string headers = HeadersToJson(message.headers);
    // With several copies, each names the first as its event; one copy is its own event (NULL).
    std::optional<std::string> event_id;
    for (std::size_t copy = 0; copy < targets[i].size(); ++copy) {
      const std::string& target = targets[i][copy];
      const MessageId id = NewUuidV7();
      const std::string id_text = id.ToString();
      if (copy == 0 && targets[i].size() > 1) event_id = id_text;
      insert.Bind(1, id_text).Bind(2, message.topic).BindOptional(3, message.stream_key);
      if (sequenced) {
        insert.Bind(4, stream_seq(target, *message.stream_key));
      } else {
        insert.BindNull(4);
      }
      insert.Bind(5, std::int64_t{PartitionFor(message.stream_key, id, partition_count)})
          .Bind(6, target)
          .BindOptional(7, message.type)
          .BindBlob(8, message.payload)
          .Bind(9, message.content_type)
          .Bind(10, headers)
          .BindOptional(11, event_id);
      insert.Step();
      insert.Reset();
      on_copy(copy, id);
    }
  }
}

}  // namespace

MessageId Writer::Enqueue(sqlite3* db, const NewMessage& message) const {
  return Enqueue(db, std::span{&message, 1}).front();
}

std::vector<MessageId> Writer::Enqueue(sqlite3* db, std::span<const NewMessage> messages) const {
  std::vector<MessageId> ids;
  ids.reserve(messages.size());
  Write(db, messages, limits_, [&](std::size_t copy, const MessageId& id) {
    if (copy == 0) ids.push_back(id);
  });
  return ids;
}

std::vector<std::vector<MessageId>> Writer::EnqueueCopies(
    sqlite3* db, std::span<const NewMessage> messages) const {
  std::vector<std::vector<MessageId>> ids;
  ids.reserve(messages.size());
  Write(db, messages, limits_, [&](std::size_t copy, const MessageId& id) {
    if (copy == 0) ids.emplace_back();
    ids.back().push_back(id);
  });
  return ids;
}

}  // namespace outbox::sqlite
