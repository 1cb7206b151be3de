#pragma once
// Exceptions. They are for bad configuration, bad input and bugs; broker and database outages
// are reported as outbox::Failure values instead.

#include <stdexcept>
#include <string>
#include <utility>

namespace outbox {

// A configuration value is missing, of the wrong type or out of range. `key` names it the way
// the user wrote it (e.g. "relay.batch_size"); what() is "<key>: <message>". A caller that knows
// the key better (a sink names its own "url"; the user wrote "sinks.orders.url") throws again
// with its key and message().
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string key, std::string message)
      : std::runtime_error(key + ": " + message),
        key_(std::move(key)),
        message_(std::move(message)) {}
  [[nodiscard]] const std::string& key() const { return key_; }
  // What is wrong, without the key.
  [[nodiscard]] const std::string& message() const { return message_; }

 private:
  std::string key_;
  std::string message_;
};

// A message handed to a writer is invalid (empty topic, bad header, payload over the limit).
class InvalidMessage : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace outbox
