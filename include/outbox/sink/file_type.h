#pragma once
// The file sink type for outboxd's [sinks.<name>] tables (sink/registry.h):
//
//   [sinks.<name>]
//   type = "file"
//   path = "-"       # "-" is standard output; otherwise a file opened for appending
//   fsync = false
//   envelope = "full"  # or "external": no topic, stream, partition, target or attempts keys,
//                      # or "cloudevents": one structured CloudEvent per line
//                      # (docs/cloudevents.md), then also:
//   cloudevents_mode = "structured"          # the only mode a file has
//   cloudevents_source = "/outbox/{target}"  # placeholders {topic}, {target}, {type}
//
// What the keys mean: outbox::file::SinkOptions (sink/file.h). Nothing is probed for readiness.

#include <utility>

#include "outbox/sink/file.h"
#include "outbox/sink/registry.h"

namespace outbox::file {

class SinkSettings final : public outbox::SinkSettings {
 public:
  explicit SinkSettings(SinkOptions options) : options_(std::move(options)) {}
  void Describe(config::TomlWriter& out) const override;
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override;
  [[nodiscard]] const SinkOptions& options() const { return options_; }

 private:
  SinkOptions options_;
};

// type = "file".
SinkType Type();

}  // namespace outbox::file
