#pragma once
// Rendering of an Envelope as one JSON line (see include/outbox/sink/file.h for the format).

#include <string>
#include <string_view>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/utf8.h"  // IsValidUtf8, used with this header
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/json_payload.h"

namespace outbox::file {

// Appends the JSON object for `envelope` and a '\n' to `out`, with the keys `style` includes.
// Never throws for any message content (invalid UTF-8 in topic or headers is replaced by U+FFFD);
// only std::bad_alloc.
void AppendJsonLine(const Envelope& envelope, std::string& out,
                    EnvelopeStyle style = EnvelopeStyle::kFull);

// The payload helpers the file sink shares with CloudEvents' structured mode.
using outbox::Base64Encode;
using outbox::IsJsonContentType;
using outbox::JsonPayloadIsEmbeddable;
using outbox::kMaxEmbeddedJsonDepth;

}  // namespace outbox::file
