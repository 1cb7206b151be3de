#pragma once
// The claim check (issue #43): a payload over a threshold is stored in S3-compatible object
// storage by the relay before it is published, and the message carries a reference instead.
//
// Relay side: WrapSink puts a claim-check step in front of any sink. For each message of a batch
// whose payload is over `threshold` bytes it PUTs the payload to `<prefix><message id>` (so a
// message published again writes the same object: idempotent), then hands the inner sink a copy
// whose payload is a small JSON reference (content type kReferenceContentType) and whose headers
// carry the reference too (kUrlHeader, kSizeHeader, kSha256Header, kContentTypeHeader, and
// kDataRefHeader: CloudEvents' claim-check extension `dataref`, which a CloudEvents envelope
// carries as an attribute). Messages at or under the threshold go through untouched. An upload
// that fails is that message's kUnavailable outcome (retried, no attempt spent, never lost); the
// later messages of its stream in the batch are held back with it (stream order), and after a
// transport failure no further upload is tried in that batch.
//
// Consumer side: FetchClaimCheck reads the reference from a delivery's headers, GETs the object
// and checks its size and SHA-256.
//
// Requests are signed with AWS Signature Version 4 by libcurl (CURLOPT_AWS_SIGV4); TLS peers are
// verified. The secret never appears in a log line, an outcome's reason or --check-config.
//
// Threading: a wrapped sink is called like any sink (one Publish at a time); FetchClaimCheck is
// safe to call from several threads (each call has its own connection).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/core/log.h"
#include "outbox/core/message.h"
#include "outbox/sink/sink.h"

namespace outbox::claim_check {

// The headers a claim-checked message carries (not outbox-* names: those are the outbox's own
// metadata, which `envelope = "external"` leaves out; these are carried by every envelope).
inline constexpr std::string_view kUrlHeader = "claim-check-url";        // the object's URL
inline constexpr std::string_view kSizeHeader = "claim-check-size";      // the payload's bytes
inline constexpr std::string_view kSha256Header = "claim-check-sha256";  // lower-case hex
inline constexpr std::string_view kContentTypeHeader = "claim-check-content-type";  // original
// CloudEvents' "Claim Check" extension attribute (the object's URL).
inline constexpr std::string_view kDataRefHeader = "dataref";
// The content type of a claim-checked message's payload: {"claim_check": {"url": ...,
// "size": ..., "sha256": ..., "content_type": ...}}.
inline constexpr std::string_view kReferenceContentType = "application/vnd.outbox.claim-check+json";

enum class UrlStyle : std::uint8_t {
  kPath,         // <endpoint>/<bucket>/<key> (MinIO, s3rver, most S3-compatible servers)
  kVirtualHost,  // <scheme>://<bucket>.<endpoint host>/<key> (AWS S3's default)
};

// Where the objects live and how to reach them.
struct StoreOptions {
  std::string endpoint;  // "https://s3.eu-west-1.amazonaws.com", "http://127.0.0.1:9000": no path
  std::string bucket;    // 3 to 63 characters: a-z, 0-9, '.', '-'
  std::string region = "us-east-1";  // part of the signature
  UrlStyle url_style = UrlStyle::kPath;
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials only: sent as x-amz-security-token
  std::string ca_file;        // PEM CA certificates to trust; empty: the system's
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{60000};  // one PUT or GET, at most
};

struct Options {
  StoreOptions store;
  std::size_t threshold = 256 * 1024;  // payloads of more bytes are claim-checked
  std::string prefix = "outbox/";      // object key = prefix + message id; a-z A-Z 0-9 / _ . -
  // When set, the wrapped sink deletes the objects under `prefix` last written more than this
  // long ago, from a thread of its own, every retention / 4 (at least 1 s, at most 1 h). 0: it
  // deletes nothing (a bucket lifecycle rule does; docs/claim-check.md).
  std::chrono::milliseconds retention{0};
};

// Throws ConfigError naming the key ("endpoint", "bucket", "region", "prefix", "threshold",
// "retention", "access_key_id", "secret_access_key") for an option that cannot work.
void ValidateOptions(const Options& options);

// The object key of a message: prefix + its id (the same for every attempt at it).
std::string ObjectKey(const Options& options, const MessageId& id);
// The object's URL in the configured style.
std::string ObjectUrl(const StoreOptions& store, std::string_view key);

// `inner` with the claim-check step in front. Throws ConfigError when the options are invalid.
// Test-only: with the environment variable OUTBOX_TEST_CLAIM_CHECK_KILL_AFTER_UPLOAD=1 the
// process kills itself (SIGKILL) after a batch's uploads and before it is published, for the
// crash test of docs/claim-check.md; never set it in production.
std::unique_ptr<Sink> WrapSink(std::unique_ptr<Sink> inner, Options options, LogFn log = nullptr);

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

// The reference a claim-checked message carries.
struct Reference {
  std::string url;
  std::uint64_t size = 0;
  std::string sha256;
  std::string content_type;
};

enum class FetchError : std::uint8_t {
  kNone,
  kNotClaimChecked,  // no claim-check-url header: the payload is in the message
  kMalformed,        // a claim-check header is missing or unreadable, or the URL is not the store's
  kMissing,          // the store has no such object (404): deleted, expired, wrong bucket
  kDenied,           // 401/403: credentials or permissions
  kUnavailable,      // the store could not be reached, or answered 5xx: try again later
  kSizeMismatch,     // the object's size differs from claim-check-size
  kDigestMismatch,   // its SHA-256 differs from claim-check-sha256
};

struct FetchResult {
  FetchError error = FetchError::kNone;
  std::string message;  // why, when error is set (names the URL, never the secret)
  std::string payload;  // the original payload, when ok()
  std::string content_type;
  [[nodiscard]] bool ok() const { return error == FetchError::kNone; }
};

// The reference in `headers`, or why there is none (kNotClaimChecked, kMalformed).
std::optional<Reference> ReferenceFromHeaders(const Headers& headers, FetchResult* why = nullptr);

// Fetches the payload a delivery's headers refer to from `store` (signed with its credentials)
// and verifies its size and SHA-256. The URL must be an object of `store`'s bucket (a message
// cannot send the consumer's credentials elsewhere).
FetchResult FetchClaimCheck(const Headers& headers, const StoreOptions& store);
FetchResult FetchClaimCheck(const Reference& reference, const StoreOptions& store);

}  // namespace outbox::claim_check
