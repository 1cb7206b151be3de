#pragma once
// The table relay's settler: what becomes of a claimed batch once the sinks have answered. Within
// a stream only the confirmed prefix counts as done; what follows a failure goes back unpublished
// (held back), in this batch and in the one claimed beside it, so nothing is reordered. Outcomes
// the store cannot take now are kept and recorded before anything more is claimed; the published
// ones ride on the next claim (ClaimRequest::complete). Main relay thread only.

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/sink/sink.h"
#include "outbox/store/store.h"
#include "table_report.h"

namespace outbox::relay {

// A stream, as the stores order it: stream_seq counts per (target, stream key), and head-of-line
// is per pair, so that one target's failure never holds back another target's copies.
using StreamId = std::pair<std::string, std::string>;
inline StreamId StreamOf(const Envelope& envelope) {
  return {envelope.target, envelope.stream_key.value_or(std::string{})};
}

// "message <id> (topic <topic>, attempt <n>[, correlation_id <c>])": what a failure line names,
// so that an operator can find the message (outboxctl show <id>) and the request behind it.
std::string DescribeAttempt(const Envelope& envelope);

class TableSettler {
 public:
  // `max_attempts`: the store's RetryPolicy::max_attempts, to count abandoned messages (0: only
  // what is abandoned at once).
  TableSettler(Store& store, std::string owner, int max_attempts, TableReport& report);

  // Records the outcomes of `batch` (one per message, in order); returns the streams that had a
  // failure: their later messages must wait for it.
  std::set<StreamId> Settle(const std::vector<Envelope>& batch,
                            const std::vector<PublishOutcome>& outcomes);
  // The next batch was claimed while this one was in flight; messages in it that follow a
  // failure of their stream go back unpublished, to wait for the failed one.
  void HoldBack(std::vector<Envelope>& next, const std::set<StreamId>& broken_streams);
  // Gives the leases of `batch` back unpublished, no attempt spent.
  void Release(const std::vector<Envelope>& batch);

  // Records everything kept (the published ones too); the error when some of it is still left.
  std::optional<std::string> RecordUnrecorded();
  // Records the failed and released messages kept (they must be back before the next claim);
  // the published ones are left for the next claim to settle.
  std::optional<std::string> RecordReturned();
  [[nodiscard]] bool HasUnrecorded() const;
  // The published messages not yet recorded, for the next claim to complete; DoneRecorded once
  // it did.
  [[nodiscard]] const std::vector<LeasedId>& done() const { return unrecorded_.done; }
  void DoneRecorded() { unrecorded_.done.clear(); }

 private:
  void CountFailure(const Envelope& envelope, const Failure& failure);
  void Unrecorded(std::vector<LeasedId> done, std::vector<FailedMessage> failed,
                  std::vector<LeasedId> released);

  Store& store_;
  const std::string owner_;
  const int max_attempts_;
  TableReport& report_;
  struct {
    std::vector<LeasedId> done;
    std::vector<FailedMessage> failed;
    std::vector<LeasedId> released;
  } unrecorded_;  // outcomes the store could not take yet (see Unrecorded)
};

}  // namespace outbox::relay
