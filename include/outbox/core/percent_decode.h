#pragma once
// Hex digits and %XX decoding and encoding, for the places that read or write URIs and ids: the
// HTTP listener's paths and queries, the PostgreSQL store's connection URIs, UUID text, the HTTP
// sink's URLs.

#include <optional>
#include <string>
#include <string_view>

namespace outbox {

// The value of a hex digit (0-9, a-f, A-F); -1 for any other character.
int HexDigitValue(char c);

// `text` with each %XX replaced by its byte (and '+' by a space when `plus_is_space`, as in an
// HTML form's query); nullopt when a '%' is not followed by two hex digits.
std::optional<std::string> PercentDecode(std::string_view text, bool plus_is_space = false);

// `text` with every byte but the unreserved ones of RFC 3986 (A-Z a-z 0-9 - . _ ~) as %XX
// (upper-case hex): safe anywhere in a URL's path or query, where it cannot add a '/' or a '?'.
std::string PercentEncode(std::string_view text);

}  // namespace outbox
