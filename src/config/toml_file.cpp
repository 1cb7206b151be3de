#include "outbox/config/toml_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <sstream>
#include <system_error>
#include <toml.hpp>

#include "outbox/core/error.h"

namespace outbox::config {
namespace {

// `bytes` is the size, or with `more` what was read before giving up.
std::string TooLarge(const std::string& origin, std::uint64_t bytes, bool more = false) {
  return origin + " is " + (more ? "more than " : "") + std::to_string(more ? bytes - 1 : bytes) +
         " bytes; a configuration file may have at most 1 MiB (" + std::to_string(kMaxConfigBytes) +
         " bytes)";
}

}  // namespace

std::string ReadConfigFile(const std::string& path) {
  const std::string shown = CutErrorText(path, 256);
  const auto cannot_read = [&](const std::string& why) {
    return ConfigError("file", "cannot read " + shown + ": " + why);
  };
  // O_NONBLOCK: opening a FIFO nobody writes returns at once instead of waiting for a writer
  // (then fstat refuses it); O_NOCTTY: a terminal never becomes ours. A regular file reads the
  // same either way.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw cannot_read(std::system_category().message(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat status {};
  if (::fstat(fd, &status) != 0) throw cannot_read(std::system_category().message(errno));
  if (!S_ISREG(status.st_mode)) {
    const char* what = "not a regular file";
    switch (status.st_mode & S_IFMT) {
      case S_IFIFO:
        what = "a FIFO";
        break;
      case S_IFCHR:
        what = "a character device";
        break;
      case S_IFBLK:
        what = "a block device";
        break;
      case S_IFDIR:
        what = "a directory";
        break;
      case S_IFSOCK:
        what = "a socket";
        break;
      default:
        break;
    }
    throw cannot_read(std::string{"it is "} + what + ", not a regular file");
  }
  if (status.st_size > 0 && static_cast<std::uint64_t>(status.st_size) > kMaxConfigBytes) {
    throw ConfigError("file", TooLarge(shown, static_cast<std::uint64_t>(status.st_size)));
  }
  // At most one byte more than allowed, in case the file grows while it is read (or, like some
  // files under /proc, says it is empty).
  std::string text;
  std::array<char, 65536> buffer{};
  while (text.size() <= kMaxConfigBytes) {
    const std::size_t want = std::min(buffer.size(), kMaxConfigBytes + 1 - text.size());
    const ssize_t count = ::read(fd, buffer.data(), want);
    if (count > 0) {
      text.append(buffer.data(), static_cast<std::size_t>(count));
    } else if (count == 0) {
      break;
    } else if (errno != EINTR) {
      throw cannot_read(std::system_category().message(errno));
    }
  }
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError("file", TooLarge(shown, text.size(), /*more=*/true));
  }
  return text;
}

TomlValue ParseToml(std::string_view text, const std::string& origin) {
  if (text.size() > kMaxConfigBytes) throw ConfigError("file", TooLarge(origin, text.size()));
  CheckTomlLimits(text, origin);
  try {
    std::istringstream stream{std::string{text}};
    return toml::parse<toml::discard_comments, std::map, std::vector>(stream, origin);
  } catch (const std::exception& error) {
    // toml11 quotes the offending line, which may hold a password and be as long as the file.
    throw ConfigError("file", origin + " is not valid TOML: " +
                                  CutErrorText(error.what(), 160, 4096, [](std::string_view line) {
                                    return MaskPassword(line);
                                  }));
  }
}

}  // namespace outbox::config
