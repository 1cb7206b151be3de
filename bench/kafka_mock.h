#pragma once
// outbox-kafka-mock (apps/kafka_mock) as a child process, for the benchmark's Kafka drains
// (outbox_bench.cpp) and the chaos ledger (chaos.cpp).

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace outbox::bench {

// outbox-kafka-mock as a child process: its bootstrap servers from its first line of output, its
// commands through its standard input. SIGTERM when this object dies (SIGKILL if this program
// dies first).
class KafkaMock {
 public:
  KafkaMock(const std::string& program, int brokers) {
    std::array<int, 2> in{};
    std::array<int, 2> out{};
    if (pipe2(in.data(), O_CLOEXEC) != 0 || pipe2(out.data(), O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe2 failed");
    }
    const std::string count = std::to_string(brokers);
    std::vector<char*> argv{const_cast<char*>(program.c_str()),  // NOLINT: execv's signature
                            const_cast<char*>("--brokers"),      // NOLINT
                            const_cast<char*>(count.c_str()), nullptr};
    std::fflush(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      close_range(3, ~0U, 0);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    if (pid_ > 0) bootstraps_ = ReadLine();
    if (bootstraps_.find(':') == std::string::npos) {
      End();
      throw std::runtime_error(program + " printed no bootstrap servers");
    }
  }
  ~KafkaMock() { End(); }
  KafkaMock(const KafkaMock&) = delete;
  KafkaMock& operator=(const KafkaMock&) = delete;

  const std::string& bootstraps() const { return bootstraps_; }
  pid_t pid() const { return pid_; }
  // One command (see outbox-kafka-mock --help); throws unless it answers "ok".
  void Command(const std::string& line) {
    std::fprintf(to_, "%s\n", line.c_str());
    std::fflush(to_);
    const std::string answer = ReadLine();
    if (answer != "ok") throw std::runtime_error("outbox-kafka-mock: " + line + ": " + answer);
  }

 private:
  std::string ReadLine() {
    std::array<char, 4096> line{};
    if (std::fgets(line.data(), static_cast<int>(line.size()), from_) == nullptr) return "(exited)";
    std::string text = line.data();
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
  }
  // SIGTERM, then SIGKILL if it has not exited after 10 s.
  void End() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{10};
      while (waitpid(pid_, nullptr, WNOHANG) != pid_) {
        if (std::chrono::steady_clock::now() > until) {
          kill(pid_, SIGKILL);
          waitpid(pid_, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{20});
      }
      pid_ = -1;
    }
    if (to_ != nullptr) std::fclose(to_);
    if (from_ != nullptr) std::fclose(from_);
    to_ = from_ = nullptr;
  }

  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string bootstraps_;
};

}  // namespace outbox::bench
