#pragma once
// A program the end-to-end tests and the benchmark start, signal and wait for (outboxd, the
// example consumer). SIGKILLed if still running when the object dies, and by the kernel if the
// thread that started it dies first (a crashed or timed-out test leaves nothing behind).
//
// A program that is stopped soon after it starts must have installed its signal handling first,
// or SIGTERM's default action ends it (exit 143 instead of a drain). So a child can be started
// with a readiness check — outboxd's systemd-style READY=1, or a start-up line in its log — and
// Stop() with any signal but SIGKILL waits (bounded) until the child is ready before it signals.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;  // NOLINT: POSIX

namespace outbox::testing {

// How a child says it is ready for signals.
struct Ready {
  enum class Kind { kNone, kNotify, kLogLine };
  Kind kind = Kind::kNone;
  std::string line;  // kLogLine: this text in the log, written after the child started

  // Nothing to wait for (servers the test reaches over the network before it goes on).
  static Ready None() { return {}; }
  // sd_notify's READY=1 on a socket of the test's own, passed as NOTIFY_SOCKET (outboxd sends it
  // once its configuration, database, sinks and signal thread are up).
  static Ready Notify() { return {Kind::kNotify, {}}; }
  // `text` appears in the log after the start (the example consumer's start-up line).
  static Ready LogLine(std::string text) { return {Kind::kLogLine, std::move(text)}; }
};

class ChildProcess {
 public:
  // Runs argv[0] with `argv`; its stdout and stderr are appended to `log`. Safe to call while
  // other threads run: everything is prepared before fork, and the child only makes
  // async-signal-safe calls until exec.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log,
               Ready ready = Ready::None())
      : log_(log), ready_(std::move(ready)) {
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));  // NOLINT: execv
    args.push_back(nullptr);
    std::vector<std::string> environment_text;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      if (std::string_view{*entry}.starts_with("NOTIFY_SOCKET=")) continue;
      environment_text.emplace_back(*entry);
    }
    if (ready_.kind == Ready::Kind::kNotify) environment_text.push_back(OpenNotifySocket());
    std::vector<char*> environment;
    for (auto& entry : environment_text) environment.push_back(entry.data());
    environment.push_back(nullptr);
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error("cannot open " + log + ": " + std::strerror(errno));
    struct stat info {};
    log_offset_ = fstat(log_fd, &info) == 0 ? info.st_size : 0;
    // The child inherits unflushed stdio buffers and would write them out again.
    std::fflush(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) {
      close(log_fd);
      throw std::runtime_error(std::string{"fork: "} + std::strerror(errno));
    }
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);  // the parent died before prctl
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
      close_range(3, ~0U, 0);  // the test's own connections are not the child's
      execve(args[0], args.data(), environment.data());
      constexpr std::string_view kFailed = "child_process: cannot execute the program\n";
      [[maybe_unused]] const ssize_t ignored = write(STDERR_FILENO, kFailed.data(), kFailed.size());
      _exit(127);
    }
    close(log_fd);
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (notify_fd_ >= 0) close(notify_fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The running child's process id; -1 once it has been waited for.
  [[nodiscard]] pid_t pid() const { return pid_; }

  // Sends `signal` at once, ready or not; nothing once the child has been waited for (kill(-1)
  // would reach every process of the user).
  void Signal(int signal) const {
    if (pid_ > 0) kill(pid_, signal);
  }

  // Waits (bounded) until the child said it is ready: true at once when it was started without a
  // readiness check or said so before; false when it exited first or `limit` passed.
  bool WaitReady(std::chrono::milliseconds limit = std::chrono::seconds{60}) {
    if (ready_.kind == Ready::Kind::kNone || is_ready_) return true;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!is_ready_ && pid_ > 0 && exit_code_ < 0) {
      if (ready_.kind == Ready::Kind::kNotify) {
        pollfd readable{notify_fd_, POLLIN, 0};
        if (poll(&readable, 1, 50) == 1) {
          char message[4096];
          const ssize_t size = recv(notify_fd_, message, sizeof message, 0);
          if (size > 0 &&
              std::string_view(message, static_cast<std::size_t>(size)).find("READY=1") !=
                  std::string_view::npos) {
            is_ready_ = true;
          }
        }
      } else {
        std::ifstream in(log_);
        in.seekg(log_offset_);
        const std::string written{std::istreambuf_iterator<char>(in), {}};
        is_ready_ = written.find(ready_.line) != std::string::npos;
        if (!is_ready_) std::this_thread::sleep_for(std::chrono::milliseconds{50});
      }
      if (!is_ready_) {
        Reap();
        if (std::chrono::steady_clock::now() > until) break;
      }
    }
    return is_ready_;
  }

  // Waits (bounded) for the process to exit: its exit code, 128 + the signal that ended it, or
  // -1 on time-out (and when it was waited for already).
  int Wait(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (pid_ > 0 && exit_code_ < 0 && std::chrono::steady_clock::now() < until) {
      if (Reap()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
    }
    const int code = exit_code_;
    exit_code_ = -1;  // reported once, as waitpid would
    return code;
  }

  // Sends `signal` once the child is ready (see WaitReady; SIGKILL goes at once) and waits for it
  // to exit, as Wait.
  int Stop(int signal = SIGTERM, std::chrono::seconds limit = std::chrono::seconds{30}) {
    if (signal != SIGKILL)
      WaitReady(std::max<std::chrono::milliseconds>(limit, std::chrono::seconds{60}));
    Signal(signal);
    return Wait(limit);
  }

 private:
  // A datagram socket in the abstract namespace (nothing to clean up on disk) for sd_notify;
  // returns the NOTIFY_SOCKET=... entry for the child's environment.
  std::string OpenNotifySocket() {
    static std::atomic<int> counter{0};
    const std::string name = "outbox-test-notify-" + std::to_string(getpid()) + "-" +
                             std::to_string(counter.fetch_add(1));
    notify_fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (notify_fd_ < 0) throw std::runtime_error(std::string{"socket: "} + std::strerror(errno));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (bind(notify_fd_, reinterpret_cast<const sockaddr*>(&address), length) != 0) {  // NOLINT
      throw std::runtime_error(std::string{"bind: "} + std::strerror(errno));
    }
    return "NOTIFY_SOCKET=@" + name;
  }

  // Collects the exit status without blocking; true once the child has exited.
  bool Reap() {
    if (pid_ <= 0) return exit_code_ >= 0;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }

  pid_t pid_ = -1;
  int exit_code_ = -1;  // once reaped, until Wait reports it
  std::string log_;
  off_t log_offset_ = 0;
  Ready ready_;
  int notify_fd_ = -1;
  bool is_ready_ = false;
};

// outboxd with `config`; its log is `config` + ".log".
class Outboxd : public ChildProcess {
 public:
  explicit Outboxd(const std::string& config)
      : ChildProcess({OUTBOXD_PATH, "--config", config}, config + ".log", Ready::Notify()) {}
};

}  // namespace outbox::testing
