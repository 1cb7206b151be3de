#pragma once
// A broker address as sinks' configurations write it: "host", "host:port", "[v6]" or
// "[v6]:port" (RabbitMQ URLs, Kafka bootstrap lists).

#include <optional>
#include <string>
#include <string_view>

namespace outbox {

struct HostPort {
  std::string host;  // without brackets; may be empty (the caller decides what that means)
  int port = 0;
};

// `text` split into host and port, `default_port` when it names none; nullopt for an unclosed
// '[', anything but ":port" after ']', an empty port after ':', or a port that is not a number
// in 1..65535.
std::optional<HostPort> ParseHostPort(std::string_view text, int default_port);

}  // namespace outbox
