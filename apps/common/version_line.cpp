#include "version_line.h"

#include "outbox/core/version.h"
#include "outbox/store/postgres.h"

namespace outbox::apps {

std::string VersionLine(std::string_view program) {
  return std::string{program} + " " + kVersion + " (PostgreSQL schema version " +
         std::to_string(postgres::LatestSchemaVersion()) + ")";
}

}  // namespace outbox::apps
