// The claim check's options: their checks and the object URLs they make.

#include <algorithm>

#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/sink/claim_check.h"

namespace outbox::claim_check {
namespace {

constexpr std::size_t kMaxPrefixBytes = 512;

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// The endpoint without a trailing '/'.
std::string_view TrimmedEndpoint(std::string_view endpoint) {
  while (endpoint.ends_with('/')) endpoint.remove_suffix(1);
  return endpoint;
}

}  // namespace

void ValidateOptions(const Options& options) {
  const StoreOptions& store = options.store;
  const std::string_view endpoint = TrimmedEndpoint(store.endpoint);
  const std::size_t scheme_end = endpoint.find("://");
  const std::string_view scheme =
      scheme_end == std::string_view::npos ? std::string_view{} : endpoint.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    throw ConfigError("endpoint",
                      "must be an http:// or https:// URL without a path, e.g. "
                      "\"https://s3.eu-west-1.amazonaws.com\"");
  }
  const std::string_view authority = endpoint.substr(scheme_end + 3);
  if (authority.empty() || authority.find_first_of("/?#@ ") != std::string_view::npos ||
      HasControlCharacter(authority)) {
    throw ConfigError("endpoint",
                      "must be scheme://host[:port] only (no path, user info or query); the "
                      "bucket is `bucket`");
  }
  const std::string& bucket = store.bucket;
  if (bucket.size() < 3 || bucket.size() > 63 || !IsLowerAlnum(bucket.front()) ||
      !IsLowerAlnum(bucket.back()) || !std::all_of(bucket.begin(), bucket.end(), [](char c) {
        return IsLowerAlnum(c) || c == '.' || c == '-';
      })) {
    throw ConfigError("bucket", bucket.empty()
                                    ? "is required"
                                    : "must be an S3 bucket name: 3 to 63 characters a-z, 0-9, "
                                      "'.' and '-', starting and ending with a letter or digit");
  }
  if (store.region.empty() || !std::all_of(store.region.begin(), store.region.end(),
                                           [](char c) { return IsLowerAlnum(c) || c == '-'; })) {
    throw ConfigError("region", "must be a region name such as \"us-east-1\" (a-z, 0-9, '-')");
  }
  if (options.prefix.size() > kMaxPrefixBytes ||
      !std::all_of(options.prefix.begin(), options.prefix.end(), [](char c) {
        return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z') || c == '/' || c == '_' || c == '.' ||
               c == '-';
      })) {
    throw ConfigError("prefix", "may only hold a-z, A-Z, 0-9, '/', '_', '.' and '-' (at most " +
                                    std::to_string(kMaxPrefixBytes) + " bytes)");
  }
  if (options.threshold < 1) throw ConfigError("threshold", "must be at least 1 byte");
  if (options.retention.count() > 0 && options.prefix.empty()) {
    throw ConfigError("retention",
                      "needs a prefix: every object under it older than the retention is deleted");
  }
  if (store.access_key_id.empty() || HasControlCharacter(store.access_key_id)) {
    throw ConfigError("access_key_id",
                      "is required (or set AWS_ACCESS_KEY_ID), without control characters");
  }
  if (store.secret_access_key.empty() || HasControlCharacter(store.secret_access_key)) {
    throw ConfigError("secret_access_key",
                      "is required (or set AWS_SECRET_ACCESS_KEY), without control characters");
  }
  if (HasControlCharacter(store.session_token)) {
    throw ConfigError("session_token", "must not contain control characters");
  }
}

std::string ObjectKey(const Options& options, const MessageId& id) {
  return options.prefix + id.ToString();
}

std::string ObjectUrl(const StoreOptions& store, std::string_view key) {
  const std::string_view endpoint = TrimmedEndpoint(store.endpoint);
  if (store.url_style == UrlStyle::kPath) {
    return std::string{endpoint} + "/" + store.bucket + "/" + std::string{key};
  }
  const std::size_t scheme_end = endpoint.find("://");
  if (scheme_end == std::string_view::npos) return {};
  return std::string{endpoint.substr(0, scheme_end + 3)} + store.bucket + "." +
         std::string{endpoint.substr(scheme_end + 3)} + "/" + std::string{key};
}

}  // namespace outbox::claim_check
