#pragma once
// One envelope for the envelope-style tests of every sink (tests/<sink>/<sink>_sink_test.cpp):
// SetEveryField, the user headers of it that every sink sends, and the checks of what a consumer
// received in the full and the external style (a map or a list of name/value pairs, as each
// test's client reads them). Header-only: it needs only outbox::core and GoogleTest, which every
// sink test links.

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/ascii.h"
#include "outbox/core/message.h"
#include "outbox/core/uuid.h"
#include "outbox/core/wire_names.h"

namespace outbox::testing {

using NameValues = std::vector<std::pair<std::string, std::string>>;

inline constexpr std::string_view kTestTraceparent =
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

// The user headers of SetEveryField that a sink sends in every envelope style, in name order
// (Headers is ordered by name).
inline NameValues UserHeadersSent() {
  return {{"causation_id", "cause-1"},
          {"correlation_id", "corr-1"},
          {"traceparent", std::string{kTestTraceparent}},
          {"x-custom", "value"}};
}

// Sets every field of `envelope` that a sink may send, each to a value of its own: the event id
// (as for a copy of a message written to several targets), type "OrderPlaced", content type
// "application/vnd.test+json", stream key "order-42", stream seq 7 after 5, partition 3,
// attempts 2, database "tenant-7" (as from a relay serving several databases), created at
// 1700000000 s, and the user headers of UserHeadersSent plus two with
// reserved names (forged: the stores refuse them, the sinks leave them out in either style).
// With every field set, a test checks the full and the external styles against one list: what
// the external style leaves out is left out for sure, not just unset. The id, topic and payload
// stay as they are; a test adds what is its sink's own (a forged `Type` for HTTP, created_at in
// milliseconds for Kafka) after this.
inline void SetEveryField(Envelope& envelope) {
  envelope.event_id = NewUuidV7();
  envelope.type = "OrderPlaced";
  envelope.content_type = "application/vnd.test+json";
  envelope.stream_key = "order-42";
  envelope.stream_seq = 7;
  envelope.stream_prev_seq = 5;
  envelope.partition = 3;
  envelope.attempts = 2;
  envelope.database = "tenant-7";
  envelope.created_at = std::chrono::system_clock::time_point{std::chrono::seconds{1700000000}};
  envelope.headers.clear();
  for (auto& [name, value] : UserHeadersSent()) envelope.headers.emplace(name, std::move(value));
  envelope.headers.emplace(wire::kPartitionHeader, "99");
  envelope.headers.emplace("Outbox-Topic", "forged");
}

// Each of `expected` once in `sent` (the names and values a consumer received: a map, or a list in
// the order they came), with its value.
template <typename Sent>
void ExpectEachOnce(const Sent& sent, const NameValues& expected) {
  for (const auto& [expected_name, expected_value] : expected) {
    std::size_t count = 0;
    for (const auto& [name, value] : sent) {
      if (name != expected_name) continue;
      ++count;
      EXPECT_EQ(value, expected_value) << name;
    }
    EXPECT_EQ(count, 1U) << expected_name;
  }
}

// What a sink sent for `envelope` in the full style (the default): its event id (its own id
// unless it is a copy), the outbox's internal headers with its values (the stream ones and
// outbox-database when set, none when not) and its user headers of names that are not reserved,
// each once, and no value "forged" (a user header of a reserved name, e.g. of SetEveryField). The
// names as the envelope spells them: lower-case ones for a sink whose consumer reads them
// lower-cased (HTTP).
template <typename Sent>
void ExpectTheFullEnvelope(const Sent& sent, const Envelope& envelope) {
  NameValues expected = {{std::string{wire::kEventId}, envelope.EventId().ToString()},
                         {std::string{wire::kTopicHeader}, envelope.topic},
                         {std::string{wire::kPartitionHeader}, std::to_string(envelope.partition)},
                         {std::string{wire::kAttemptsHeader}, std::to_string(envelope.attempts)}};
  const auto add_if_set = [&](std::string_view name, const std::optional<std::string>& value) {
    if (value) {
      expected.emplace_back(name, *value);
      return;
    }
    for (const auto& [sent_name, sent_value] : sent) EXPECT_NE(sent_name, name) << sent_value;
  };
  const auto number = [](const std::optional<std::int64_t>& value) {
    return value ? std::optional{std::to_string(*value)} : std::nullopt;
  };
  add_if_set(wire::kStreamKeyHeader, envelope.stream_key);
  add_if_set(wire::kStreamSeqHeader, number(envelope.stream_seq));
  add_if_set(wire::kStreamPrevSeqHeader, number(envelope.stream_prev_seq));
  add_if_set(wire::kDatabaseHeader,
             envelope.database.empty() ? std::nullopt : std::optional{envelope.database});
  for (const auto& [name, value] : envelope.headers) {
    if (!wire::IsReservedName(name)) expected.emplace_back(name, value);
  }
  ExpectEachOnce(sent, expected);
  for (const auto& [name, value] : sent) EXPECT_NE(value, "forged") << name;
}

// What a sink sent for an envelope of SetEveryField in the external style: no name that starts
// with outbox- (in any case), and its event id and each of UserHeadersSent, once, with its value.
template <typename Sent>
void ExpectTheExternalEnvelope(const Sent& sent, const Envelope& envelope) {
  for (const auto& [name, value] : sent) {
    EXPECT_FALSE(StartsWithNoCase(name, wire::kReservedHeaderPrefix)) << name << ": " << value;
  }
  NameValues expected = UserHeadersSent();
  expected.emplace_back(wire::kEventId, envelope.EventId().ToString());
  ExpectEachOnce(sent, expected);
}

// User headers named like the event id and the message id, in several cases (the stores refuse
// them; an old row may hold them), each with the value "forged", and x-custom = "kept".
inline Headers ForgedEventIdHeaders() {
  return {{"event_id", "forged"},
          {"Event_Id", "forged"},
          {"EVENT_ID", "forged"},
          {"Message_Id", "forged"},
          {"x-custom", "kept"}};
}

// What a sink sent for an envelope with ForgedEventIdHeaders (`sent`, the names and values a
// consumer received): one event_id, no value "forged" under any name, x-custom kept. `context`
// names the case in the messages.
template <typename Sent>
void ExpectNoForgedEventId(const Sent& sent, std::string_view context = {}) {
  std::size_t event_ids = 0;
  bool custom_kept = false;
  for (const auto& [name, value] : sent) {
    EXPECT_NE(value, "forged") << name << " (" << context << ")";
    if (name == wire::kEventId) ++event_ids;
    if (name == "x-custom") custom_kept = value == "kept";
  }
  EXPECT_EQ(event_ids, 1U) << context;
  EXPECT_TRUE(custom_kept) << context;
}

}  // namespace outbox::testing
