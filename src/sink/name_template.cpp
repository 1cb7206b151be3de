#include "outbox/sink/name_template.h"

#include "outbox/core/error.h"

namespace outbox {

NameTemplate NameTemplate::Parse(std::string_view text, const std::string& key) {
  NameTemplate parsed;
  parsed.text_ = std::string{text};
  std::string literal;
  for (std::size_t at = 0; at < text.size();) {
    const char c = text[at];
    if (c == '}') {
      throw ConfigError(key, "unexpected '}' at offset " + std::to_string(at) + " in '" +
                                 std::string{text} +
                                 "'; placeholders are {topic}, {target} and {type}");
    }
    if (c != '{') {
      literal += c;
      ++at;
      continue;
    }
    const std::size_t close = text.find('}', at);
    if (close == std::string_view::npos) {
      throw ConfigError(key, "unterminated '{' at offset " + std::to_string(at) + " in '" +
                                 std::string{text} + "'");
    }
    const std::string_view name = text.substr(at + 1, close - at - 1);
    Field field = Field::kLiteral;
    if (name == "topic") {
      field = Field::kTopic;
    } else if (name == "target") {
      field = Field::kTarget;
    } else if (name == "type") {
      field = Field::kType;
    } else {
      throw ConfigError(key, "unknown placeholder '{" + std::string{name} + "}' in '" +
                                 std::string{text} +
                                 "'; placeholders are {topic}, {target} and {type}");
    }
    if (!literal.empty()) parsed.parts_.push_back({Field::kLiteral, std::move(literal)});
    literal.clear();
    parsed.parts_.push_back({field, {}});
    at = close + 1;
  }
  if (!literal.empty()) parsed.parts_.push_back({Field::kLiteral, std::move(literal)});
  return parsed;
}

std::string NameTemplate::Expand(const Envelope& envelope) const {
  if (parts_.size() == 1 && parts_[0].field == Field::kTopic) return envelope.topic;
  return Expand(envelope, nullptr);
}

std::string NameTemplate::Expand(const Envelope& envelope,
                                 std::string (*encode)(std::string_view)) const {
  std::string out;
  const auto append = [&out, encode](std::string_view value) {
    out += encode == nullptr ? std::string{value} : encode(value);
  };
  for (const Part& part : parts_) {
    switch (part.field) {
      case Field::kLiteral:
        out += part.literal;
        break;
      case Field::kTopic:
        append(envelope.topic);
        break;
      case Field::kTarget:
        append(envelope.target);
        break;
      case Field::kType:
        if (envelope.type) append(*envelope.type);
        break;
    }
  }
  return out;
}

bool NameTemplate::is_literal() const {
  for (const Part& part : parts_) {
    if (part.field != Field::kLiteral) return false;
  }
  return true;
}

}  // namespace outbox
