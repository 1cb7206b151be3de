#include "outbox/inbox/headers.h"

#include <cstdint>

#include "decimal.h"
#include "outbox/core/wire_names.h"

namespace outbox::inbox {

std::optional<Delivery> FromHeaders(const HeaderLookup& header, std::string_view id_name,
                                    std::string* error) {
  const auto fail = [error](std::string message) -> std::optional<Delivery> {
    if (error != nullptr) *error = std::move(message);
    return std::nullopt;
  };
  const auto id_text = header(id_name);
  if (!id_text) return fail("the message has no " + std::string{id_name} + " header");
  const auto id = Uuid::Parse(*id_text);
  if (!id) {
    return fail(std::string{id_name} + " '" + std::string{*id_text} + "' is not a UUID");
  }
  Delivery delivery{.id = *id};
  if (const auto key = header(wire::kStreamKeyHeader)) delivery.stream_key = std::string{*key};
  if (const auto target = header(wire::kTargetHeader)) delivery.target = std::string{*target};
  if (const auto origin = header(wire::kDatabaseHeader)) delivery.origin = std::string{*origin};
  const auto number = [&](std::string_view name, std::optional<std::int64_t>& into) {
    const auto text = header(name);
    if (!text) return;
    into = ParseDecimal(*text);
    if (!into && delivery.malformed.empty()) {
      delivery.malformed = "header " + std::string{name} + " is not an integer";
    }
  };
  number(wire::kStreamSeqHeader, delivery.stream_seq);
  number(wire::kStreamPrevSeqHeader, delivery.stream_prev_seq);
  return delivery;
}

}  // namespace outbox::inbox
