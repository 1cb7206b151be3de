// The claim-check step in front of a sink (claim_check.h): uploads the batch's large payloads,
// then hands the inner sink the batch with references in their place.

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "outbox/sink/claim_check.h"
#include "s3.h"

namespace outbox::claim_check {
namespace {

constexpr std::string_view kKillAfterUploadEnv = "OUTBOX_TEST_CLAIM_CHECK_KILL_AFTER_UPLOAD";

// `text` as a JSON string literal.
std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

class ClaimCheckSink final : public Sink {
 public:
  ClaimCheckSink(std::unique_ptr<Sink> inner, Options options, LogFn log)
      : inner_(std::move(inner)),
        options_(std::move(options)),
        log_(std::move(log)),
        client_(options_.store),
        kill_after_upload_(
            std::getenv(std::string{kKillAfterUploadEnv}.c_str()) != nullptr &&
            std::string_view{std::getenv(std::string{kKillAfterUploadEnv}.c_str())} == "1") {
    if (options_.retention.count() > 0) sweeper_ = std::thread([this] { SweepLoop(); });
  }
  ~ClaimCheckSink() override {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (sweeper_.joinable()) sweeper_.join();
  }
  ClaimCheckSink(const ClaimCheckSink&) = delete;
  ClaimCheckSink& operator=(const ClaimCheckSink&) = delete;

  [[nodiscard]] std::string_view Name() const override { return inner_->Name(); }

  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline deadline) override {
    const bool any_large = std::any_of(batch.begin(), batch.end(), [this](const Envelope& e) {
      return e.payload.size() > options_.threshold;
    });
    if (!any_large) return inner_->Publish(batch, deadline);

    std::vector<std::optional<Failure>> held(batch.size());
    std::vector<Envelope> sendable;
    sendable.reserve(batch.size());
    std::set<std::string, std::less<>> blocked_streams;
    std::string store_down;  // why no further upload is tried, after a transport failure
    bool uploaded = false;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Envelope& envelope = batch[i];
      if (envelope.stream_key && blocked_streams.contains(*envelope.stream_key)) {
        held[i] = Failure{.kind = FailureKind::kUnavailable,
                          .reason =
                              "not sent: an earlier message of its stream could not be "
                              "stored (claim check)"};
        continue;
      }
      if (envelope.payload.size() <= options_.threshold) {
        sendable.push_back(envelope);
        continue;
      }
      std::optional<Failure> failure;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!store_down.empty()) {
        failure = Failure{.kind = FailureKind::kUnavailable,
                          .reason = "claim check: not stored: " + store_down};
      } else if (left.count() <= 0) {
        failure = Failure{.kind = FailureKind::kUnavailable,
                          .reason = "claim check: not stored: the deadline passed"};
      } else {
        Envelope reference = envelope;
        failure = Upload(reference, left, store_down);
        if (!failure) {
          uploaded = true;
          sendable.push_back(std::move(reference));
        }
      }
      if (failure) {
        held[i] = std::move(failure);
        if (envelope.stream_key) blocked_streams.insert(*envelope.stream_key);
      }
    }
    if (uploaded && kill_after_upload_) ::raise(SIGKILL);  // test-only: see claim_check.h

    std::vector<PublishOutcome> sent;
    if (!sendable.empty()) sent = inner_->Publish(sendable, deadline);
    std::vector<PublishOutcome> outcomes;
    outcomes.reserve(batch.size());
    std::size_t next = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (held[i]) {
        outcomes.push_back(PublishOutcome{.id = batch[i].id, .failure = std::move(held[i])});
      } else if (next < sent.size()) {
        outcomes.push_back(std::move(sent[next++]));
      } else {  // an inner sink that broke its contract: never report a message published
        outcomes.push_back(
            PublishOutcome{.id = batch[i].id,
                           .failure = Failure{.kind = FailureKind::kOutcomeUnknown,
                                              .reason = "claim check: no outcome from the sink"}});
      }
    }
    return outcomes;
  }

  void Close() override { inner_->Close(); }

 private:
  // Stores `envelope`'s payload and makes it a reference. Returns the message's failure, if any;
  // a transport failure also sets `store_down`.
  std::optional<Failure> Upload(Envelope& envelope, std::chrono::milliseconds timeout,
                                std::string& store_down) {
    const std::string key = ObjectKey(options_, envelope.id);
    const std::string sha256 = Sha256Hex(envelope.payload);
    const S3Response response =
        client_.Put(key, envelope.payload, envelope.content_type, sha256, timeout);
    if (!response.ok()) {
      const std::string reason =
          "claim check: PUT " + ObjectUrl(options_.store, key) + " failed: " + response.Describe();
      if (!response.transport_error.empty()) store_down = response.Describe();
      if (log_) log_(LogLevel::kWarn, reason);
      // Every answer is retried without spending an attempt: a missing bucket or a refused
      // credential is the store's configuration, not the message's fault.
      return Failure{.kind = FailureKind::kUnavailable, .reason = reason};
    }
    const std::string url = ObjectUrl(options_.store, key);
    const std::string size = std::to_string(envelope.payload.size());
    envelope.headers[std::string{kUrlHeader}] = url;
    envelope.headers[std::string{kSizeHeader}] = size;
    envelope.headers[std::string{kSha256Header}] = sha256;
    envelope.headers[std::string{kContentTypeHeader}] = envelope.content_type;
    envelope.headers[std::string{kDataRefHeader}] = url;
    envelope.payload = "{\"claim_check\":{\"url\":" + JsonString(url) + ",\"size\":" + size +
                       ",\"sha256\":\"" + sha256 +
                       "\",\"content_type\":" + JsonString(envelope.content_type) + "}}";
    envelope.content_type = std::string{kReferenceContentType};
    return std::nullopt;
  }

  [[nodiscard]] bool Stopping() {
    const std::lock_guard lock(mutex_);
    return stopping_;
  }

  void SweepLoop() {
    using std::chrono::milliseconds;
    const milliseconds interval = std::clamp<milliseconds>(
        options_.retention / 4, std::chrono::seconds{1}, std::chrono::hours{1});
    std::unique_ptr<S3Client> client;
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
      lock.unlock();
      try {
        if (!client) client = std::make_unique<S3Client>(options_.store);
        Sweep(*client);
      } catch (const std::exception& error) {
        if (log_) log_(LogLevel::kWarn, std::string{"claim check: sweep failed: "} + error.what());
      }
      lock.lock();
    }
  }

  // Deletes the objects under the prefix last written before now - retention, page by page.
  void Sweep(S3Client& client) {
    const auto cutoff = std::chrono::system_clock::now() - options_.retention;
    const std::string where = ObjectUrl(options_.store, options_.prefix);
    std::string continuation;
    std::size_t deleted = 0;
    do {
      if (Stopping()) return;
      const S3Response page =
          client.List(options_.prefix, continuation, options_.store.request_timeout);
      if (!page.ok()) {
        if (log_)
          log_(LogLevel::kWarn, "claim check: listing " + where + " failed: " + page.Describe() +
                                    " (retried later)");
        return;
      }
      std::string next;
      for (const ListedObject& object : ParseListing(page.body, next)) {
        if (object.last_modified >= cutoff || !object.key.starts_with(options_.prefix)) continue;
        if (Stopping()) return;
        const S3Response gone = client.Delete(object.key, options_.store.request_timeout);
        if (!gone.ok() && gone.status != 404) {
          if (log_)
            log_(LogLevel::kWarn, "claim check: DELETE " + ObjectUrl(options_.store, object.key) +
                                      " failed: " + gone.Describe() + " (retried later)");
          return;
        }
        ++deleted;
      }
      continuation = std::move(next);
    } while (!continuation.empty());
    if (deleted > 0 && log_) {
      log_(LogLevel::kInfo, "claim check: deleted " + std::to_string(deleted) + " objects under " +
                                where + " older than the retention");
    }
  }

  std::unique_ptr<Sink> inner_;
  Options options_;
  LogFn log_;
  S3Client client_;
  bool kill_after_upload_;
  // The retention sweep (Options::retention): its thread, with a client of its own.
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mutex_
  std::thread sweeper_;
};

}  // namespace

std::unique_ptr<Sink> WrapSink(std::unique_ptr<Sink> inner, Options options, LogFn log) {
  ValidateOptions(options);
  return std::make_unique<ClaimCheckSink>(std::move(inner), std::move(options), std::move(log));
}

}  // namespace outbox::claim_check
