#include "outbox/sink/host_port.h"

#include <charconv>

namespace outbox {

std::optional<HostPort> ParseHostPort(std::string_view text, int default_port) {
  std::string_view host = text;
  std::optional<std::string_view> port_text;
  if (text.starts_with('[')) {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port_text = rest.substr(1);
    }
  } else if (const std::size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  HostPort address{.host = std::string{host}, .port = default_port};
  if (port_text) {
    const auto [end, error] =
        std::from_chars(port_text->data(), port_text->data() + port_text->size(), address.port);
    if (port_text->empty() || error != std::errc{} ||
        end != port_text->data() + port_text->size() || address.port < 1 || address.port > 65535) {
      return std::nullopt;
    }
  }
  return address;
}

}  // namespace outbox
