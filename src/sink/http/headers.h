#pragma once
// Which header names and values an HTTP request can carry, and which the sink keeps for itself.

#include <string_view>

namespace outbox::webhook {

// Names an envelope or the configuration may not use (any case): the sink sets them
// (content-type, webhook-*, and wire::IsReservedName's message_id, event_id, outbox-*), or HTTP's
// framing and connection management do (content-length, host, transfer-encoding, connection,
// keep-alive, upgrade, te, trailer, expect, proxy-*).
bool ReservedHeaderName(std::string_view name);

// An RFC 9110 token: the characters a header name may have.
bool IsHeaderName(std::string_view name);

// No CR, LF or NUL: a value that cannot end its header line early.
bool IsHeaderValue(std::string_view value);

}  // namespace outbox::webhook
