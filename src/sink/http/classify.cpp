#include "classify.h"

#include <algorithm>
#include <string>

#include "outbox/core/log_text.h"
#include "outbox/core/secrets.h"

namespace outbox::webhook {
namespace {

// How much of an answer's body a reason quotes.
constexpr std::size_t kQuotedBody = 200;

// Whether libcurl's error says that the endpoint refused the TLS handshake by an alert about
// certificates (OpenSSL's reasons: "tlsv13 alert certificate required", "tlsv1 alert unknown ca",
// "sslv3 alert bad certificate", ...): it never read what was sent.
bool HandshakeRefused(CURLcode code, std::string_view detail) {
  if (code == CURLE_SSL_CLIENTCERT) return true;
  if (code != CURLE_RECV_ERROR && code != CURLE_SEND_ERROR) return false;
  if (detail.find(" alert ") == std::string_view::npos) return false;
  for (const std::string_view what : {"certificate", "unknown ca", "access denied"}) {
    if (detail.find(what) != std::string_view::npos) return true;
  }
  return false;
}

// The start of `body` (itself the start of the answer's): known secrets redacted first
// (core/secrets.h), a secret cut off at the end of the kept bytes too, so that neither cut shows
// part of one.
std::string Quote(std::string_view body) {
  if (body.empty()) return {};
  const std::string redacted = RedactKnownSecrets(body, /*cut=*/true);
  return ": " + SanitizeForLog(std::string_view{redacted}.substr(0, kQuotedBody)) +
         (redacted.size() > kQuotedBody ? "..." : "");
}

}  // namespace

bool HonoursRetryAfter(long status) { return status == 429 || status == 503; }

namespace {

bool Listed(const std::vector<int>& list, long status) {
  return std::find(list.begin(), list.end(), status) != list.end();
}

// The statuses that say the message itself can never be accepted as it is.
bool NeverAccepted(long status) {
  return status == 400 || status == 413 || status == 415 || status == 422;
}

}  // namespace

std::string_view RefusalOf(long status) {
  if (status == 401) return "its credentials";
  if (status == 407) return "its proxy credentials";
  return "its permissions";
}

bool RefusesRelay(long status, const StatusLists& lists) {
  return (status == 401 || status == 403 || status == 407) && !Listed(lists.retry, status) &&
         !Listed(lists.abandon, status);
}

std::optional<Failure> ClassifyStatus(long status, const StatusLists& lists, std::string_view body,
                                      std::string_view location) {
  if (status >= 200 && status < 300) return std::nullopt;
  const std::string code = "HTTP " + std::to_string(status);
  if (status >= 300 && status < 400) {
    return Failure{
        FailureKind::kRejected,
        code + ": redirected to " +
            (location.empty() ? std::string{"(no Location)"} : SanitizeForLog(location)) +
            "; redirects are not followed (point url at the final address)"};
  }
  if (RefusesRelay(status, lists)) return Failure{FailureKind::kUnavailable, code + Quote(body)};
  if (Listed(lists.retry, status)) return Failure{FailureKind::kRejected, code + Quote(body)};
  if (NeverAccepted(status) || Listed(lists.abandon, status)) {
    return Failure{FailureKind::kPermanent,
                   code + Quote(body) +
                       (NeverAccepted(status) ? " (the message cannot be accepted as it is)"
                                              : " (listed in abandon_statuses)")};
  }
  return Failure{FailureKind::kRejected, code + Quote(body)};
}

Failure ClassifyTimeout(bool sent, std::string_view timeout_name) {
  if (sent) {
    return Failure{FailureKind::kOutcomeUnknown,
                   "sent, no answer within " + std::string{timeout_name}};
  }
  return Failure{FailureKind::kOutcomeUnknown,
                 "not sent within " + std::string{timeout_name} +
                     ": it got no connection to its host in that time"};
}

Failure ClassifyError(CURLcode code, bool sent, std::string_view detail) {
  std::string reason = curl_easy_strerror(code);
  if (!detail.empty()) reason += " (" + SanitizeForLog(detail) + ")";
  if (code == CURLE_URL_MALFORMAT || code == CURLE_UNSUPPORTED_PROTOCOL) {
    return Failure{FailureKind::kPermanent, "cannot send to this URL: " + reason};
  }
  if (HandshakeRefused(code, detail)) {
    return Failure{FailureKind::kUnavailable,
                   "cannot reach the endpoint: it refused the TLS handshake: " + reason};
  }
  if (!sent) return Failure{FailureKind::kUnavailable, "cannot reach the endpoint: " + reason};
  return Failure{FailureKind::kOutcomeUnknown, "sent, no answer: " + reason};
}

}  // namespace outbox::webhook
