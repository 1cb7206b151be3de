#pragma once
// A program the end-to-end tests and the benchmark start, signal and wait for (outboxd, the
// example consumer). SIGKILLed if still running when the object dies, and by the kernel if the
// thread that started it dies first (a crashed or timed-out test leaves nothing behind).

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace outbox::testing {

class ChildProcess {
 public:
  // Runs argv[0] with `argv`; its stdout and stderr are appended to `log`. Safe to call while
  // other threads run: everything is prepared before fork, and the child only makes
  // async-signal-safe calls until exec.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log) {
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));  // NOLINT: execv
    args.push_back(nullptr);
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error("cannot open " + log + ": " + std::strerror(errno));
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
      execv(args[0], args.data());
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
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The running child's process id; -1 once it has been waited for.
  [[nodiscard]] pid_t pid() const { return pid_; }

  // Sends `signal`; nothing once the child has been waited for (kill(-1) would reach every
  // process of the user).
  void Signal(int signal) const {
    if (pid_ > 0) kill(pid_, signal);
  }

  // Waits (bounded) for the process to exit: its exit code, 128 + the signal that ended it, or
  // -1 on time-out (and when it was waited for already).
  int Wait(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (pid_ > 0 && std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
    }
    return -1;
  }

  int Stop(int signal = SIGTERM, std::chrono::seconds limit = std::chrono::seconds{30}) {
    Signal(signal);
    return Wait(limit);
  }

 private:
  pid_t pid_ = -1;
};

// outboxd with `config`; its log is `config` + ".log".
class Outboxd : public ChildProcess {
 public:
  explicit Outboxd(const std::string& config)
      : ChildProcess({OUTBOXD_PATH, "--config", config}, config + ".log") {}
};

}  // namespace outbox::testing
