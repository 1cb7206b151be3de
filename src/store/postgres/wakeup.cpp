#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "connection.h"
#include "outbox/store/postgres.h"

namespace outbox::postgres {
namespace {

// An eventfd that Interrupt() writes to, so that poll() on the database socket can also be woken
// from another thread.
class EventFd {
 public:
  EventFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  ~EventFd() { close(fd_); }
  int fd() const { return fd_; }
  void Signal() const noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto written = write(fd_, &one, sizeof one);
  }
  void Drain() const noexcept {
    std::uint64_t value = 0;
    [[maybe_unused]] const auto read_bytes = read(fd_, &value, sizeof value);
  }

 private:
  int fd_;
};

class PostgresWakeup final : public Wakeup {
 public:
  PostgresWakeup(const std::string& conninfo, const std::string& schema)
      : connection_(conninfo),
        listen_sql_("LISTEN \"" + WakeupChannel(schema) + "\""),
        idle_sql_("UPDATE " + QuoteSchema(schema) + ".wakeup SET idle = true WHERE NOT idle"),
        lock_name_(WakeupLockName(schema)) {
    Listen();
  }

  bool AnnounceIdle() override {
    Ready();
    // The flag must be committed before the lock is tried: a writer that takes its shared lock
    // after the try then sees the flag and notifies.
    Exec(connection_.get(), "announce idle", idle_sql_);
    const auto result = Exec(connection_.get(), "announce idle: writers in flight",
                             "SELECT pg_try_advisory_xact_lock(hashtext($1))", {Param{lock_name_}});
    return std::string_view{PQgetvalue(result.get(), 0, 0)} == "t";
  }

  bool Wait(Deadline deadline) override {
    for (;;) {
      if (!connection_.get() || PQstatus(connection_.get()) != CONNECTION_OK) {
        try {
          Ready();
        } catch (const StoreError&) {
          // The relay's next database call reports the outage; here, just don't spin.
          SleepUntil(std::min(deadline, std::chrono::steady_clock::now() + kRetryPause));
          return std::chrono::steady_clock::now() < deadline;
        }
        return true;  // reconnected: notifications may have been missed meanwhile
      }
      if (TakeNotifications()) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      std::array<pollfd, 2> fds{
          {{PQsocket(connection_.get()), POLLIN, 0}, {interrupt_.fd(), POLLIN, 0}}};
      const int ready = poll(fds.data(), fds.size(), static_cast<int>(left.count()) + 1);
      if (ready < 0 && errno != EINTR) {
        throw std::system_error(errno, std::generic_category(), "wakeup: poll");
      }
      if (fds[1].revents != 0) {
        interrupt_.Drain();
        return true;
      }
      if (fds[0].revents != 0 && PQconsumeInput(connection_.get()) != 1) {
        connection_.Close();  // reconnect on the next turn
      }
    }
  }

  void Interrupt() override { interrupt_.Signal(); }

 private:
  static constexpr std::chrono::milliseconds kRetryPause{500};

  static void SleepUntil(Deadline until) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left.count() > 0) {
      timespec pause{};
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
      pause.tv_sec = ms / 1000;
      pause.tv_nsec = (ms % 1000) * 1000000;
      nanosleep(&pause, nullptr);
    }
  }

  void Ready() {
    if (connection_.get() && PQstatus(connection_.get()) == CONNECTION_OK) return;
    connection_.EnsureConnected();
    Listen();
  }

  void Listen() { Exec(connection_.get(), "listen", listen_sql_); }

  bool TakeNotifications() {
    bool any = false;
    while (PGnotify* notify = PQnotifies(connection_.get())) {
      any = true;
      PQfreemem(notify);
    }
    return any;
  }

  Connection connection_;
  std::string listen_sql_;
  std::string idle_sql_;
  std::string lock_name_;
  EventFd interrupt_;
};

}  // namespace

std::unique_ptr<Wakeup> OpenWakeup(const std::string& conninfo, const std::string& schema) {
  return std::make_unique<PostgresWakeup>(conninfo, schema);
}

}  // namespace outbox::postgres
