#pragma once
// Destination-name templates shared by the sinks (RabbitMQ exchanges and routing keys, Kafka
// topics): "{topic}", "orders.{type}", "{target}.{topic}".

#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/message.h"

namespace outbox {

class NameTemplate {
 public:
  // Parses `text`; the placeholders are {topic}, {target} and {type}. Throws ConfigError(key)
  // for any other '{' or '}'.
  static NameTemplate Parse(std::string_view text, const std::string& key);

  // The name for `envelope` ({type} is "" when the envelope has none).
  [[nodiscard]] std::string Expand(const Envelope& envelope) const;
  // The same with each placeholder's value passed through `encode` (the HTTP sink's URLs:
  // percent-encoding); the text around the placeholders is kept as written.
  [[nodiscard]] std::string Expand(const Envelope& envelope,
                                   std::string (*encode)(std::string_view)) const;
  // True when the template has no placeholder: every envelope gets the same name.
  [[nodiscard]] bool is_literal() const;
  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  enum class Field : unsigned char { kLiteral, kTopic, kTarget, kType };
  struct Part {
    Field field = Field::kLiteral;
    std::string literal;
  };

  std::string text_;
  std::vector<Part> parts_;
};

}  // namespace outbox
