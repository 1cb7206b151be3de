#pragma once
// Text on its way into a log line. Much of what outbox logs comes from outside: abandon reasons,
// topics and ids written by applications, broker and database error texts. Written raw, a newline
// in such a value forges a log line and an escape sequence drives the reader's terminal; written
// whole, a megabyte of it floods the log. One sanitizer serves every log line: the daemon's log
// callback (apps/outboxd/main.cpp) passes each message through it once, and outboxctl its error
// messages.
//
// Known secrets (secrets.h: the configured passwords, tokens, header values, ...) are redacted
// here first, before anything is escaped or cut, so that neither can leave part of one.

#include <cstddef>
#include <string>
#include <string_view>

namespace outbox {

// The default bound of one log message, in bytes (before the " …(N bytes cut)" note).
inline constexpr std::size_t kMaxLogTextBytes = 4096;

// `text` made safe for a plain-text log line:
//  - every known secret replaced by *** (RedactKnownSecrets);
//  - control characters escaped: \n, \r, \t, and \xNN for the other C0 controls and DEL (ESC is
//    \x1b); C1 controls (U+0080..U+009F, valid UTF-8) as \u0080..\u009f;
//  - each byte that is not part of valid UTF-8 as \xNN; valid UTF-8 is kept as it is;
//  - at most `max_bytes` bytes of that, cut at a character (or escape) boundary, followed by
//    " …(N bytes cut)" where N counts the bytes of `text` left out.
// A backslash is kept as it is: a value may spell "\n" itself, but it can never end the line.
// Returns `text` unchanged (one copy, no other work) when there is nothing else to do.
std::string SanitizeForLog(std::string_view text, std::size_t max_bytes = kMaxLogTextBytes);

// Only the redaction and the bound of SanitizeForLog, for output that escapes on its own (a JSON
// log line): at most `max_bytes` bytes of `text` with its known secrets redacted, cut before a
// UTF-8 lead byte, then " …(N bytes cut)".
std::string BoundForLog(std::string_view text, std::size_t max_bytes = kMaxLogTextBytes);

}  // namespace outbox
