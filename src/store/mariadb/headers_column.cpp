// The headers column read as Headers (connection.h), in a file of its own: nlohmann/json is heavy
// to compile, and only this, the claim and the admin's filters need it.
#include <nlohmann/json.hpp>

#include "connection.h"

namespace outbox::mariadb {

Headers ParseHeadersColumn(const std::optional<std::string>& text, std::string_view what) {
  Headers headers;
  if (!text) return headers;
  const auto object = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) {
    throw MariaDbError(FailureKind::kPermanent, std::string{what} + " are not a JSON object", 0,
                       "HY000");
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    headers.emplace(it.key(),
                    it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  return headers;
}

}  // namespace outbox::mariadb
