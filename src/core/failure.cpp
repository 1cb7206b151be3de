#include "outbox/core/failure.h"

#include <array>

namespace outbox {
namespace {

constexpr std::array<std::string_view, kFailureKindCount> kNames = {
    "unavailable", "rejected", "permanent", "lease_lost", "outcome_unknown"};

}  // namespace

std::string_view NameOf(FailureKind kind) { return kNames.at(static_cast<std::size_t>(kind)); }

std::optional<FailureKind> ParseFailureKind(std::string_view name) {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<FailureKind>(i);
  }
  return std::nullopt;
}

std::string Failure::Describe() const {
  std::string text{NameOf(kind)};
  if (!reason.empty()) text.append(": ").append(reason);
  return text;
}

}  // namespace outbox
