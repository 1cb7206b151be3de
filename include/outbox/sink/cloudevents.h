#pragma once
// The CloudEvents 1.0 envelope (`envelope = "cloudevents"`, issue #43): the one mapping of an
// Envelope onto CloudEvents attributes, shared by every sink. Each sink only writes the list
// Attributes() gives in its protocol binding's syntax (docs/cloudevents.md has the table per
// binding); structured mode is StructuredJson().
//
// The attributes, in this order (every value a string: CloudEvents' canonical string encoding):
//   specversion      "1.0"
//   id               e.id, the message id: each copy of a message written to several targets is
//                    a message of its own (its own stream_seq, attempts and outcome), and two
//                    copies may land in one destination (two targets into one Redis stream), where
//                    a consumer that takes the same source + id for a duplicate must not drop one.
//                    A copy published again after an unknown outcome keeps its id, so source + id
//                    finds true duplicates. The event id shared by the copies is `eventid`.
//   source           the `cloudevents_source` template expanded ({topic}, {target}, {type});
//                    default "/outbox/{target}". Empty after expansion: the message is kPermanent.
//   type             e.type, or e.topic when the message has no type (or an empty one)
//   time             e.created_at, RFC 3339 UTC with milliseconds
//   subject          e.stream_key, when set and not empty
//   datacontenttype  e.content_type, when not empty (bindings carry it as their content type)
//   eventid          e.EventId(): the same for every copy of a message written to several targets
//   streamseq        e.stream_seq in decimal, when set
//   streamprevseq    e.stream_prev_seq in decimal, when set (see Envelope)
//   outboxdatabase   e.database, when not empty: the relay serves several databases (tenants),
//                    and the same stream key in two of them is two streams
//   partition        e.partition in decimal
// The numbers are strings: a stream_seq is 64-bit, CloudEvents' Integer only 32-bit.
// Then each user header whose ExtensionName() is set, as an extension of that name with the
// header's value: a name that is already a legal attribute name (a-z, 0-9, at most 20 characters:
// "traceparent", "tracestate", "tenant") as it is; correlation_id, causation_id and tenant_id
// as correlationid, causationid and tenantid. Any other header is left out ("X-Trace-Id",
// "user-agent", "Traceparent", a name over 20 characters), and so is one whose name is one of the
// attributes above or reserved by the spec (data, data_base64, dataschema, ...), one whose
// extension name an earlier header (in the headers' byte order) took already (correlation_id
// before correlationid), and the outbox's reserved names (message_id, event_id, outbox-*).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/message.h"
#include "outbox/sink/name_template.h"

namespace outbox::cloudevents {

enum class Mode : std::uint8_t {
  kBinary,      // attributes in the protocol's headers / properties, the payload as it is
  kStructured,  // one application/cloudevents+json document carrying attributes and data
};

inline constexpr std::string_view kModeKey = "cloudevents_mode";
inline constexpr std::string_view kSourceKey = "cloudevents_source";
inline constexpr std::string_view kDefaultSource = "/outbox/{target}";
inline constexpr std::string_view kSpecVersion = "1.0";
inline constexpr std::string_view kStructuredContentType = "application/cloudevents+json";
inline constexpr std::string_view kDataContentType = "datacontenttype";
inline constexpr std::size_t kMaxNameLength = 20;

constexpr std::string_view ModeName(Mode mode) {
  return mode == Mode::kStructured ? "structured" : "binary";
}

struct Options {
  Mode mode = Mode::kBinary;
  std::string source{kDefaultSource};
};

struct Attribute {
  std::string name;
  std::string value;
};

// a-z and 0-9 only, 1 to 20 characters (the spec's SHOULD taken as a MUST, as SDKs check it).
bool IsLegalName(std::string_view name);
// What the user header `name` becomes: its extension name, or nullopt when it is left out (see
// above).
std::optional<std::string> ExtensionName(std::string_view name);

// Checks `options` (the source template: not empty, no control characters, placeholders only
// {topic}, {target} and {type}). Throws ConfigError naming kSourceKey.
void ValidateOptions(const Options& options);

// The mapping, made once per sink from its options.
class Mapper {
 public:
  // Throws ConfigError as ValidateOptions does.
  explicit Mapper(const Options& options);

  [[nodiscard]] Mode mode() const { return mode_; }
  // The attributes of `envelope` (see above) into `out` (cleared first). Returns why there are
  // none (a source that expands to nothing): the message is then kPermanent.
  [[nodiscard]] std::optional<std::string> Attributes(const Envelope& envelope,
                                                      std::vector<Attribute>& out) const;
  // The structured-mode document (JSON event format): the attributes, then `data` (the payload
  // parsed when the content type is application/json and it parses; else the payload as a
  // string when it is valid UTF-8) or `data_base64`. Returns why there is none, as Attributes.
  [[nodiscard]] std::optional<std::string> StructuredJson(const Envelope& envelope,
                                                          std::string& out) const;

 private:
  Mode mode_;
  NameTemplate source_;
};

// An attribute's value as an HTTP (or NATS) header value, per the HTTP binding (3.1.3.2): space,
// '"', '%' and every byte outside printable ASCII (UTF-8 sequences byte by byte) as %XX.
std::string PercentEncodeHeaderValue(std::string_view value);

}  // namespace outbox::cloudevents
