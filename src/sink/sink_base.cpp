// The sink base (include/outbox/sink/sink_base.h).

#include "outbox/sink/sink_base.h"

#include <string>
#include <utility>

namespace outbox {

std::string Shorten(std::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string{text};
  std::size_t cut = max;
  // Back up over UTF-8 continuation bytes (10xxxxxx) so that no sequence is split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0U) == 0x80U) --cut;
  return std::string{text.substr(0, cut)} + "...";
}

std::string Millis(std::chrono::steady_clock::duration duration) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(duration).count()) +
         " ms";
}

std::vector<PublishOutcome> SinkBase::Batch::TakeOutcomes() {
  std::vector<PublishOutcome> outcomes;
  outcomes.reserve(size());
  for (std::size_t i = 0; i < size(); ++i) {
    std::optional<Failure> failure = std::move(verdicts_[i]);
    if (states_[i] == State::kSent) {
      failure = Failure{.kind = FailureKind::kOutcomeUnknown,
                        .reason = "sent, but no verdict by the deadline"};
    } else if (states_[i] == State::kNotSent) {
      failure = stopped() ? Failure{.kind = FailureKind::kUnavailable,
                                    .reason = "not sent: " + stop_reason_}
                          : Failure{.kind = FailureKind::kOutcomeUnknown,
                                    .reason = "the sink gave no verdict on it"};
    }
    outcomes.push_back({.id = envelopes_[i].id, .failure = std::move(failure)});
  }
  return outcomes;
}

std::vector<PublishOutcome> SinkBase::Publish(std::span<const Envelope> envelopes,
                                              Deadline deadline) {
  if (envelopes.empty()) return {};
  Batch batch(envelopes);
  batch_ = &batch;
  struct Detach {
    Batch*& batch;
    ~Detach() { batch = nullptr; }
  } detach{batch_};
  if (std::chrono::steady_clock::now() >= deadline) {
    batch.Stop("the deadline had already passed");
  } else if (ConnectWithBackoff(batch, deadline) && Ready(batch, deadline)) {
    batch.Resume();
    Send(batch, deadline);
    Await(batch, deadline);
  }
  Finish(batch, deadline);
  return batch.TakeOutcomes();
}

bool SinkBase::ConnectWithBackoff(Batch& batch, Deadline deadline) {
  if (Connected(deadline)) return true;
  batch.Resume();  // the connection it dropped is replaced, or the attempt says why not
  const auto now = std::chrono::steady_clock::now();
  if (now < next_connect_at_) {
    batch.Stop(last_connect_error_ + " (next attempt in " +
               std::to_string(
                   std::chrono::ceil<std::chrono::milliseconds>(next_connect_at_ - now).count()) +
               " ms)");
    return false;
  }
  if (std::optional<std::string> error = Connect(deadline)) {
    next_connect_at_ = std::chrono::steady_clock::now() + reconnect_.Failed();
    last_connect_error_ = std::move(*error);
    batch.Stop(last_connect_error_);
    return false;
  }
  reconnect_.Succeeded();
  return true;
}

}  // namespace outbox
