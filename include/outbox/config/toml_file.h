#pragma once
// Reading a configuration file, as outboxd and outboxctl read outboxd's: bounded in size, refusing
// what is not a regular file without waiting on it, and parsed with errors that name no secret.

#include <cstddef>
#include <string>
#include <string_view>

#include "outbox/config/toml_table.h"

namespace outbox::config {

// The largest configuration file (or text) read: 1 MiB.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;

// The text of the file at `path`. Throws ConfigError with key "file" when it cannot be read, is
// not a regular file (a FIFO, a device or a directory is refused without waiting on it) or is
// larger than kMaxConfigBytes; messages quote at most a short prefix of a long path.
std::string ReadConfigFile(const std::string& path);

// `text` parsed as TOML; `origin` names it in messages (usually the path). Throws ConfigError
// with key "file" when it is larger than kMaxConfigBytes, refused by CheckTomlLimits, or not
// valid TOML (with toml11's line and column, and any password on the quoted line masked).
TomlValue ParseToml(std::string_view text, const std::string& origin);

}  // namespace outbox::config
