#pragma once
// A POSIX file descriptor with one owner, and a write loop that reports how far it got.

#include <cstddef>
#include <string>
#include <string_view>

#include "outbox/core/clock.h"

namespace outbox::file {

// Move-only. An owned descriptor is closed by Close() (which reports) or by the destructor (which
// does not); a borrowed one (standard output) is never closed.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  static FileDescriptor Own(int fd) { return FileDescriptor{fd, true}; }
  static FileDescriptor Borrow(int fd) { return FileDescriptor{fd, false}; }

  FileDescriptor(FileDescriptor&& other) noexcept;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();

  [[nodiscard]] int get() const { return fd_; }
  [[nodiscard]] bool valid() const { return fd_ >= 0; }

  // Closes an owned descriptor and forgets a borrowed one. Returns 0 or the errno value of
  // close(2); the descriptor is released either way.
  int Close();

 private:
  FileDescriptor(int fd, bool owned) : fd_(fd), owned_(owned) {}

  int fd_ = -1;
  bool owned_ = false;
};

struct WriteResult {
  std::size_t written = 0;  // bytes of the data that were written, from its start
  int error = 0;            // errno value of the failed call; 0 when none failed
  bool timed_out = false;   // the deadline passed while waiting for room

  [[nodiscard]] bool complete(std::string_view data) const { return written == data.size(); }
};

// Writes all of `data` to `fd`, retrying partial writes and EINTR. With `wait_for_room` (pipes,
// terminals, sockets) each write is preceded by a poll(2) bounded by `deadline` and is at most
// PIPE_BUF bytes, so that it cannot block past the deadline; a non-blocking descriptor's EAGAIN
// waits the same way. Without it (regular files, whose writes do not wait for a reader) the
// deadline is not consulted.
WriteResult WriteAll(int fd, std::string_view data, bool wait_for_room, Deadline deadline);

// strerror(3) text for an errno value, thread-safe.
std::string ErrnoText(int error);

}  // namespace outbox::file
