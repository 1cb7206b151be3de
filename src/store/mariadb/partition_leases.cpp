// PartitionLeases on MariaDB: each call is one CALL of a procedure of the schema (relay_heartbeat,
// relay_leave in sql/003_relay.sql, ports of PostgreSQL's functions with the same fair-share and
// fencing rules), so that a heartbeat is one round trip and one transaction on the database's
// clock.

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "connection.h"
#include "outbox/core/error.h"
#include "outbox/store/mariadb.h"

namespace outbox::mariadb {
namespace {

using Json = nlohmann::json;

[[noreturn]] void Malformed(const std::string& what) {
  throw MariaDbError(FailureKind::kPermanent, "partition heartbeat: " + what, 0, "HY000");
}

class MariaDbPartitionLeases final : public PartitionLeases {
 public:
  MariaDbPartitionLeases(const std::string& url, const std::string& schema,
                         std::chrono::milliseconds statement_deadline)
      : connection_(url, statement_deadline),
        heartbeat_sql_("CALL " + QuoteSchema(schema) + ".relay_heartbeat(?, ?, ?)"),
        leave_sql_("CALL " + QuoteSchema(schema) + ".relay_leave(?)") {
    // The procedures are there only from the relay's migration on.
    const Value name{schema};
    const auto found = connection_.Run(
        "check schema",
        "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = ? AND "
        "ROUTINE_NAME = 'relay_heartbeat'",
        {&name, 1});
    if (found.sets.empty() || found.sets[0].rows.empty() ||
        ToInt64(found.sets[0].rows[0].at(0), "check schema") == 0) {
      throw StoreError(FailureKind::kPermanent, "the outbox schema `" + schema + "` on " +
                                                    connection_.description() +
                                                    " is not migrated: run outboxctl migrate");
    }
  }

  Membership Heartbeat(std::string_view owner, std::chrono::milliseconds lease,
                       std::span<const int> release) override {
    if (owner.empty()) throw std::invalid_argument("heartbeat: owner must not be empty");
    if (lease.count() < 1) throw std::invalid_argument("heartbeat: lease must be positive");
    const Value params[] = {std::string{owner}, static_cast<std::int64_t>(lease.count()),
                            Json(std::vector<int>(release.begin(), release.end())).dump()};
    const auto result = connection_.Run("partition heartbeat", heartbeat_sql_, params);
    if (result.sets.empty() || result.sets[0].rows.size() != 1 ||
        result.sets[0].columns.size() != 8) {
      Malformed("expected one row of 8 columns");
    }
    const auto& row = result.sets[0].rows[0];
    const auto number = [&row](std::size_t column) {
      return ToInt64(row[column], "partition heartbeat");
    };
    Membership membership;
    const Json owned = Json::parse(row[0].value_or(""), nullptr, /*allow_exceptions=*/false);
    if (!owned.is_array()) Malformed("owned is not a JSON array");
    for (const auto& held : owned) {
      if (!held.is_array() || held.size() != 2 || !held[0].is_number_integer() ||
          !held[1].is_number_integer()) {
        Malformed("owned holds " + held.dump() + ", not [partition, epoch]");
      }
      membership.owned.push_back({held[0].get<int>(), held[1].get<std::int64_t>()});
    }
    membership.live_instances = static_cast<int>(number(1));
    membership.fair_share = static_cast<int>(number(2));
    membership.partition_count = static_cast<int>(number(3));
    membership.acquired = static_cast<int>(number(4));
    membership.taken_over = static_cast<int>(number(5));
    membership.released = static_cast<int>(number(6));
    membership.next_heartbeat = std::chrono::milliseconds{number(7)};
    // Surplus: the highest partitions beyond the fair share (owned is ascending).
    for (std::size_t i = static_cast<std::size_t>(std::max(membership.fair_share, 0));
         i < membership.owned.size(); ++i) {
      membership.surplus.push_back(membership.owned[i].partition);
    }
    return membership;
  }

  void Leave(std::string_view owner) override {
    if (owner.empty()) throw std::invalid_argument("leave: owner must not be empty");
    const Value params[] = {std::string{owner}};
    connection_.Run("leave partitions", leave_sql_, params);
  }

 private:
  Connection connection_;
  std::string heartbeat_sql_;
  std::string leave_sql_;
};

}  // namespace

std::unique_ptr<PartitionLeases> OpenPartitionLeases(const std::string& url,
                                                     const std::string& schema,
                                                     std::chrono::milliseconds statement_deadline) {
  CheckConnectionOptions(url, schema, statement_deadline);
  return std::make_unique<MariaDbPartitionLeases>(url, schema, statement_deadline);
}

}  // namespace outbox::mariadb
