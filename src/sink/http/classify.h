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

// The statuses a user listed (SinkOptions::retry_statuses, abandon_statuses).
struct StatusLists {
  const std::vector<int>& retry;    // retried with an attempt spent (kRejected)
  const std::vector<int>& abandon;  // abandoned at once (kPermanent)
};

// Whether `status` says the endpoint refuses the relay itself (401, 403, 407), not listed in
// either list: a state of the destination, not of the message. ClassifyStatus then answers
// kUnavailable; the sink decides whether the host or the message is to blame (sink.cpp,
// Refused).
bool RefusesRelay(long status, const StatusLists& lists);
// What such a status refuses: "its credentials" (401), "its permissions" (403), "its proxy
// credentials" (407).
std::string_view RefusalOf(long status);

// An answered request: nullopt for 2xx (published), else the failure. `body` is the start of the
// answer's body (quoted in the reason, cut short), `location` its Location header (redirects).
//   400, 413, 415, 422 and `abandon` (unless in `retry`): kPermanent (the message itself can never
//     be accepted);
//   401, 403, 407 (unless listed): kUnavailable, the endpoint refuses the relay (RefusesRelay);
//   any other status outside 2xx, and `retry`: kRejected (an attempt spent, retried).
std::optional<Failure> ClassifyStatus(long status, const StatusLists& lists, std::string_view body,
                                      std::string_view location);

// Whether a status may carry a Retry-After that the sink honours (429, 503).
bool HonoursRetryAfter(long status);

// A request that ended without an answer: `timed_out` when it ran for its whole request timeout
// (CURLE_OPERATION_TIMEDOUT at or after `timeout`, not the connect timeout), which is that
// request's outcome unknown whatever libcurl's text says (a transfer queued inside libcurl that
// times out is reported as a resolver failure "after 0 ms"); `timeout_name` says which limit it
// was ("request_timeout (5 s)", "the publish deadline").
Failure ClassifyTimeout(bool sent, std::string_view timeout_name);

// A request that ended without an answer. `sent`: some of it was written to a connection made or
// reused for it, so the endpoint may have acted on it; unless `detail` (libcurl's
// error text) shows that the endpoint refused the TLS handshake with an alert about certificates
// (TLS 1.3: the client's side of the handshake ends before the server has checked the client's
// certificate, so the request goes out, unread, and the refusal comes instead of an answer).
Failure ClassifyError(CURLcode code, bool sent, std::string_view detail);

}  // namespace outbox::webhook
