#include "table_settler.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "outbox/core/message.h"
#include "outbox/relay/dispatcher.h"

namespace outbox::relay {

std::string DescribeAttempt(const Envelope& envelope) {
  std::string text = "message " + envelope.id.ToString() + " (topic " + envelope.topic +
                     ", attempt " + std::to_string(envelope.attempts + 1);
  if (const auto found = envelope.headers.find(kCorrelationIdHeader);
      found != envelope.headers.end() && !found->second.empty()) {
    text += ", correlation_id " + found->second;
  }
  return text + ")";
}

TableSettler::TableSettler(Store& store, std::string owner, int max_attempts, TableReport& report)
    : store_(store), owner_(std::move(owner)), max_attempts_(max_attempts), report_(report) {}

bool TableSettler::HasUnrecorded() const {
  return !unrecorded_.done.empty() || !unrecorded_.failed.empty() || !unrecorded_.released.empty();
}

// Counts one failed publish by kind, and whether it is abandoned or retried. The store decides
// abandonment (with its RetryPolicy); the count mirrors that rule with max_attempts_.
void TableSettler::CountFailure(const Envelope& envelope, const Failure& failure) {
  report_.metrics.failures[static_cast<std::size_t>(failure.kind)]->Increment();
  const FailureTreatment treatment = failure.treatment();
  const bool out_of_attempts =
      treatment.spends_attempt && max_attempts_ > 0 && envelope.attempts + 1 >= max_attempts_;
  if (treatment.abandon_now || (treatment.retry && out_of_attempts)) {
    if (auto* abandoned = report_.metrics.abandoned[static_cast<std::size_t>(failure.kind)]) {
      abandoned->Increment();
    }
  } else if (treatment.retry) {
    report_.metrics.retries.Increment();
  }
  if (treatment.spends_attempt) {
    report_.metrics.registry.RecordError(NameOf(failure.kind),
                                         DescribeAttempt(envelope) + ": " + failure.reason);
  }
}

// Records the outcomes. Within a stream only the confirmed prefix counts as done: after a
// failure, later messages of that stream in this batch go back unpublished (they will be
// published again after the failed one, so nothing is reordered).
// Returns the streams that had a failure: their later messages must wait for it.
std::set<StreamId> TableSettler::Settle(const std::vector<Envelope>& batch,
                                        const std::vector<PublishOutcome>& outcomes) {
  std::vector<LeasedId> done;
  std::vector<FailedMessage> failed;
  std::vector<LeasedId> throttled;  // over their target's max_rate: given back untouched
  std::set<StreamId> broken_streams;
  // The broker's confirmations are in: the end of the commit -> confirm latency.
  const TimePoint confirmed_at = std::chrono::system_clock::now();
  report_.LeasesHeld(0, batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Envelope& envelope = batch[i];
    const PublishOutcome& outcome = outcomes[i];
    // (The key is built only once a stream has failed: the usual batch builds none.)
    const bool broken = envelope.stream_key && !broken_streams.empty() &&
                        broken_streams.contains(StreamOf(envelope));
    if (outcome.published() && !broken) {
      done.push_back(LeasedId::Of(envelope));
      const std::chrono::duration<double> latency = confirmed_at - envelope.created_at;
      report_.metrics.publish_latency.Observe(std::max(latency.count(), 0.0));
      continue;
    }
    if (outcome.published()) {
      ++report_.counters.held_back;
      report_.metrics.held_back.Increment();
      report_.metrics.retries.Increment();
      failed.push_back(FailedMessage::Of(
          envelope, Failure{FailureKind::kOutcomeUnknown,
                            "held back: an earlier message of its stream failed"}));
      continue;
    }
    const Failure& failure = *outcome.failure;
    if (IsThrottled(failure)) {
      throttled.push_back(LeasedId::Of(envelope));
      if (envelope.stream_key) broken_streams.insert(StreamOf(envelope));
      continue;
    }
    CountFailure(envelope, failure);
    if (failure.treatment().spends_attempt) {
      ++report_.counters.failed;
      report_.Log(LogLevel::kWarn, DescribeAttempt(envelope) + " failed: " + failure.Describe());
    } else {
      ++report_.counters.unconfirmed;
    }
    failed.push_back(FailedMessage::Of(envelope, failure));
    if (envelope.stream_key) broken_streams.insert(StreamOf(envelope));
  }
  // The outcomes are known; they are recorded while the next batch is published, or before
  // anything more is claimed (see Run), also when the database is away now.
  report_.counters.throttled += throttled.size();
  report_.metrics.throttled.Increment(throttled.size());
  Unrecorded(std::move(done), std::move(failed), std::move(throttled));
  return broken_streams;
}

// The next batch was claimed while this one was in flight; messages in it that follow a
// failure of their stream go back unpublished, to wait for the failed one.
void TableSettler::HoldBack(std::vector<Envelope>& next, const std::set<StreamId>& broken_streams) {
  if (broken_streams.empty() || next.empty()) return;
  std::vector<FailedMessage> held;
  std::erase_if(next, [&](const Envelope& envelope) {
    if (!envelope.stream_key || !broken_streams.contains(StreamOf(envelope))) return false;
    held.push_back(
        FailedMessage::Of(envelope, Failure{FailureKind::kOutcomeUnknown,
                                            "not sent: an earlier message of its stream failed"}));
    return true;
  });
  if (held.empty()) return;
  report_.counters.held_back += held.size();
  report_.metrics.held_back.Increment(held.size());
  report_.metrics.retries.Increment(held.size());
  report_.LeasesHeld(0, held.size());
  try {
    store_.Fail(owner_, held);
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    report_.Log(LogLevel::kWarn, "holding back " + std::to_string(held.size()) +
                                     " messages failed (tried again before the next claim): " +
                                     std::string{error.what()});
    Unrecorded({}, std::move(held), {});
  }
}

void TableSettler::Release(const std::vector<Envelope>& batch) {
  if (batch.empty()) return;
  report_.LeasesHeld(0, batch.size());
  std::vector<LeasedId> leases;
  for (const auto& envelope : batch) leases.push_back(LeasedId::Of(envelope));
  try {
    store_.Release(owner_, leases);
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    report_.Log(LogLevel::kWarn, "releasing " + std::to_string(batch.size()) +
                                     " messages failed (tried again before the next claim): " +
                                     std::string{error.what()});
    Unrecorded({}, {}, std::move(leases));
  }
}

// Outcomes the store could not take: kept, and recorded before anything more is claimed. Each
// is fenced by its lease, so one that no longer holds (taken over) is simply refused.
void TableSettler::Unrecorded(std::vector<LeasedId> done, std::vector<FailedMessage> failed,
                              std::vector<LeasedId> released) {
  std::move(done.begin(), done.end(), std::back_inserter(unrecorded_.done));
  std::move(failed.begin(), failed.end(), std::back_inserter(unrecorded_.failed));
  std::move(released.begin(), released.end(), std::back_inserter(unrecorded_.released));
}

// Records what Unrecorded kept; the error when some of it is still left.
std::optional<std::string> TableSettler::RecordUnrecorded() {
  auto& done = unrecorded_.done;
  try {
    if (!done.empty()) {
      report_.Completed(store_.Complete(owner_, done));
      done.clear();
    }
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    return std::string{error.what()};
  }
  return RecordReturned();
}

// Records the failed and released messages Unrecorded kept (they must be back before the next
// claim); the published ones are left for the next claim to settle (ClaimRequest::complete).
std::optional<std::string> TableSettler::RecordReturned() {
  auto& failed = unrecorded_.failed;
  auto& released = unrecorded_.released;
  try {
    if (!failed.empty()) {
      report_.LeaseLost(store_.Fail(owner_, failed));
      failed.clear();
    }
    if (!released.empty()) {
      report_.LeaseLost(store_.Release(owner_, released));
      released.clear();
    }
    return std::nullopt;
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    return std::string{error.what()};
  }
}

}  // namespace outbox::relay
