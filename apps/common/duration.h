#pragma once
// The one way outboxctl's --older-than and outboxd's admin API read an age.

#include <chrono>
#include <string_view>

namespace outbox::apps {

// "30s", "10m", "2h", "30d" (or "0"); throws std::invalid_argument with a message that shows the
// expected form, and for negative or absurdly large (over 100 years) values.
std::chrono::seconds ParseDuration(std::string_view text);

}  // namespace outbox::apps
