#pragma once

#include <string_view>
#include <vector>

namespace outbox::postgres {

struct Migration {
  int version;
  std::string_view name;
  std::string_view sql;  // with __SCHEMA__ and __CHANNEL__ placeholders
};

// In version order; generated from sql/*.sql.
const std::vector<Migration>& Migrations();

}  // namespace outbox::postgres
