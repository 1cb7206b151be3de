#pragma once
// A Sink for engine tests: records what it is asked to publish and answers as told. The real
// brokers are tested in their own tiers and end to end; this one lets a test script failures.

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "outbox/sink/sink.h"

namespace outbox::testing {

class TestSink final : public Sink {
 public:
  using Verdict = std::function<std::optional<Failure>(const Envelope&)>;

  explicit TestSink(Verdict verdict = {}) : verdict_(std::move(verdict)) {}

  std::string_view Name() const override { return "test"; }

  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline) override {
    std::lock_guard lock(mutex_);
    std::vector<PublishOutcome> outcomes;
    ++calls_;
    for (const auto& envelope : batch) {
      first_call_.try_emplace(envelope.id, calls_);
      std::optional<Failure> failure = verdict_ ? verdict_(envelope) : std::nullopt;
      if (!failure) {  // what a consumer would have received
        delivered_.push_back(envelope);
        batch_of_.push_back(calls_);
      }
      outcomes.push_back({envelope.id, std::move(failure)});
    }
    return outcomes;
  }

  void Close() override {}

  std::vector<Envelope> delivered() const {
    std::lock_guard lock(mutex_);
    return delivered_;
  }
  // The Publish call (1, 2, ...) that delivered delivered()[i].
  std::vector<int> batches() const {
    std::lock_guard lock(mutex_);
    return batch_of_;
  }
  int calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  // The first Publish call (1, 2, ...) that was given message `id`, whatever its verdict.
  std::optional<int> FirstCall(const MessageId& id) const {
    std::lock_guard lock(mutex_);
    const auto found = first_call_.find(id);
    if (found == first_call_.end()) return std::nullopt;
    return found->second;
  }

 private:
  Verdict verdict_;
  mutable std::mutex mutex_;
  std::vector<Envelope> delivered_;
  std::vector<int> batch_of_;
  std::map<MessageId, int> first_call_;
  int calls_ = 0;
};

}  // namespace outbox::testing
