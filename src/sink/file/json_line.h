#pragma once
// Rendering of an Envelope as one JSON line (see include/outbox/sink/file.h for the format).

#include <string>
#include <string_view>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/utf8.h"  // IsValidUtf8, used with this header
#include "outbox/sink/envelope_style.h"

namespace outbox::file {

// Appends the JSON object for `envelope` and a '\n' to `out`, with the keys `style` includes.
// Never throws for any message content (invalid UTF-8 in topic or headers is replaced by U+FFFD);
// only std::bad_alloc.
void AppendJsonLine(const Envelope& envelope, std::string& out,
                    EnvelopeStyle style = EnvelopeStyle::kFull);

// Standard base64 (RFC 4648 section 4) with padding.
std::string Base64Encode(std::string_view bytes);

// True for "application/json", in any case, with or without parameters ("; charset=utf-8").
bool IsJsonContentType(std::string_view content_type);

// True when `payload` can be embedded as parsed JSON without changing what it says: its
// nesting is at most kMaxEmbeddedJsonDepth deep and every number survives a round trip through
// a 64-bit integer or a double. It does not check that `payload` is valid JSON.
inline constexpr int kMaxEmbeddedJsonDepth = 256;
bool JsonPayloadIsEmbeddable(std::string_view payload);

}  // namespace outbox::file
