// The consumer's side of the claim check: fetch the object a delivery refers to and verify it.

#include <charconv>

#include "outbox/sink/claim_check.h"
#include "s3.h"

namespace outbox::claim_check {
namespace {

FetchResult Error(FetchError error, std::string message) {
  return FetchResult{
      .error = error, .message = std::move(message), .payload = {}, .content_type = {}};
}

const std::string* Find(const Headers& headers, std::string_view name) {
  const auto found = headers.find(name);
  return found == headers.end() ? nullptr : &found->second;
}

bool IsLowerHex64(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

std::optional<Reference> ReferenceFromHeaders(const Headers& headers, FetchResult* why) {
  const auto fail = [why](FetchError error, std::string message) -> std::optional<Reference> {
    if (why != nullptr) *why = Error(error, std::move(message));
    return std::nullopt;
  };
  const std::string* url = Find(headers, kUrlHeader);
  if (url == nullptr) {
    return fail(FetchError::kNotClaimChecked,
                "no " + std::string{kUrlHeader} + " header: the payload is in the message");
  }
  const std::string* size = Find(headers, kSizeHeader);
  const std::string* sha256 = Find(headers, kSha256Header);
  if (size == nullptr || sha256 == nullptr) {
    return fail(FetchError::kMalformed, "a claim-checked message needs the headers " +
                                            std::string{kSizeHeader} + " and " +
                                            std::string{kSha256Header});
  }
  Reference reference{.url = *url, .size = 0, .sha256 = *sha256, .content_type = {}};
  const auto [end, error] =
      std::from_chars(size->data(), size->data() + size->size(), reference.size);
  if (error != std::errc{} || end != size->data() + size->size() || size->empty()) {
    return fail(FetchError::kMalformed,
                std::string{kSizeHeader} + " is not a byte count: \"" + *size + "\"");
  }
  if (!IsLowerHex64(reference.sha256)) {
    return fail(FetchError::kMalformed,
                std::string{kSha256Header} + " is not 64 lower-case hex digits");
  }
  if (const std::string* type = Find(headers, kContentTypeHeader)) reference.content_type = *type;
  return reference;
}

FetchResult FetchClaimCheck(const Headers& headers, const StoreOptions& store) {
  FetchResult why;
  const std::optional<Reference> reference = ReferenceFromHeaders(headers, &why);
  if (!reference) return why;
  return FetchClaimCheck(*reference, store);
}

FetchResult FetchClaimCheck(const Reference& reference, const StoreOptions& store) {
  // Only objects of the configured bucket: a message must not make the consumer sign requests
  // to a host of its choosing.
  const std::string base = ObjectUrl(store, "");
  if (!reference.url.starts_with(base) || reference.url.size() == base.size() ||
      reference.url.find_first_of("?#", base.size()) != std::string::npos) {
    return Error(FetchError::kMalformed,
                 "claim check URL " + reference.url + " is not an object of " + base);
  }
  S3Client client(store);
  const S3Response response = client.Get(reference.url, store.request_timeout);
  const std::string where = "claim check " + reference.url + ": ";
  if (!response.transport_error.empty()) {
    return Error(FetchError::kUnavailable, where + response.transport_error);
  }
  if (response.status == 404) {
    return Error(FetchError::kMissing, where + "no such object (" + response.Describe() +
                                           "): deleted, expired (retention) or another bucket");
  }
  if (response.status == 401 || response.status == 403) {
    return Error(FetchError::kDenied, where + "access denied (" + response.Describe() + ")");
  }
  if (!response.ok()) {
    return Error(FetchError::kUnavailable, where + response.Describe());
  }
  if (response.body.size() != reference.size) {
    return Error(FetchError::kSizeMismatch, where + std::to_string(response.body.size()) +
                                                " bytes, the message says " +
                                                std::to_string(reference.size));
  }
  const std::string digest = Sha256Hex(response.body);
  if (digest != reference.sha256) {
    return Error(FetchError::kDigestMismatch,
                 where + "SHA-256 " + digest + ", the message says " + reference.sha256);
  }
  return FetchResult{.error = FetchError::kNone,
                     .message = {},
                     .payload = response.body,
                     .content_type = reference.content_type};
}

}  // namespace outbox::claim_check
