#pragma once
// outboxd under a service manager (systemd, Type=notify): readiness and shutdown notifications,
// and log lines the journal files under the right priority. Outside systemd (no NOTIFY_SOCKET,
// stderr not the journal) every call is a no-op and the log format is the plain one.

#include <chrono>
#include <string>
#include <string_view>

namespace outbox::outboxd {

// Tells the service manager that outboxd is up (configuration read, database reached, schema
// checked, sinks built): `systemctl start` returns now, and dependent units start. `status` is
// shown by `systemctl status`.
void NotifyReady(std::string_view status);

// Tells the service manager that outboxd is draining, and that the drain may take up to `drain`
// (shutdown_timeout): the manager extends its stop timeout by that much, so it never SIGKILLs a
// drain the configuration allows.
void NotifyStopping(std::chrono::milliseconds drain);

// Whether stderr is connected to the systemd journal (JOURNAL_STREAM names its device and inode):
// then the journal adds the time, and a "<N>" prefix gives each line its syslog priority.
bool StderrIsJournal();

}  // namespace outbox::outboxd
