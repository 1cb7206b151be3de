#pragma once
// Libraries report through a callback; the daemon wires it to spdlog (STYLE.md point 9).

#include <cstdint>
#include <functional>
#include <string_view>

namespace outbox {

enum class LogLevel : std::uint8_t { kDebug, kInfo, kWarn, kError };

// Called from the thread that has something to say; must be thread-safe. Messages never contain
// secrets on purpose (passwords are masked before they get here); what a broker quotes back is
// redacted by the log sanitizer (log_text.h, secrets.h).
using LogFn = std::function<void(LogLevel level, std::string_view message)>;

}  // namespace outbox
