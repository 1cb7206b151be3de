#pragma once
// A small S3 client over libcurl's easy interface: PUT, GET and DELETE of one object, and one page
// of ListObjectsV2, signed with AWS Signature Version 4 by libcurl itself (CURLOPT_AWS_SIGV4).
// One connection, kept alive between requests; not thread-safe (one per thread).

#include <curl/curl.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/sink/claim_check.h"
#include "sink/curl_handles.h"

namespace outbox::claim_check {

using curl::EasyPtr;
using curl::SlistPtr;

struct S3Response {
  long status = 0;  // the HTTP status; 0 when no answer came (transport_error says why)
  std::string transport_error;
  std::string body;        // the answer (an S3 error document, an object, a listing)
  std::string error_code;  // S3's <Code> of an error answer, when there is one

  [[nodiscard]] bool ok() const { return transport_error.empty() && status / 100 == 2; }
  // "HTTP 403 AccessDenied" / "connect: Connection refused": for messages.
  [[nodiscard]] std::string Describe() const;
};

class S3Client {
 public:
  explicit S3Client(StoreOptions store);

  S3Response Put(std::string_view key, std::string_view body, std::string_view content_type,
                 std::string_view sha256_hex, std::chrono::milliseconds timeout);
  // GET of an object's full URL (ObjectUrl), which must be of this store.
  S3Response Get(const std::string& url, std::chrono::milliseconds timeout);
  S3Response Delete(std::string_view key, std::chrono::milliseconds timeout);
  // One page (up to 1000 keys) of ListObjectsV2 under `prefix`, after `continuation` (empty: the
  // first page).
  S3Response List(std::string_view prefix, std::string_view continuation,
                  std::chrono::milliseconds timeout);

 private:
  S3Response Perform(const std::string& url, const char* method, std::string_view body,
                     std::string_view content_type, std::string_view sha256_hex,
                     std::chrono::milliseconds timeout);

  StoreOptions store_;
  EasyPtr easy_;
};

// An object of a listing.
struct ListedObject {
  std::string key;
  std::chrono::system_clock::time_point last_modified;
};
// The objects of a ListObjectsV2 answer, and its NextContinuationToken ("" when it is the last
// page). Keys with XML escapes in them (not written by the claim check) are left out.
std::vector<ListedObject> ParseListing(std::string_view xml, std::string& next_continuation);

// `text` with every byte but A-Z a-z 0-9 - _ . ~ as %XX: SigV4's encoding of a query value.
std::string UriEncode(std::string_view text);

}  // namespace outbox::claim_check
