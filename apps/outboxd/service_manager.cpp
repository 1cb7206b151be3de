#include "service_manager.h"

#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace outbox::outboxd {

void NotifyReady(std::string_view status) {
  const std::string message = "READY=1\nSTATUS=" + std::string{status};
  // Without NOTIFY_SOCKET sd_notify does nothing and returns 0; an error is not worth failing for.
  sd_notify(0, message.c_str());
}

void NotifyStopping(std::chrono::milliseconds drain) {
  // A margin over the drain for settling and the last log lines.
  const auto extend =
      std::chrono::duration_cast<std::chrono::microseconds>(drain + std::chrono::seconds{5});
  const std::string message =
      "STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC=" + std::to_string(extend.count());
  sd_notify(0, message.c_str());
}

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long device = 0;
  unsigned long long inode = 0;
  if (std::sscanf(stream, "%llu:%llu", &device, &inode) != 2) return false;
  struct stat info {};
  if (fstat(STDERR_FILENO, &info) != 0) return false;
  return info.st_dev == device && info.st_ino == inode;
}

}  // namespace outbox::outboxd
