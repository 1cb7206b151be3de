#include "s3.h"

#include <openssl/evp.h>

#include <array>
#include <ctime>
#include <stdexcept>
#include <utility>

namespace outbox::claim_check {
namespace {

// The payload hash of a request without a body.
constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct Sink {
  std::string* body;
  std::size_t max;
};

std::size_t Append(char* data, std::size_t size, std::size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t bytes = size * count;
  if (sink->body->size() + bytes > sink->max) return 0;  // aborts: CURLE_WRITE_ERROR
  sink->body->append(data, bytes);
  return bytes;
}

std::string Between(std::string_view text, std::string_view open, std::string_view close) {
  const std::size_t start = text.find(open);
  if (start == std::string_view::npos) return {};
  const std::size_t end = text.find(close, start + open.size());
  if (end == std::string_view::npos) return {};
  return std::string{text.substr(start + open.size(), end - start - open.size())};
}

}  // namespace

std::string S3Response::Describe() const {
  if (!transport_error.empty()) return transport_error;
  std::string text = "HTTP " + std::to_string(status);
  if (!error_code.empty()) text += " " + error_code;
  return text;
}

std::string Sha256Hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed (OpenSSL)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

S3Client::S3Client(StoreOptions store) : store_(std::move(store)) {
  curl::InitCurlOnce();
  easy_.reset(curl_easy_init());
  if (!easy_) throw std::runtime_error("curl_easy_init failed");
}

S3Response S3Client::Put(std::string_view key, std::string_view body, std::string_view content_type,
                         std::string_view sha256_hex, std::chrono::milliseconds timeout) {
  // Never libcurl's default for a body (application/x-www-form-urlencoded).
  return Perform(ObjectUrl(store_, key), "PUT", body,
                 content_type.empty() ? "application/octet-stream" : content_type, sha256_hex,
                 timeout);
}

S3Response S3Client::Get(const std::string& url, std::chrono::milliseconds timeout) {
  return Perform(url, "GET", {}, {}, kEmptySha256, timeout);
}

S3Response S3Client::Delete(std::string_view key, std::chrono::milliseconds timeout) {
  return Perform(ObjectUrl(store_, key), "DELETE", {}, {}, kEmptySha256, timeout);
}

S3Response S3Client::List(std::string_view prefix, std::string_view continuation,
                          std::chrono::milliseconds timeout) {
  // The parameters in SigV4's canonical order (sorted by name) and encoding, so that the query
  // libcurl signs is the canonical one whether or not it sorts and encodes it itself.
  std::string query;
  if (!continuation.empty()) query += "continuation-token=" + UriEncode(continuation) + "&";
  query += "list-type=2&max-keys=1000&prefix=" + UriEncode(prefix);
  std::string url = ObjectUrl(store_, "");
  url.pop_back();  // the bucket's URL, without the '/' of an empty key
  return Perform(url + "?" + query, "GET", {}, {}, kEmptySha256, timeout);
}

std::string UriEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  return out;
}

std::vector<ListedObject> ParseListing(std::string_view xml, std::string& next_continuation) {
  std::vector<ListedObject> objects;
  next_continuation = Between(xml, "<NextContinuationToken>", "</NextContinuationToken>");
  if (Between(xml, "<IsTruncated>", "</IsTruncated>") != "true") next_continuation.clear();
  std::size_t at = 0;
  while ((at = xml.find("<Contents>", at)) != std::string_view::npos) {
    const std::size_t end = xml.find("</Contents>", at);
    if (end == std::string_view::npos) break;
    const std::string_view contents = xml.substr(at, end - at);
    at = end;
    const std::string key = Between(contents, "<Key>", "</Key>");
    const std::string modified = Between(contents, "<LastModified>", "</LastModified>");
    std::tm time{};
    if (key.empty() || key.find('&') != std::string::npos ||
        ::strptime(modified.c_str(), "%Y-%m-%dT%H:%M:%S", &time) == nullptr) {
      continue;
    }
    objects.push_back(ListedObject{
        .key = key, .last_modified = std::chrono::system_clock::from_time_t(::timegm(&time))});
  }
  return objects;
}

S3Response S3Client::Perform(const std::string& url, const char* method, std::string_view body,
                             std::string_view content_type, std::string_view sha256_hex,
                             std::chrono::milliseconds timeout) {
  CURL* easy = easy_.get();
  curl_easy_reset(easy);  // keeps the connection
  S3Response response;
  const bool is_get = std::string_view{method} == "GET";
  Sink sink{&response.body, is_get ? std::size_t{1} << 40 : std::size_t{1} << 20};

  SlistPtr headers;
  const auto add = [&headers](const std::string& line) {
    curl_slist* list = curl_slist_append(headers.get(), line.c_str());
    if (list == nullptr) throw std::bad_alloc();
    static_cast<void>(headers.release());
    headers.reset(list);
  };
  // S3 wants the payload's hash in this header; libcurl signs it with the others.
  add("x-amz-content-sha256: " + std::string{sha256_hex});
  if (!content_type.empty()) add("Content-Type: " + std::string{content_type});
  if (!store_.session_token.empty()) add("x-amz-security-token: " + store_.session_token);
  // No "Expect:" to turn 100-continue off: libcurl would sign the empty header, which AWS does
  // not (botocore leaves expect out of the signature; tests/claim_check/sigv4_s3.py).

  const std::string sigv4 = "aws:amz:" + store_.region + ":s3";
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(easy, CURLOPT_USERNAME, store_.access_key_id.c_str());
  curl_easy_setopt(easy, CURLOPT_PASSWORD, store_.secret_access_key.c_str());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(store_.connect_timeout.count()));
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::max<std::int64_t>(
                       1, std::min(timeout, store_.request_timeout).count())));
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!store_.ca_file.empty()) curl_easy_setopt(easy, CURLOPT_CAINFO, store_.ca_file.c_str());
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &sink);
  if (is_get) {
    curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, method);
    if (std::string_view{method} == "PUT") {
      // As POST fields (sent as they are, with PUT as the method): libcurl then hashes them
      // into the signature, the same hash as x-amz-content-sha256.
      curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
  }
  std::array<char, CURL_ERROR_SIZE> error{};
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, error.data());

  const CURLcode code = curl_easy_perform(easy);
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, nullptr);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, nullptr);
  if (code != CURLE_OK) {
    response.transport_error = std::string{curl_easy_strerror(code)};
    if (error[0] != '\0') response.transport_error += ": " + std::string{error.data()};
    return response;
  }
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &response.status);
  if (response.status / 100 != 2) response.error_code = Between(response.body, "<Code>", "</Code>");
  return response;
}

}  // namespace outbox::claim_check
