#include "classify.h"

#include <array>

namespace outbox::redis {
namespace {

// Error codes that say the server cannot take writes now, whatever the message.
constexpr std::array<std::string_view, 10> kServerStateCodes = {
    "LOADING",      // the dataset is being loaded after a restart
    "BUSY",         // a script or function runs past its time limit
    "MASTERDOWN",   // a replica that lost its primary (replica-serve-stale-data no)
    "READONLY",     // a replica: the primary is elsewhere (failover)
    "NOAUTH",       // authentication required (the server restarted with requirepass)
    "OOM",          // maxmemory reached with a noeviction policy
    "TRYAGAIN",     // cluster resharding
    "CLUSTERDOWN",  // cluster not serving
    "NOREPLICAS",   // min-replicas-to-write not met
    "MISCONF",      // snapshots failing with stop-writes-on-bgsave-error
};

}  // namespace

ErrorVerdict ClassifyErrorReply(std::string_view text) {
  ErrorVerdict verdict;
  verdict.code = std::string{text.substr(0, text.find(' '))};
  const std::string reason = Shorten(text);
  for (const std::string_view code : kServerStateCodes) {
    if (verdict.code != code) continue;
    verdict.server_state = true;
    verdict.reconnect = code == "READONLY" || code == "NOAUTH";
    verdict.out_of_memory = code == "OOM";
    verdict.failure = {
        .kind = FailureKind::kUnavailable,
        .reason = verdict.out_of_memory
                      ? "not written: the server is out of memory (" + reason + ")"
                      : "not written: the server cannot take writes now (" + reason + ")"};
    return verdict;
  }
  // NOPERM: the relay's user may not write this key (ACL): a state of the destination, not of the
  // message (issue #40); it waits, no attempt spent, until the permission is granted. Not a
  // server state: other keys may be writable.
  if (verdict.code == "NOPERM") {
    verdict.failure = {.kind = FailureKind::kUnavailable, .reason = "not permitted: " + reason};
    return verdict;
  }
  // WRONGTYPE, ERR, CROSSSLOT, MOVED, ...: the server refused this command.
  verdict.failure = {.kind = FailureKind::kRejected, .reason = reason};
  return verdict;
}

}  // namespace outbox::redis
