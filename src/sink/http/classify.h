#pragma once
// What an endpoint's answer, or libcurl's error, means for a message (sink/http.h lists the
// rules).

#include <curl/curl.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/failure.h"

namespace outbox::webhook {

// An answered request: nullopt for 2xx (published), else the failure. `body` is the start of the
// answer's body (quoted in the reason, cut short), `location` its Location header (redirects).
std::optional<Failure> ClassifyStatus(long status, const std::vector<int>& retry_statuses,
                                      std::string_view body, std::string_view location);

// Whether a status may carry a Retry-After that the sink honours (429, 503).
bool HonoursRetryAfter(long status);

// A request that ended without an answer. `sent`: some of it was written to a connection made or
// reused for it, so the endpoint may have acted on it; unless `detail` (libcurl's
// error text) shows that the endpoint refused the TLS handshake with an alert about certificates
// (TLS 1.3: the client's side of the handshake ends before the server has checked the client's
// certificate, so the request goes out, unread, and the refusal comes instead of an answer).
Failure ClassifyError(CURLcode code, bool sent, std::string_view detail);

}  // namespace outbox::webhook
