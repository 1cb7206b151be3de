#pragma once
// The dashboard's files (apps/outboxd/ui/), compiled into outboxd by apps/outboxd/ui/embed.cmake:
// served under /ui by Operations, so the page needs nothing on disk and no build step of its own.

#include <span>
#include <string_view>

namespace outbox::outboxd {

struct UiAsset {
  std::string_view name;          // the file's name: "index.html", "app.js"
  std::string_view content_type;  // "text/html; charset=utf-8"
  std::string_view etag;          // strong: the file's SHA-256 in quotes
  std::string_view body;
};

// Every embedded file, in the order the build listed them.
std::span<const UiAsset> UiAssets();

}  // namespace outbox::outboxd
