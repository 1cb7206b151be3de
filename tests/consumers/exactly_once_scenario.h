#pragma once
// Issue #44's promise, for a consumer written in another language on one broker: writers (the
// Python or Node example, place_orders) place orders in transactions, a tenth of them rolled back;
// outboxd relays their events and is killed with SIGKILL mid-run, then started again; the
// consumer (the broker's example, on the SQL inbox) is killed with SIGKILL mid-run, then started
// again. Afterwards every committed order's events are applied exactly once (one row each in the
// consumer's table), in stream order, and none of a rolled-back order.

#include <string>
#include <vector>

namespace outbox::testing {

struct ExactlyOnceRun {
  std::string schema;                 // the outbox schema (a TestSchema's name)
  std::string sinks;                  // outboxd's [sinks.*] tables (and anything after [relay])
  std::vector<std::string> writer;    // the writer's command, without --db/--schema/--table
  std::vector<std::string> consumer;  // the consumer's whole command (its table: schema.applied)
  std::string consumer_ready;         // the consumer's start-up line
  std::size_t copies = 1;             // events per order (its targets)
};

// Runs `run` and checks it with gtest's assertions; prints what happened.
void RunExactlyOnce(const ExactlyOnceRun& run);

// The consumer's table and the orders table of `schema`.
inline std::string AppliedTable(const std::string& schema) { return schema + ".applied"; }
inline std::string OrdersTable(const std::string& schema) { return schema + ".orders"; }

}  // namespace outbox::testing
