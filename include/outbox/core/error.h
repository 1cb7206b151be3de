#pragma once
// Exceptions. They are for bad configuration, bad input and bugs; broker and database outages
// are reported as outbox::Failure values instead.

#include <stdexcept>
#include <string>

namespace outbox {

// A configuration value is missing, of the wrong type or out of range. `key` names it the way
// the user wrote it (e.g. "relay.batch_size").
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string key, const std::string& message)
      : std::runtime_error(key + ": " + message), key_(std::move(key)) {}
  [[nodiscard]] const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// A message handed to a writer is invalid (empty topic, bad header, payload over the limit).
class InvalidMessage : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace outbox
