// The store-neutral half of the operator's side (outbox/store/admin.h): the checks of every
// argument, the chunking of changes and purges, and the folding of the backlog by topic.
#include "outbox/store/admin.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <tuple>

namespace outbox {
namespace {

constexpr std::array<std::string_view, 5> kStatusNames = {"pending", "processing", "failed",
                                                          "published", "abandoned"};

void ValidateFilter(std::string_view what, const MessageFilter& filter) {
  const auto prefix = std::string{what} + ": ";
  if (filter.status && static_cast<std::size_t>(*filter.status) >= kStatusNames.size()) {
    throw std::invalid_argument(prefix + "unknown status " +
                                std::to_string(static_cast<int>(*filter.status)));
  }
  if (filter.older_than && filter.older_than->count() < 0) {
    throw std::invalid_argument(prefix + "older_than must not be negative, got " +
                                std::to_string(filter.older_than->count()) + " s");
  }
  const auto non_empty = [&](const std::optional<std::string>& value, const char* name) {
    if (value && value->empty()) throw std::invalid_argument(prefix + name + " must not be empty");
  };
  non_empty(filter.topic, "topic");
  non_empty(filter.stream_key, "stream_key");
  non_empty(filter.target, "target");
}

// For Replay and Abandon: a selection is required, and a status filter must be one they act on.
void ValidateChange(std::string_view what, const MessageFilter& filter,
                    std::initializer_list<MessageStatus> eligible) {
  ValidateFilter(what, filter);
  if (filter.MatchesEverything()) {
    throw std::invalid_argument(std::string{what} +
                                ": refusing to act on every message; select by ids or a filter");
  }
  if (filter.status) {
    bool ok = false;
    std::string names;
    for (const MessageStatus status : eligible) {
      ok = ok || status == *filter.status;
      if (!names.empty()) names += " and ";
      names += MessageStatusName(status);
    }
    if (!ok) {
      throw std::invalid_argument(std::string{what} + ": acts only on " + names +
                                  " messages, not on " +
                                  std::string{MessageStatusName(*filter.status)} + " ones");
    }
  }
}

}  // namespace

std::string_view MessageStatusName(MessageStatus status) {
  const auto index = static_cast<std::size_t>(status);
  return index < kStatusNames.size() ? kStatusNames[index] : "unknown";
}

MessageStatus ParseMessageStatus(std::string_view name) {
  for (std::size_t i = 0; i < kStatusNames.size(); ++i) {
    if (kStatusNames[i] == name) return static_cast<MessageStatus>(i);
  }
  std::string valid;
  for (const auto known : kStatusNames) {
    if (!valid.empty()) valid += ", ";
    valid += known;
  }
  throw std::invalid_argument("unknown status '" + std::string{name} + "' (expected one of " +
                              valid + ")");
}

MessagePage Admin::List(const MessageFilter& filter, int limit, std::optional<MessageId> after) {
  ValidateFilter("list", filter);
  if (limit < 1 || limit > kMaxListLimit) {
    throw std::invalid_argument("list: limit must be between 1 and " +
                                std::to_string(kMaxListLimit) + ", got " + std::to_string(limit));
  }
  MessagePage page = ListPage(filter, limit + 1, after);  // one more: are there more?
  if (static_cast<int>(page.messages.size()) > limit) {
    page.messages.resize(static_cast<std::size_t>(limit));
    page.more = true;
  }
  return page;
}

ChangeResult Admin::Replay(const MessageFilter& filter, bool dry_run) {
  ValidateChange("replay", filter, {MessageStatus::kAbandoned, MessageStatus::kFailed});
  return Change(ChangeKind::kReplay, filter, std::string{}, dry_run);
}

ChangeResult Admin::Skip(const MessageFilter& filter, bool dry_run) {
  ValidateChange("skip", filter, {MessageStatus::kAbandoned});
  return Change(ChangeKind::kSkip, filter, std::string{}, dry_run);
}

ChangeResult Admin::Abandon(const MessageFilter& filter, const std::string& reason, bool dry_run) {
  ValidateChange("abandon", filter, {MessageStatus::kPending, MessageStatus::kFailed});
  if (reason.empty()) throw std::invalid_argument("abandon: a reason is required");
  return Change(ChangeKind::kAbandon, filter, reason, dry_run);
}

ChangeResult Admin::Change(ChangeKind kind, const MessageFilter& filter, const std::string& reason,
                           bool dry_run) {
  ChangeResult outcome;
  if (filter.ids && filter.ids->empty()) return outcome;
  std::optional<MessageId> after;
  for (;;) {
    ChunkResult chunk = ChangeChunk(kind, filter, after, kChangeChunk, reason, dry_run);
    outcome.ids.insert(outcome.ids.end(), chunk.changed.begin(), chunk.changed.end());
    if (chunk.candidates < kChangeChunk || !chunk.last_candidate) break;
    after = chunk.last_candidate;
  }
  outcome.count = static_cast<std::int64_t>(outcome.ids.size());
  return outcome;
}

std::int64_t Admin::Purge(const RetentionPolicy& retention, int chunk) {
  if (retention.published.count() < 0 || retention.abandoned.count() < 0) {
    throw std::invalid_argument("purge: retention must not be negative");
  }
  if (chunk < 1) throw std::invalid_argument("purge: chunk must be >= 1");
  std::int64_t total = 0;
  for (;;) {
    // Each chunk is a statement, and a transaction, of its own.
    const std::int64_t deleted = PurgeChunk(retention, chunk);
    total += deleted;
    if (deleted < chunk) return total;
  }
}

std::optional<std::vector<TopicCount>> Admin::CountByTopic(std::chrono::milliseconds timeout) {
  if (timeout.count() < 1) {
    throw std::invalid_argument("count by topic: timeout must be at least 1 ms, got " +
                                std::to_string(timeout.count()) + " ms");
  }
  auto groups = CountGroups(timeout);
  if (!groups) return std::nullopt;
  const auto key = [](const TopicCount& group) {
    return std::tuple{MessageStatusName(group.status), std::string_view{group.target},
                      std::string_view{group.topic}};
  };
  // Largest first; ties by status name, target, topic.
  const auto larger = [&](const TopicCount& a, const TopicCount& b) {
    if (a.messages != b.messages) return a.messages > b.messages;
    return key(a) < key(b);
  };
  std::sort(groups->begin(), groups->end(), larger);
  std::vector<TopicCount> series;
  std::map<std::string_view, TopicCount> other;  // by status name, so in that order
  for (std::size_t i = 0; i < groups->size(); ++i) {
    TopicCount& group = (*groups)[i];
    if (i < static_cast<std::size_t>(kTopicGroups)) {
      series.push_back(std::move(group));
      continue;
    }
    auto [sum, inserted] = other.try_emplace(
        MessageStatusName(group.status),
        TopicCount{group.status, std::string{kOtherTopics}, std::string{kOtherTopics}, 0});
    sum->second.messages += group.messages;
  }
  for (auto& [name, sum] : other) series.push_back(std::move(sum));
  std::sort(series.begin(), series.end(), larger);
  return series;
}

}  // namespace outbox
