#include "outbox/sink/file_type.h"

namespace outbox::file {
namespace {

std::unique_ptr<const outbox::SinkSettings> Parse(const config::Section& sink, std::string_view,
                                                  const config::GetenvFn&) {
  sink.AllowOnly({"type", "path", "fsync", "envelope", "cloudevents_mode",
                  "cloudevents_source"});
  SinkOptions options;
  if (sink.Read("path", options.path) &&
      (options.path.empty() || config::HasControlCharacter(options.path))) {
    config::Fail(
        sink.Key("path"),
        "must be a file path, or \"-\" for standard output (not empty, no control characters)",
        sink.Find("path"));
  }
  sink.Read("fsync", options.fsync);
  ReadEnvelope(sink, options.envelope, options.cloudevents, {"structured"});
  sink.Check([&options] { ValidateOptions(options); });
  return std::make_unique<const SinkSettings>(std::move(options));
}

}  // namespace

void SinkSettings::Describe(config::TomlWriter& out) const {
  out.String("path", options_.path);
  out.Bool("fsync", options_.fsync);
  DescribeEnvelope(out, options_.envelope, options_.cloudevents);
}

std::unique_ptr<Sink> SinkSettings::Open(const SinkContext& /*context*/) const {
  return OpenSink(options_);
}

SinkType Type() { return {.name = "file", .parse = Parse}; }

}  // namespace outbox::file
