#include "outbox/relay/shared_sink.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace outbox {

bool SharedSink::Core::Take(Deadline deadline) {
  std::unique_lock lock(mutex_);
  const std::uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  if (changed_.wait_until(lock, deadline, [&] { return !busy_ && queue_.front() == ticket; })) {
    queue_.pop_front();
    busy_ = true;
    return true;
  }
  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  changed_.notify_all();  // the one behind may be first now
  return false;
}

void SharedSink::Core::Give() {
  {
    const std::lock_guard lock(mutex_);
    busy_ = false;
  }
  changed_.notify_all();
}

std::size_t SharedSink::Core::waiting() const {
  const std::lock_guard lock(mutex_);
  return queue_.size();
}

SharedSink::SharedSink(std::shared_ptr<Core> core) : core_(std::move(core)) {
  if (!core_ || !core_->sink) throw std::invalid_argument("SharedSink: no sink to share");
}

std::string_view SharedSink::Name() const { return core_->sink->Name(); }

std::vector<PublishOutcome> SharedSink::Publish(std::span<const Envelope> batch,
                                                Deadline deadline) {
  if (!core_->Take(deadline)) {
    std::vector<PublishOutcome> outcomes;
    outcomes.reserve(batch.size());
    for (const Envelope& envelope : batch) {
      outcomes.push_back(
          {envelope.id, Failure{FailureKind::kUnavailable,
                                "not sent: the sink was busy with another relay's batch until "
                                "the deadline"}});
    }
    return outcomes;
  }
  const Turn turn(*core_);
  return core_->sink->Publish(batch, deadline);
}

void SharedSink::Close() {
  // Bounded: the other relay's Publish ends by its deadline; a sink still busy after this long is
  // left to close with its last owner.
  if (!core_->Take(std::chrono::steady_clock::now() + std::chrono::minutes{1})) return;
  const Turn turn(*core_);
  core_->sink->Close();
}

std::vector<SinkMap> ShareSinks(SinkMap sinks, std::size_t copies) {
  std::vector<SinkMap> maps;
  if (copies == 1) {  // nobody to share with
    maps.push_back(std::move(sinks));
    return maps;
  }
  maps.resize(copies);
  for (auto& [target, sink] : sinks) {
    auto core = std::make_shared<SharedSink::Core>(std::move(sink));
    for (SinkMap& map : maps) map.emplace(target, std::make_unique<SharedSink>(core));
  }
  return maps;
}

}  // namespace outbox
