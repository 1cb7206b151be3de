// PartitionLeases on PostgreSQL: each call is one statement running a function of the schema
// (relay_heartbeat, relay_leave in sql/003_partitions.sql), so that a heartbeat is one round trip
// and one transaction on the database's clock. The heartbeat's statement also says whether anything
// is unfinished (three probes of the small partial indexes of sql/001 and sql/004), so that an
// idle relay needs no sweep of its own (issue #42).

#include <stdexcept>

#include "connection.h"
#include "migrations.h"
#include "outbox/store/postgres.h"

namespace outbox::postgres {
namespace {

// Each branch is one index's predicate (messages_fresh, messages_returned, messages_in_flight),
// so that each is a probe of an index holding only unfinished rows, however many published rows
// retention keeps. A takeover in the same heartbeat voids leases (processing -> pending): this
// statement's snapshot, taken before, still sees them processing, unfinished either way.
std::string UnfinishedProbe(const std::string& table) {
  return " (EXISTS (SELECT 1 FROM " + table +
         " WHERE status = 'pending' AND lease_epoch = 0)"
         " OR EXISTS (SELECT 1 FROM " +
         table +
         " WHERE status IN ('pending', 'failed') AND lease_epoch > 0)"
         " OR EXISTS (SELECT 1 FROM " +
         table + " WHERE status IN ('processing', 'failed'))) AS unfinished";
}

class PostgresPartitionLeases final : public PartitionLeases {
 public:
  PostgresPartitionLeases(const std::string& conninfo, const std::string& schema)
      : connection_(conninfo),
        heartbeat_sql_(
            "SELECT owned, epochs, surplus, live_instances, fair_share, partition_count,"
            " acquired, taken_over, released, next_heartbeat_ms," +
            UnfinishedProbe(QuoteSchema(schema) + ".messages") + " FROM " + QuoteSchema(schema) +
            ".relay_heartbeat($1, $2, $3::integer[])"),
        leave_sql_("SELECT " + QuoteSchema(schema) + ".relay_leave($1)") {
    RequireSchemaVersion(connection_.Ready(), schema, connection_.description());
  }

  Membership Heartbeat(std::string_view owner, std::chrono::milliseconds lease,
                       std::span<const int> release) override {
    if (owner.empty()) throw std::invalid_argument("heartbeat: owner must not be empty");
    if (lease.count() < 1) throw std::invalid_argument("heartbeat: lease must be positive");
    const std::string owner_text{owner};
    const std::string lease_text = std::to_string(lease.count());
    const std::string release_text = NumberArray(release);
    const auto result = Exec(connection_.Ready(), "partition heartbeat", heartbeat_sql_,
                             {Param{owner_text}, Param{lease_text}, Param{release_text}});
    const PGresult* row = result.get();
    if (PQntuples(row) != 1) {
      throw PgError(FailureKind::kPermanent, "partition heartbeat: expected one row", "");
    }
    const auto number = [row](int column) {
      return ParseInt64(Column(row, 0, column), "partition heartbeat");
    };
    const auto partitions = ParseNumberArray(Column(row, 0, 0), "partition heartbeat: owned");
    const auto epochs = ParseNumberArray(Column(row, 0, 1), "partition heartbeat: epochs");
    if (partitions.size() != epochs.size()) {
      throw PgError(FailureKind::kPermanent, "partition heartbeat: owned and epochs differ", "");
    }
    Membership membership;
    for (std::size_t i = 0; i < partitions.size(); ++i) {
      membership.owned.push_back({static_cast<int>(partitions[i]), epochs[i]});
    }
    for (const auto partition :
         ParseNumberArray(Column(row, 0, 2), "partition heartbeat: surplus")) {
      membership.surplus.push_back(static_cast<int>(partition));
    }
    membership.live_instances = static_cast<int>(number(3));
    membership.fair_share = static_cast<int>(number(4));
    membership.partition_count = static_cast<int>(number(5));
    membership.acquired = static_cast<int>(number(6));
    membership.taken_over = static_cast<int>(number(7));
    membership.released = static_cast<int>(number(8));
    membership.next_heartbeat = std::chrono::milliseconds{number(9)};
    const std::string_view unfinished = Column(row, 0, 10);
    if (unfinished != "t" && unfinished != "f") {
      throw PgError(FailureKind::kPermanent,
                    "partition heartbeat: unfinished is not a boolean: " + std::string{unfinished},
                    "");
    }
    membership.unfinished = unfinished == "t";
    return membership;
  }

  void Leave(std::string_view owner) override {
    if (owner.empty()) throw std::invalid_argument("leave: owner must not be empty");
    const std::string owner_text{owner};
    Exec(connection_.Ready(), "leave partitions", leave_sql_, {Param{owner_text}});
  }

 private:
  Connection connection_;
  std::string heartbeat_sql_;
  std::string leave_sql_;
};

}  // namespace

std::unique_ptr<PartitionLeases> OpenPartitionLeases(const std::string& conninfo,
                                                     const std::string& schema) {
  CheckSchemaOption(schema);
  return std::make_unique<PostgresPartitionLeases>(conninfo, schema);
}

}  // namespace outbox::postgres
