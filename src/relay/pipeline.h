#pragma once
// The relay's pipelining, written once for its sources (the table's claims and the WAL slot's
// transactions): while one batch publishes, the next is taken; then the publishing one is decided,
// the next starts publishing without the streams the decided one left broken (their later
// messages must wait for it), and the decided one is recorded while the next publishes. The broker
// never waits for the database's round trips, nor the database for the broker.

#include <memory>
#include <optional>

namespace outbox::relay {

template <typename Batch, typename Broken>
class Pipeline {
 public:
  // What a source does at each step; called on the relay's thread only.
  class Stages {
   public:
    virtual ~Stages() = default;
    // A batch to start with when none is publishing, or nullptr when there is none now (it may
    // wait a while for one: a linger, an idle sleep).
    virtual std::unique_ptr<Batch> Take() = 0;
    // The next batch, taken while `publishing` publishes, or nullptr.
    virtual std::unique_ptr<Batch> TakeAhead(Batch& publishing) = 0;
    // Starts publishing `batch` (on another thread), leaving out the messages of `broken`.
    virtual void Launch(Batch& batch, const Broken& broken) = 0;
    // Waits for the batch's outcomes and decides what becomes of each; nullopt when they could
    // not be decided (an outage: the source drops the pipeline and starts again).
    virtual std::optional<Broken> Decide(Batch& batch) = 0;
    // Makes a decided batch's outcomes durable (or leaves them for the next take to carry).
    virtual void Record(Batch& batch) = 0;
  };

  explicit Pipeline(Stages& stages) : stages_(stages) {}

  // One turn: take a batch and launch it unless one is publishing; take the next while it
  // publishes (when `take_ahead`); decide the publishing one, launch the next, record.
  void Turn(bool take_ahead) {
    if (!publishing_) {
      publishing_ = stages_.Take();
      if (!publishing_) return;
      stages_.Launch(*publishing_, Broken{});
    }
    std::unique_ptr<Batch> next = take_ahead ? stages_.TakeAhead(*publishing_) : nullptr;
    const std::unique_ptr<Batch> batch = std::move(publishing_);
    const std::optional<Broken> broken = stages_.Decide(*batch);
    if (!broken) return;  // `next` goes unpublished; it is taken again
    if (next) {
      stages_.Launch(*next, *broken);
      publishing_ = std::move(next);
    }
    stages_.Record(*batch);
  }

  // After an outage or a lost lease: what is publishing is waited for (destroying a batch waits
  // for its publish) and dropped.
  void Drop() { publishing_.reset(); }

  [[nodiscard]] Batch* publishing() const { return publishing_.get(); }

 private:
  Stages& stages_;
  std::unique_ptr<Batch> publishing_;
};

}  // namespace outbox::relay
