#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

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

// Virtual transaction ids ("3/1234") from a text-format array; throws PgError (kPermanent) for
// anything else.
std::vector<std::string> ParseVirtualXids(std::string_view literal, std::string_view what) {
  std::vector<std::string> ids;
  if (literal.size() < 2 || literal.front() != '{' || literal.back() != '}') {
    throw PgError(FailureKind::kPermanent,
                  std::string{what} + ": expected a text array, got " + std::string{literal}, "");
  }
  literal = literal.substr(1, literal.size() - 2);
  while (!literal.empty()) {
    const auto comma = literal.find(',');
    const auto id = literal.substr(0, comma);
    if (id.empty() || id.find_first_not_of("0123456789/") != std::string_view::npos) {
      throw PgError(FailureKind::kPermanent,
                    std::string{what} + ": not a virtual transaction id: " + std::string{id}, "");
    }
    ids.emplace_back(id);
    literal = comma == std::string_view::npos ? std::string_view{} : literal.substr(comma + 1);
  }
  return ids;
}

class PostgresWakeup final : public Wakeup {
 public:
  PostgresWakeup(const std::string& conninfo, const std::string& schema)
      : connection_(conninfo),
        listen_sql_("LISTEN \"" + WakeupChannel(schema) + "\""),
        idle_sql_("SELECT gen, writers FROM " + QuoteSchema(schema) + ".relay_idle()"),
        withdraw_sql_("SELECT " + QuoteSchema(schema) + ".relay_withdraw($1)"),
        woken_sql_("SELECT " + QuoteSchema(schema) + ".relay_woken($1)"),
        running_sql_("SELECT " + QuoteSchema(schema) + ".writers_running($1::text[])") {
    Listen();
  }

  void AnnounceIdle() override {
    Ready();
    const auto result = Exec(connection_.get(), "announce idle", idle_sql_);
    gen_ = ParseInt64(Column(result.get(), 0, 0), "announce idle: generation");
    writers_ = ParseVirtualXids(Column(result.get(), 0, 1), "announce idle: writers");
    // The poll interval is not reset here: a writer that stays open across many idle spells is
    // polled at the slow rate, not from the fast start again at each one.
    next_poll_ = std::chrono::steady_clock::now() + poll_interval_;
  }

  void Withdraw() override {
    if (gen_ == 0) return;
    Ready();
    const std::string gen = std::to_string(gen_);
    Exec(connection_.get(), "withdraw idle", withdraw_sql_, {Param{gen}});
    gen_ = 0;
    writers_.clear();
  }

  WakeReason Wait(Deadline deadline) override {
    for (;;) {
      if (!connection_.get() || PQstatus(connection_.get()) != CONNECTION_OK) {
        try {
          Ready();
        } catch (const StoreError&) {
          // The relay's next database call reports the outage; here, just don't spin.
          SleepUntil(std::min(deadline, std::chrono::steady_clock::now() + kRetryPause));
          return std::chrono::steady_clock::now() < deadline ? WakeReason::kReconnected
                                                             : WakeReason::kTimeout;
        }
        return WakeReason::kReconnected;  // notifications may have been missed meanwhile
      }
      if (const auto notified = TakeNotifications()) {
        if (*notified > 0) Woken(*notified);
        return WakeReason::kNotified;
      }
      const auto now = std::chrono::steady_clock::now();
      if (!writers_.empty() && now >= next_poll_) {
        if (PollWriters()) return WakeReason::kWritersDone;
        continue;  // the poll may have read notifications
      }
      if (now >= deadline) return WakeReason::kTimeout;
      const auto until = writers_.empty() ? deadline : std::min(deadline, next_poll_);
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now);
      std::array<pollfd, 2> fds{
          {{PQsocket(connection_.get()), POLLIN, 0}, {interrupt_.fd(), POLLIN, 0}}};
      const int ready = poll(fds.data(), fds.size(), static_cast<int>(left.count()));
      if (ready < 0 && errno != EINTR) {
        throw std::system_error(errno, std::generic_category(), "wakeup: poll");
      }
      if (fds[1].revents != 0) {
        interrupt_.Drain();
        return WakeReason::kInterrupted;
      }
      if (fds[0].revents != 0 && PQconsumeInput(connection_.get()) != 1) {
        connection_.Close();  // reconnect on the next turn
      }
    }
  }

  void Interrupt() override { interrupt_.Signal(); }

 private:
  static constexpr std::chrono::milliseconds kRetryPause{500};
  // Writers that may have missed the idle mark are polled from every 1 ms, doubling up to every
  // 100 ms: at most 10 polls a second however long a writer's transaction stays open.
  static constexpr std::chrono::milliseconds kFirstPoll{1};
  static constexpr std::chrono::milliseconds kSlowestPoll{100};

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
    gen_ = 0;
    writers_.clear();
  }

  void Listen() { Exec(connection_.get(), "listen", listen_sql_); }

  // True when every writer listed at AnnounceIdle has ended. A failed poll counts as ended: the
  // relay then looks at the table once more, which is always safe.
  bool PollWriters() {
    try {
      const auto result =
          Exec(connection_.get(), "wait for writers", running_sql_, {Param{TextArray(writers_)}});
      writers_ = ParseVirtualXids(Column(result.get(), 0, 0), "wait for writers");
    } catch (const StoreError&) {
      writers_.clear();
    }
    if (writers_.empty()) {
      poll_interval_ = kFirstPoll;
      return true;
    }
    poll_interval_ = std::min(poll_interval_ * 2, kSlowestPoll);
    next_poll_ = std::chrono::steady_clock::now() + poll_interval_;
    return false;
  }

  // Tells writers that the relays asleep up to generation `gen` are woken.
  void Woken(std::int64_t gen) {
    const std::string text = std::to_string(gen);
    try {
      Exec(connection_.get(), "woken", woken_sql_, {Param{text}});
    } catch (const StoreError&) {
      // Writers keep notifying until the next announcement: more wake-ups, none missed.
    }
    gen_ = 0;
    writers_.clear();
  }

  // Nothing when no notification came from another connection; otherwise the highest idle
  // generation they named (0 when none named one). Our own Withdraw's notifications are not ours
  // to wake on.
  std::optional<std::int64_t> TakeNotifications() {
    std::optional<std::int64_t> highest;
    const int own_pid = PQbackendPID(connection_.get());
    while (PGnotify* notify = PQnotifies(connection_.get())) {
      if (notify->be_pid != own_pid) {
        std::int64_t gen = 0;
        const std::string_view payload{notify->extra};
        std::from_chars(payload.data(), payload.data() + payload.size(), gen);
        highest = std::max(highest.value_or(0), gen);
      }
      PQfreemem(notify);
    }
    return highest;
  }

  Connection connection_;
  std::string listen_sql_;
  std::string idle_sql_;
  std::string withdraw_sql_;
  std::string woken_sql_;
  std::string running_sql_;
  EventFd interrupt_;
  std::int64_t gen_ = 0;              // the idle generation announced; 0: none stands
  std::vector<std::string> writers_;  // writers that may have missed it, still running
  std::chrono::milliseconds poll_interval_ = kFirstPoll;
  Deadline next_poll_{};
};

}  // namespace

std::unique_ptr<Wakeup> OpenWakeup(const std::string& conninfo, const std::string& schema) {
  return std::make_unique<PostgresWakeup>(conninfo, schema);
}

}  // namespace outbox::postgres
