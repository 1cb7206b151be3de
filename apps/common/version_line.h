#pragma once
// What `outboxd --version` and `outboxctl --version` print: one line, the same for both.

#include <string>
#include <string_view>

namespace outbox::apps {

// "<program> <version> (PostgreSQL schema version <n>)": the release, and the schema version this
// build migrates to and requires (a relay refuses to start on an older one).
std::string VersionLine(std::string_view program);

}  // namespace outbox::apps
