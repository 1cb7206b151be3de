#include "wal_settler.h"

#include <algorithm>
#include <map>
#include <utility>

namespace outbox::relay {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

WalSettler::WalSettler(RetryPolicy retry, const Dispatcher& dispatcher, LogFn log)
    : retry_(std::move(retry)),
      dispatcher_(dispatcher),
      log_(std::move(log)),
      random_(DefaultRandom()) {}

void WalSettler::Log(LogLevel level, const std::string& message) const {
  if (log_) log_(level, message);
}

std::optional<std::string> WalSettler::Decide(Batch& batch,
                                              const std::vector<PublishOutcome>& outcomes) {
  const std::vector<Item>& items = batch.items;
  const std::vector<std::size_t>& to_publish = batch.to_publish;
  std::set<WalStream>& broken = batch.broken;
  WalCommit& commit = batch.commit;
  std::vector<const PublishOutcome*> outcome_of(items.size(), nullptr);  // by item
  for (std::size_t k = 0; k < to_publish.size(); ++k) outcome_of[to_publish[k]] = &outcomes[k];
  // A target that rejected something: what it left unconfirmed beside the rejection (a channel
  // closed by it: "not sent", "outcome unknown") is parked to wait as well, as publishing the
  // batch again would meet the same rejection forever. A target that rejected nothing but left
  // messages unconfirmed (its broker is down or gave no verdict; a paused target is not even
  // sent to) has them parked too, to be published by the table relay once its sink answers,
  // while the other targets' messages flow and the slot moves on: one sink's outage pauses its
  // lane only. Only when no target could take anything (each is paused or left messages
  // unconfirmed here) is it an outage: nothing is committed or parked, and the batch is read and
  // published again after a pause, rather than copying the WAL into the table meanwhile.
  std::set<std::string, std::less<>> rejecting;
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    const auto& failure = outcomes[k].failure;
    if (failure && failure->treatment().spends_attempt) {
      rejecting.insert(items[to_publish[k]].envelope.target);
    }
  }
  std::map<std::string, const Failure*, std::less<>> unconfirmed;  // by target: its first one
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    const auto& failure = outcomes[k].failure;
    const std::string& target = items[to_publish[k]].envelope.target;
    // Over its max_rate: parked like the rest, but not a sign of an outage (nor worth a warning
    // per batch).
    if (failure && !failure->treatment().spends_attempt && !rejecting.contains(target) &&
        !IsThrottled(*failure)) {
      unconfirmed.try_emplace(target, &*failure);
    }
  }
  if (!unconfirmed.empty()) {
    std::size_t stuck = unconfirmed.size();
    for (const auto& target : dispatcher_.HeldPaused(SteadyClock::now())) {
      if (!unconfirmed.contains(target)) ++stuck;
    }
    if (stuck >= dispatcher_.size()) {
      // An unreachable broker is worded as the table relay words it, so that an operator
      // greps one line for both; a verdict that did not come is not called an outage of it.
      const auto& [target, failure] = *unconfirmed.begin();
      return failure->kind == FailureKind::kOutcomeUnknown
                 ? "sink '" + target + "' gave no verdict on a message: " + failure->Describe()
                 : "sink '" + target + "' is unavailable: " + failure->Describe();
    }
    for (const auto& [target, failure] : unconfirmed) {
      Log(LogLevel::kWarn, "WAL messages to target '" + target +
                               "' are parked in the table (published by the table relay once "
                               "its sink answers) while the other targets flow: " +
                               failure->Describe());
    }
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Envelope& envelope = items[i].envelope;
    const auto stream = WalStreamOf(envelope);
    if (stream && broken.contains(*stream)) {
      commit.parked.push_back({.envelope = envelope,
                               .as = ParkAs::kWaiting,
                               .attempts = 0,
                               .available_in = milliseconds{0},
                               .error = "waiting: an earlier message of its stream is parked"});
      continue;
    }
    const PublishOutcome* outcome = outcome_of[i];  // published: its stream is not broken
    if (outcome->published()) {
      ++batch.published;
      continue;
    }
    const Failure& failure = *outcome->failure;
    if (!failure.treatment().spends_attempt) {  // beside a rejection, or an outage (see above)
      commit.parked.push_back({.envelope = envelope,
                               .as = ParkAs::kWaiting,
                               .attempts = 0,
                               .available_in = milliseconds{0},
                               .error = failure.Describe()});
      if (stream) broken.insert(*stream);
      continue;
    }
    const bool abandon = failure.treatment().abandon_now || retry_.Exhausted(1);
    Log(LogLevel::kWarn, "WAL message " + envelope.id.ToString() + " to " + envelope.target +
                             " failed and is parked" + (abandon ? " as abandoned" : "") + ": " +
                             failure.Describe());
    const milliseconds delay = std::max(retry_.Delay(1, random_), failure.retry_after);
    commit.parked.push_back(
        {.envelope = envelope,
         .as = abandon ? ParkAs::kAbandoned : ParkAs::kFailed,
         .attempts = 1,
         .available_in = abandon ? milliseconds{0} : delay,
         .error = failure.Describe(),
         .hold_by_default = std::find(retry_.hold_targets.begin(), retry_.hold_targets.end(),
                                      envelope.target) != retry_.hold_targets.end()});
    // Its followers in this batch reached the broker before the verdict, without
    // stream_prev_seq: they are parked too, and published again by the table relay, whose
    // claim sets it after an abandoned one (as table mode holds them back); so are those of the
    // batch read ahead (Launch). In batches read after this commit an abandoned message holds
    // nothing back (the stream's next message carries stream_prev_seq), unless it holds its
    // stream (on_abandon = "hold"): then they are parked to wait behind it (StreamStates).
    // A message parked as failed and abandoned later by the table relay holds by the same rule
    // (the table's Fail).
    if (stream) broken.insert(*stream);
  }
  return std::nullopt;
}

}  // namespace outbox::relay
