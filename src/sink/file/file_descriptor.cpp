#include "file_descriptor.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <system_error>
#include <utility>

namespace outbox::file {

FileDescriptor::FileDescriptor(FileDescriptor&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), owned_(std::exchange(other.owned_, false)) {}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

FileDescriptor::~FileDescriptor() { Close(); }

int FileDescriptor::Close() {
  const int fd = std::exchange(fd_, -1);
  const bool owned = std::exchange(owned_, false);
  if (fd < 0 || !owned) return 0;
  // Linux releases the descriptor even when close fails (also on EINTR): never retry.
  return ::close(fd) == 0 ? 0 : errno;
}

std::string ErrnoText(int error) { return std::system_category().message(error); }

WriteResult WriteAll(int fd, std::string_view data, bool wait_for_room, Deadline deadline) {
  WriteResult result;
  while (result.written < data.size()) {
    std::size_t chunk = data.size() - result.written;
    if (wait_for_room) chunk = std::min<std::size_t>(chunk, PIPE_BUF);
    if (wait_for_room) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        result.timed_out = true;
        return result;
      }
      const auto remaining = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
      pollfd poll_fd{.fd = fd, .events = POLLOUT, .revents = 0};
      const int ready =
          ::poll(&poll_fd, 1, static_cast<int>(std::min<decltype(remaining)>(remaining, INT_MAX)));
      if (ready < 0) {
        if (errno == EINTR) continue;
        result.error = errno;
        return result;
      }
      if (ready == 0) continue;  // the deadline check above ends the wait
      // Writable, or POLLERR/POLLHUP/POLLNVAL: the write below reports those.
    }
    const ssize_t count = ::write(fd, data.data() + result.written, chunk);
    if (count < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_for_room) continue;  // poll again
      result.error = errno;
      return result;
    }
    if (count == 0) {  // not expected for a non-empty write; do not spin
      result.error = EIO;
      return result;
    }
    result.written += static_cast<std::size_t>(count);
  }
  return result;
}

}  // namespace outbox::file
