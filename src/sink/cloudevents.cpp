#include "outbox/sink/cloudevents.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "outbox/core/ascii.h"
#include "outbox/core/clock.h"
#include "outbox/core/error.h"
#include "outbox/core/utf8.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/json_payload.h"

namespace outbox::cloudevents {
namespace {

using Json = nlohmann::ordered_json;

// The context attributes of the spec (required, optional, and v1.0's data members), and the
// extensions the mapping sets itself: a user header never takes one of these names.
constexpr std::array<std::string_view, 16> kTakenNames = {"specversion",
                                                          "id",
                                                          "source",
                                                          "type",
                                                          "time",
                                                          "subject",
                                                          "dataschema",
                                                          "datacontenttype",
                                                          "data",
                                                          "data_base64",
                                                          "datacontentencoding",
                                                          "schemaurl",
                                                          "eventid",
                                                          "streamseq",
                                                          "streamprevseq",
                                                          "outboxdatabase"};
constexpr std::string_view kPartition = "partition";

// The outbox's well-known headers whose names CloudEvents does not allow as they are.
constexpr std::array<std::pair<std::string_view, std::string_view>, 3> kRenamed = {{
    {kCorrelationIdHeader, "correlationid"},
    {kCausationIdHeader, "causationid"},
    {kTenantIdHeader, "tenantid"},
}};

bool Taken(std::string_view name) {
  return name == kPartition ||
         std::find(kTakenNames.begin(), kTakenNames.end(), name) != kTakenNames.end();
}

}  // namespace

bool IsLegalName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxNameLength &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

std::optional<std::string> ExtensionName(std::string_view name) {
  if (wire::IsReservedName(name)) return std::nullopt;
  for (const auto& [header, extension] : kRenamed) {
    if (name == header) return std::string{extension};
  }
  if (!IsLegalName(name) || Taken(name)) return std::nullopt;
  return std::string{name};
}

void ValidateOptions(const Options& options) {
  if (options.source.empty()) {
    throw ConfigError(
        std::string{kSourceKey},
        "must not be empty (CloudEvents requires a source; e.g. \"/outbox/{target}\")");
  }
  if (HasControlCharacter(options.source)) {
    throw ConfigError(std::string{kSourceKey}, "must not contain control characters");
  }
  NameTemplate::Parse(options.source, std::string{kSourceKey});
}

Mapper::Mapper(const Options& options)
    : mode_(options.mode),
      source_((ValidateOptions(options),
               NameTemplate::Parse(options.source, std::string{kSourceKey}))) {}

std::optional<std::string> Mapper::Attributes(const Envelope& envelope,
                                              std::vector<Attribute>& out) const {
  out.clear();
  std::string source = source_.Expand(envelope);
  if (source.empty()) {
    return "the " + std::string{kSourceKey} + " template \"" + source_.text() +
           "\" gives an empty source for this message (CloudEvents requires one)";
  }
  const auto add = [&out](std::string_view name, std::string value) {
    out.push_back(Attribute{.name = std::string{name}, .value = std::move(value)});
  };
  add("specversion", std::string{kSpecVersion});
  add("id", envelope.id.ToString());
  add("source", std::move(source));
  add("type", envelope.type && !envelope.type->empty() ? *envelope.type : envelope.topic);
  add("time", FormatRfc3339(envelope.created_at, 3));
  if (envelope.stream_key && !envelope.stream_key->empty()) add("subject", *envelope.stream_key);
  if (!envelope.content_type.empty()) add(kDataContentType, envelope.content_type);
  add("eventid", envelope.EventId().ToString());
  if (envelope.stream_seq) add("streamseq", std::to_string(*envelope.stream_seq));
  if (envelope.stream_prev_seq) add("streamprevseq", std::to_string(*envelope.stream_prev_seq));
  if (!envelope.database.empty()) add("outboxdatabase", envelope.database);
  add(kPartition, std::to_string(envelope.partition));
  const std::size_t fixed = out.size();
  for (const auto& [name, value] : envelope.headers) {
    auto extension = ExtensionName(name);
    if (!extension) continue;
    const bool repeated = std::any_of(out.begin() + static_cast<std::ptrdiff_t>(fixed), out.end(),
                                      [&](const Attribute& a) { return a.name == *extension; });
    if (!repeated) add(*extension, value);
  }
  return std::nullopt;
}

std::optional<std::string> Mapper::StructuredJson(const Envelope& envelope,
                                                  std::string& out) const {
  std::vector<Attribute> attributes;
  if (auto error = Attributes(envelope, attributes)) return error;
  Json document = Json::object();
  for (Attribute& attribute : attributes) {
    document[attribute.name] = std::move(attribute.value);
  }
  bool embedded = false;
  if (IsJsonContentType(envelope.content_type) && JsonPayloadIsEmbeddable(envelope.payload)) {
    Json parsed = Json::parse(envelope.payload, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) {
      document["data"] = std::move(parsed);
      embedded = true;
    }
  }
  if (!embedded) {
    if (IsValidUtf8(envelope.payload)) {
      document["data"] = envelope.payload;
    } else {
      document["data_base64"] = Base64Encode(envelope.payload);
    }
  }
  out = document.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  return std::nullopt;
}

std::string PercentEncodeHeaderValue(std::string_view value) {
  static constexpr std::string_view kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte <= 0x20 || byte >= 0x7F || c == '"' || c == '%') {
      out += '%';
      out += kHex[byte >> 4U];
      out += kHex[byte & 0x0FU];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace outbox::cloudevents
