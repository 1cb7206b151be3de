#pragma once
// How a payload goes into a JSON document (the file sink's lines, CloudEvents' structured mode):
// embedded as parsed JSON when its content type is JSON and it survives the round trip, else as a
// string, else in base64.

#include <string>
#include <string_view>

namespace outbox {

// Standard base64 (RFC 4648 section 4) with padding.
std::string Base64Encode(std::string_view bytes);

// True for "application/json", in any case, with or without parameters ("; charset=utf-8").
bool IsJsonContentType(std::string_view content_type);

// True when `payload` can be embedded as parsed JSON without changing what it says: its
// nesting is at most kMaxEmbeddedJsonDepth deep and every number survives a round trip through
// a 64-bit integer or a double. It does not check that `payload` is valid JSON.
inline constexpr int kMaxEmbeddedJsonDepth = 256;
bool JsonPayloadIsEmbeddable(std::string_view payload);

}  // namespace outbox
