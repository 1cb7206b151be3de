#pragma once
// What the HTTP sink's tests share: webhook_receiver.py (a Standard Webhooks endpoint written with
// Python's standard library, its signature check independent of the sink's code) run as a child
// process of the test's own, its control API (destinations with scripted answers, the record of
// every request), and plain libcurl easy requests that are not the sink's code.
//
// Every wait is bounded; a receiver is killed by its destructor (and by the kernel if the thread
// that started it dies first: support/child_process.h).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/child_process.h"

namespace outbox::testing {

// A request as the receiver recorded it (webhook_receiver.py, GET .../requests).
struct ReceivedRequest {
  std::int64_t seq = 0;          // the receiver's global arrival counter
  double t = 0;                  // its monotonic clock when the request arrived (seconds)
  double answered_t = 0;         // ... when its answer was decided (after any delay)
  std::optional<double> sent_t;  // ... when the answer was written (unset: none was, or not yet)
  std::string method;
  std::string path;                      // as sent: percent-encoded, with the query
  std::optional<std::string> id;         // webhook-id
  std::optional<std::string> timestamp;  // webhook-timestamp
  std::optional<bool> signature_ok;      // unset when the receiver checks no signatures
  std::optional<int> status;             // unset: the connection was reset
  std::optional<std::string> retry_after;
  std::map<std::string, std::string> headers;  // lower-case names
  std::vector<std::string> header_names;       // lower-case, in the order they came
  std::optional<std::string> content_type;
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;
  std::string payload;  // the body's bytes

  [[nodiscard]] bool ok() const { return status && *status >= 200 && *status < 300; }
  [[nodiscard]] std::optional<std::string> Header(const std::string& name) const {
    const auto found = headers.find(name);
    if (found == headers.end()) return std::nullopt;
    return found->second;
  }
};

// What a TLS client trusts and shows (PEM files): `ca_file` the CAs to trust (empty: the
// system's), `cert_file` and `key_file` a client certificate and its key (empty: none).
struct TlsClient {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// TLS for a WebhookReceiver (webhook_receiver.py --tls-cert, --tls-key, --tls-client-ca).
struct ReceiverTls {
  // The receiver's certificate and its key (PEM): both set, it serves HTTPS only; both empty,
  // plain HTTP (the rest is then ignored).
  std::string cert_file;
  std::string key_file;
  // Set: every connection must show a client certificate signed by a CA of this PEM file.
  std::string client_ca_file;
  // What the receiver's own control requests (CreateDestination, Requests, ...) use: the CA that
  // signed cert_file and, with client_ca_file, a client certificate that it accepts.
  TlsClient control;
};

// webhook_receiver.py on a loopback address, a port of its own (or `port`), checking signatures
// with `secrets` (none: checks nothing), with `destinations` (name, behaviour JSON as
// CreateDestination takes) created before it listens (a receiver started again on the port of
// one that was stopped answers its first request as that one did, not 404), serving HTTPS with
// `tls` when that has a certificate. Started by the constructor (throws when it is not listening
// within 10 s); SIGTERM, then SIGKILL, by Stop() and the destructor.
class WebhookReceiver {
 public:
  explicit WebhookReceiver(
      std::vector<std::string> secrets = {}, std::string host = "127.0.0.1", int port = 0,
      const std::vector<std::pair<std::string, std::string>>& destinations = {},
      ReceiverTls tls = {});
  ~WebhookReceiver();
  WebhookReceiver(const WebhookReceiver&) = delete;
  WebhookReceiver& operator=(const WebhookReceiver&) = delete;

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] const std::string& host() const { return host_; }
  // http://<host>:<port>, or https://... when it serves TLS.
  [[nodiscard]] std::string BaseUrl() const;
  [[nodiscard]] bool tls() const { return !tls_.cert_file.empty(); }

  // Creates or replaces destination `name` (any bytes; percent-encoded in the control URL) with
  // `behaviour` (the JSON of webhook_receiver.py's PUT /_control/dest/<name>). Throws when the
  // receiver refuses.
  void CreateDestination(const std::string& name, const std::string& behaviour = "{}");
  // Removes it: later requests to it are answered 404. Never throws.
  void RemoveDestination(const std::string& name) noexcept;
  // Every request to `name` so far, in the order their answers were decided.
  std::vector<ReceivedRequest> Requests(const std::string& name);
  // Waits (polling, at most `limit`) until `name` has at least `count` requests (all of them when
  // `answered_2xx` is false, else only those answered 2xx); the requests then (all of them).
  std::vector<ReceivedRequest> WaitForRequests(const std::string& name, std::size_t count,
                                               std::chrono::milliseconds limit,
                                               bool answered_2xx = false);

  // Every TLS handshake that failed so far (no or an untrusted client certificate, a client that
  // does not trust the receiver, plain HTTP sent to its TLS port): Python's ssl error text of
  // each, in order. Empty without TLS.
  std::vector<std::string> TlsFailures();

  // SIGTERM, waits 10 s, then SIGKILL. Idempotent.
  void Stop();
  // What the receiver wrote to stdout and stderr.
  [[nodiscard]] std::string Log() const;

 private:
  std::string host_;
  std::string dir_;
  int port_ = 0;
  ReceiverTls tls_;
  std::unique_ptr<ChildProcess> process_;
};

// A throwaway PKI for the TLS tests, made with the openssl command-line tool (Debian's openssl
// package; no network, each command bounded to 10 s) in a temporary directory that the
// destructor removes; P-256 keys, certificates valid for two days. Throws when openssl is not on
// PATH or fails.
//   CaFile()          a test CA (self-signed)
//   ServerCert/Key    a server certificate for 127.0.0.1 (subjectAltName IP:127.0.0.1), by it
//   ClientCert/Key    a client certificate (extendedKeyUsage clientAuth), by it
//   OtherCaFile()     a second CA, unrelated to the first
//   OtherClientCert/Key  a client certificate signed by the second CA
class TestCertificates {
 public:
  TestCertificates();
  ~TestCertificates();
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;

  [[nodiscard]] std::string CaFile() const { return dir_ + "/ca.pem"; }
  [[nodiscard]] std::string ServerCert() const { return dir_ + "/server.pem"; }
  [[nodiscard]] std::string ServerKey() const { return dir_ + "/server.key"; }
  [[nodiscard]] std::string ClientCert() const { return dir_ + "/client.pem"; }
  [[nodiscard]] std::string ClientKey() const { return dir_ + "/client.key"; }
  [[nodiscard]] std::string OtherCaFile() const { return dir_ + "/other-ca.pem"; }
  [[nodiscard]] std::string OtherClientCert() const { return dir_ + "/other-client.pem"; }
  [[nodiscard]] std::string OtherClientKey() const { return dir_ + "/other-client.key"; }

 private:
  // Runs openssl with `args` (bounded); throws with its output when it fails.
  void OpenSsl(const std::vector<std::string>& args) const;

  std::string openssl_;
  std::string dir_;
};

// One TestCertificates for the whole test binary, made at the first call.
const TestCertificates& SharedCertificates();

// One receiver for the whole test binary, started at the first call, checking SharedSecret().
WebhookReceiver& SharedReceiver();
// The secret SharedReceiver() checks (a NewSecret()).
const std::string& SharedSecret();

// A Standard Webhooks secret: "whsec_" + base64 of 32 random bytes.
std::string NewSecret();
// `prefix` and a random suffix, of unreserved URL characters only (A-Z a-z 0-9 - . _ ~): a
// destination name that a {topic} placeholder carries unchanged.
std::string UniqueDestination(std::string_view prefix);
// Every byte but A-Z a-z 0-9 - . _ ~ as %XX (upper-case hex).
std::string PercentEncode(std::string_view text);
std::string Base64Encode(std::string_view bytes);
std::string Base64Decode(std::string_view text);

// A plain libcurl easy request, not the sink's code (https: with `tls`): the status, body and
// headers (lower-case names) of the answer. Throws std::runtime_error when there is no answer
// within `timeout`.
struct HttpAnswer {
  long status = 0;  // NOLINT(google-runtime-int): libcurl's type
  std::string body;
  std::map<std::string, std::string> headers;
};
HttpAnswer HttpRequest(const std::string& method, const std::string& url,
                       const std::string& body = "",
                       const std::vector<std::pair<std::string, std::string>>& headers = {},
                       std::chrono::milliseconds timeout = std::chrono::seconds{10},
                       const TlsClient& tls = {});

}  // namespace outbox::testing
