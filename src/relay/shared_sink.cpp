#include "outbox/relay/shared_sink.h"

#include <stdexcept>
#include <utility>

namespace outbox {

SharedSink::SharedSink(std::shared_ptr<Core> core) : core_(std::move(core)) {
  if (!core_ || !core_->sink) throw std::invalid_argument("SharedSink: no sink to share");
}

std::string_view SharedSink::Name() const { return core_->sink->Name(); }

std::vector<PublishOutcome> SharedSink::Publish(std::span<const Envelope> batch,
                                                Deadline deadline) {
  std::unique_lock turn(core_->turn, std::defer_lock);
  if (!turn.try_lock_until(deadline)) {
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
  return core_->sink->Publish(batch, deadline);
}

void SharedSink::Close() {
  const std::lock_guard turn(core_->turn);
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
