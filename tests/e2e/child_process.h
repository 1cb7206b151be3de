#pragma once
// A program the end-to-end tests start, signal and wait for (outboxd, the example consumer).
// SIGKILLed if still running when the object dies, so a failing test leaves nothing behind.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace outbox::testing {

class ChildProcess {
 public:
  // Runs argv[0] with `argv`; its stdout and stderr are appended to `log`.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      std::freopen(log.c_str(), "a", stderr);
      std::freopen(log.c_str(), "a", stdout);
      std::vector<char*> args;
      for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  void Signal(int signal) const { kill(pid_, signal); }

  // Waits (bounded) for the process to exit: its exit code, 128 + the signal that ended it, or
  // -1 on time-out.
  int Wait(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
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
