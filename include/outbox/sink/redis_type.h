#pragma once
// The Redis Streams sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "redis"
//   url = "redis://user:password@host:6379/0"  # required, or OUTBOX_SINK_<NAME>_URL (which wins);
//                                    # also redis://:password@host, unix:///run/redis.sock?db=1;
//                                    # rediss:// (TLS) is refused: hiredis 0.14 has no TLS
//   stream = "{topic}"               # the stream key; placeholders {topic}, {target}, {type}
//   max_len = 0                      # XADD MAXLEN ~ N; 0 never trims
//   dedup = true                     # add an entry only if its id was not seen in dedup_window
//   dedup_window = "24h"             # 1s to 365d; warned about when shorter than relay.lease
//   dedup_prefix = "outbox:dedup:"   # dedup keys: <dedup_prefix><message id>
//   pipeline = 1000                  # commands in flight, 1 to 100000
//   connect_timeout = "5s"           # 1ms to 10m
//   max_message_bytes = 16777216     # the largest entry (all its fields), 1 to 536870912
//   envelope = "full"                # or "external": no outbox-* fields (sink/envelope_style.h),
//                                    # or "cloudevents" (docs/cloudevents.md), then also:
//   cloudevents_mode = "binary"      # the only mode: ce_* fields and `data`
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
// --check-config shows the url with its password as ***.
// What the keys mean: outbox::redis::SinkOptions (sink/redis.h).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox/sink/redis.h"
#include "outbox/sink/registry.h"

namespace outbox::redis {

class SinkSettings final : public outbox::SinkSettings {
 public:
  explicit SinkSettings(SinkOptions options) : options_(std::move(options)) {}
  void Describe(config::TomlWriter& out) const override;
  // The sink, logging to context.log and comparing dedup_window with context.lease.
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override;
  // The URL's host and port; none for a unix socket (the readiness check probes TCP only).
  [[nodiscard]] std::optional<SinkEndpoint> Endpoint() const override;
  [[nodiscard]] std::vector<std::string> Secrets() const override;
  [[nodiscard]] const SinkOptions& options() const { return options_; }

 private:
  SinkOptions options_;
};

// type = "redis".
SinkType Type();

}  // namespace outbox::redis
