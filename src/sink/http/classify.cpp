#include "classify.h"

#include <algorithm>
#include <string>

#include "outbox/core/log_text.h"

namespace outbox::webhook {
namespace {

// How much of an answer's body a reason quotes.
constexpr std::size_t kQuotedBody = 200;

std::string Quote(std::string_view body) {
  if (body.empty()) return {};
  return ": " + SanitizeForLog(body.substr(0, kQuotedBody)) +
         (body.size() > kQuotedBody ? "..." : "");
}

}  // namespace

bool HonoursRetryAfter(long status) { return status == 429 || status == 503; }

std::optional<Failure> ClassifyStatus(long status, const std::vector<int>& retry_statuses,
                                      std::string_view body, std::string_view location) {
  if (status >= 200 && status < 300) return std::nullopt;
  const std::string code = "HTTP " + std::to_string(status);
  if (status >= 300 && status < 400) {
    return Failure{
        FailureKind::kRejected,
        code + ": redirected to " +
            (location.empty() ? std::string{"(no Location)"} : SanitizeForLog(location)) +
            "; redirects are not followed (point url at the final address)"};
  }
  const bool listed =
      std::find(retry_statuses.begin(), retry_statuses.end(), status) != retry_statuses.end();
  if (status >= 400 && status < 500 && status != 408 && status != 429 && !listed) {
    return Failure{FailureKind::kPermanent,
                   code + Quote(body) + " (a 4xx is not retried unless listed in retry_statuses)"};
  }
  return Failure{FailureKind::kRejected, code + Quote(body)};
}

Failure ClassifyError(CURLcode code, bool sent, std::string_view detail) {
  std::string reason = curl_easy_strerror(code);
  if (!detail.empty()) reason += " (" + SanitizeForLog(detail) + ")";
  if (code == CURLE_URL_MALFORMAT || code == CURLE_UNSUPPORTED_PROTOCOL) {
    return Failure{FailureKind::kPermanent, "cannot send to this URL: " + reason};
  }
  if (!sent) return Failure{FailureKind::kUnavailable, "cannot reach the endpoint: " + reason};
  return Failure{FailureKind::kOutcomeUnknown, "sent, no answer: " + reason};
}

}  // namespace outbox::webhook
