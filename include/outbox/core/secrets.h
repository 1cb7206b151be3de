#pragma once
// Known secrets kept out of what outbox stores and prints. A broker's error, an HTTP endpoint's
// answer or a database's message may quote what the relay sent it: an endpoint answering
// "400 invalid credentials: Bearer <token>" hands the configured token back. Whatever the
// configuration holds as a secret (URL passwords of every sink and of the database, HTTP header
// values, tokens, SASL passwords, webhook signing secrets) is therefore replaced by "***" in any
// text from outside before it is logged, stored as a message's last_error or answered by the API.
//
// One redactor does it, SecretRedactor::Redact, reached through RedactKnownSecrets: the process's
// known secrets, installed once at start (outboxd builds them from its configuration). It is
// called by the log sanitizer (log_text.h: every log line), by the relays on every outcome a sink
// returns (so last_error, the WAL ledger, metrics' recent errors and log lines get the redacted
// reason) and by outboxd's API for database errors.
//
// The minimum length: a value shorter than kMinSecretBytes (8) is not redacted. Redacting "test"
// or "guest" would blank every occurrence of an ordinary word in every reason (and show an
// observer which words the secret is), and a credential that short is guessable anyway.
//
// Threading: RedactKnownSecrets may be called from any thread; InstallKnownSecrets replaces the
// set atomically (callers that are redacting finish with the set they started with).

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace outbox {

inline constexpr std::size_t kMinSecretBytes = 8;
// What a secret is replaced by.
inline constexpr std::string_view kRedactedSecret = "***";

class SecretRedactor {
 public:
  SecretRedactor() = default;
  // Keeps the distinct `secrets` of at least kMinSecretBytes, longest first.
  explicit SecretRedactor(std::vector<std::string> secrets);

  // `text` with every byte that belongs to an occurrence of a secret replaced: each run of such
  // bytes (overlapping or adjacent occurrences, of one secret or several) becomes one "***".
  // Bytes are compared as they are (no case folding, no decoding); valid UTF-8 around a secret
  // stays valid. With `cut` (the text is the start of a longer one), a tail of at least
  // kMinSecretBytes that begins a secret is replaced too: a secret cut in two shows no part of
  // itself that long.
  [[nodiscard]] std::string Redact(std::string_view text, bool cut = false) const;

  [[nodiscard]] bool empty() const { return secrets_.empty(); }
  // The secrets kept, longest first.
  [[nodiscard]] const std::vector<std::string>& secrets() const { return secrets_; }

 private:
  std::vector<std::string> secrets_;
};

// The forms in which a configured value may come back, for SecretRedactor (short ones are
// dropped by it, so these may return some):
//  - a header value: the value; after an authentication scheme ("Bearer <token>", "Basic
//    <base64>", any "<scheme> <credentials>") also the credentials alone; for Basic also the
//    decoded "user:password" and the password alone;
//  - a URL's user info ("scheme://user:password@host/..."): the password as written and
//    percent-decoded, "user:password" (decoded) and its base64 (an HTTP client sends it as Basic
//    authentication); with `lone_user_is_secret` (NATS: "token@host") also a user without a
//    password. A URL without user info gives nothing.
std::vector<std::string> HeaderSecretForms(std::string_view value);
std::vector<std::string> UrlSecretForms(std::string_view url, bool lone_user_is_secret = false);

// Installs `redactor` as the process's known secrets (replacing any before).
void InstallKnownSecrets(std::shared_ptr<const SecretRedactor> redactor);
// `text` through the installed redactor (Redact above); `text` itself when none is installed.
std::string RedactKnownSecrets(std::string_view text, bool cut = false);

}  // namespace outbox
