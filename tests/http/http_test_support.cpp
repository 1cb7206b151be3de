#include "http_test_support.h"

#include <curl/curl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

constexpr std::string_view kBase64Alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

struct CurlDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using CurlPtr = std::unique_ptr<CURL, CurlDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;

void CurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::size_t AppendBody(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

std::size_t AppendHeader(char* data, std::size_t size, std::size_t count, void* out) {
  const std::string_view line{data, size * count};
  const auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name{line.substr(0, colon)};
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
      value.remove_prefix(1);
    }
    while (!value.empty() &&
           (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
      value.remove_suffix(1);
    }
    (*static_cast<std::map<std::string, std::string>*>(out))[name] = std::string{value};
  }
  return size * count;
}

// Whether process `pid` (a child not waited for yet) has exited: a zombie.
bool Exited(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat{std::istreambuf_iterator<char>(in), {}};
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || (paren + 2 < stat.size() && stat[paren + 2] == 'Z');
}

// `program` as PATH finds it (ChildProcess runs an absolute path); "" when it is not there.
std::string OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    std::string candidate = dir;
    candidate += '/';
    candidate += program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

std::string Python() {
  std::string python = OnPath("python3");
  if (python.empty()) {
    throw std::runtime_error("python3 is not on PATH (the HTTP tests run webhook_receiver.py)");
  }
  return python;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A new directory under the system's temporary one, named `prefix` + a random suffix.
std::string MakeTempDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

using Json = nlohmann::ordered_json;  // keeps the order of the headers

std::optional<std::string> OptionalString(const Json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<std::string>();
}

ReceivedRequest Parse(const Json& record) {
  ReceivedRequest request;
  request.seq = record.at("seq").get<std::int64_t>();
  request.t = record.at("t").get<double>();
  if (!record.at("answered_t").is_null())
    request.answered_t = record.at("answered_t").get<double>();
  if (record.contains("sent_t") && !record.at("sent_t").is_null()) {
    request.sent_t = record.at("sent_t").get<double>();
  }
  request.method = record.at("method").get<std::string>();
  request.path = record.at("path").get<std::string>();
  request.id = OptionalString(record.at("id"));
  request.timestamp = OptionalString(record.at("timestamp"));
  if (!record.at("signature_ok").is_null()) {
    request.signature_ok = record.at("signature_ok").get<bool>();
  }
  if (!record.at("status").is_null()) request.status = record.at("status").get<int>();
  request.retry_after = OptionalString(record.at("retry_after"));
  for (const auto& [name, value] : record.at("headers").items()) {
    request.headers[name] = value.get<std::string>();
    request.header_names.push_back(name);
  }
  request.content_type = OptionalString(record.at("content_type"));
  request.stream_key = OptionalString(record.at("stream_key"));
  if (!record.at("stream_seq").is_null()) {
    request.stream_seq = record.at("stream_seq").get<std::int64_t>();
  }
  request.payload = Base64Decode(record.at("payload_b64").get<std::string>());
  return request;
}

}  // namespace

WebhookReceiver::WebhookReceiver(
    std::vector<std::string> secrets, std::string host, int port,
    const std::vector<std::pair<std::string, std::string>>& destinations, ReceiverTls tls)
    : host_(std::move(host)), tls_(std::move(tls)) {
  if (tls_.cert_file.empty() != tls_.key_file.empty()) {
    throw std::invalid_argument("WebhookReceiver: a TLS certificate and its key go together");
  }
  dir_ = MakeTempDir("outbox-webhook-");
  const std::string port_file = dir_ + "/port";
  std::vector<std::string> argv{Python(), WEBHOOK_RECEIVER_PY,  "--port-file", port_file,
                                "--port", std::to_string(port), "--host",      host_};
  for (const std::string& secret : secrets) {
    argv.emplace_back("--secret");
    argv.push_back(secret);
  }
  for (const auto& [name, behaviour] : destinations) {
    argv.emplace_back("--dest");
    argv.push_back(name);
    argv.push_back(behaviour);
  }
  if (this->tls()) {
    argv.insert(argv.end(), {"--tls-cert", tls_.cert_file, "--tls-key", tls_.key_file});
    if (!tls_.client_ca_file.empty()) {
      argv.insert(argv.end(), {"--tls-client-ca", tls_.client_ca_file});
    }
  }
  process_ = std::make_unique<ChildProcess>(argv, dir_ + "/receiver.log");
  const auto until = SteadyClock::now() + std::chrono::seconds{10};
  for (;;) {
    std::ifstream in(port_file);
    if (in >> port_ && port_ > 0) break;
    port_ = 0;
    if (Exited(process_->pid()) || SteadyClock::now() > until) {
      const std::string log = Log();
      process_.reset();
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
      throw std::runtime_error("webhook_receiver.py did not start listening within 10 s:\n" + log);
    }
    std::this_thread::sleep_for(milliseconds{20});
  }
}

WebhookReceiver::~WebhookReceiver() {
  Stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string WebhookReceiver::BaseUrl() const {
  return (tls() ? "https://" : "http://") + host_ + ":" + std::to_string(port_);
}

void WebhookReceiver::CreateDestination(const std::string& name, const std::string& behaviour) {
  const HttpAnswer answer =
      HttpRequest("PUT", BaseUrl() + "/_control/dest/" + PercentEncode(name), behaviour,
                  {{"Content-Type", "application/json"}}, std::chrono::seconds{10}, tls_.control);
  if (answer.status != 200) {
    throw std::runtime_error("the receiver refused destination " + name + ": " +
                             std::to_string(answer.status) + " " + answer.body);
  }
}

void WebhookReceiver::RemoveDestination(const std::string& name) noexcept {
  try {
    HttpRequest("DELETE", BaseUrl() + "/_control/dest/" + PercentEncode(name), "", {},
                std::chrono::seconds{10}, tls_.control);
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): a receiver that is gone
  }
}

std::vector<ReceivedRequest> WebhookReceiver::Requests(const std::string& name) {
  const HttpAnswer answer =
      HttpRequest("GET", BaseUrl() + "/_control/dest/" + PercentEncode(name) + "/requests", "", {},
                  std::chrono::seconds{10}, tls_.control);
  if (answer.status != 200) {
    throw std::runtime_error("the receiver's requests of " + name + ": " +
                             std::to_string(answer.status) + " " + answer.body);
  }
  std::vector<ReceivedRequest> requests;
  for (const Json& record : Json::parse(answer.body)) {
    requests.push_back(Parse(record));
  }
  return requests;
}

std::vector<ReceivedRequest> WebhookReceiver::WaitForRequests(const std::string& name,
                                                              std::size_t count, milliseconds limit,
                                                              bool answered_2xx) {
  const auto until = SteadyClock::now() + limit;
  for (;;) {
    auto requests = Requests(name);
    std::size_t counted = requests.size();
    if (answered_2xx) {
      counted = 0;
      for (const ReceivedRequest& request : requests) counted += request.ok() ? 1U : 0U;
    }
    if (counted >= count || SteadyClock::now() >= until) return requests;
    std::this_thread::sleep_for(milliseconds{20});
  }
}

std::vector<std::string> WebhookReceiver::TlsFailures() {
  const HttpAnswer answer = HttpRequest("GET", BaseUrl() + "/_control/tls_failures", "", {},
                                        std::chrono::seconds{10}, tls_.control);
  if (answer.status != 200) {
    throw std::runtime_error("the receiver's TLS failures: " + std::to_string(answer.status) + " " +
                             answer.body);
  }
  std::vector<std::string> failures;
  for (const Json& failure : Json::parse(answer.body)) {
    failures.push_back(failure.at("error").get<std::string>());
  }
  return failures;
}

void WebhookReceiver::Stop() {
  if (!process_) return;
  if (process_->Stop(SIGTERM, std::chrono::seconds{10}) < 0) process_.reset();  // SIGKILL
  process_.reset();
}

std::string WebhookReceiver::Log() const { return ReadFile(dir_ + "/receiver.log"); }

TestCertificates::TestCertificates() : openssl_(OnPath("openssl")) {
  if (openssl_.empty()) {
    throw std::runtime_error(
        "openssl is not on PATH (the HTTP sink's TLS tests make their certificates with it: "
        "Debian's openssl package, in scripts/install-deps)");
  }
  dir_ = MakeTempDir("outbox-tls-");
  try {
    const std::string p256 = "ec_paramgen_curve:P-256";
    // The CAs: self-signed, for signing certificates only.
    for (const std::string_view name : {"ca", "other-ca"}) {
      const std::string base = dir_ + "/" + std::string{name};
      OpenSsl({"req", "-x509", "-newkey", "ec", "-pkeyopt", p256, "-nodes", "-keyout",
               base + ".key", "-out", base + ".pem", "-days", "2", "-subj",
               "/CN=outbox test " + std::string{name}, "-addext",
               "basicConstraints=critical,CA:TRUE", "-addext",
               "keyUsage=critical,keyCertSign,cRLSign"});
    }
    // The leaf certificates: a key and a request, signed by their CA with these extensions.
    struct Leaf {
      std::string name;
      std::string ca;
      std::string subject;
      std::string extensions;
    };
    const std::string leaf =
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n";
    const std::vector<Leaf> leaves{
        {"server", "ca", "/CN=127.0.0.1",
         leaf + "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"},
        {"client", "ca", "/CN=outbox test client", leaf + "extendedKeyUsage=clientAuth\n"},
        {"other-client", "other-ca", "/CN=outbox test other client",
         leaf + "extendedKeyUsage=clientAuth\n"},
    };
    int serial = 1;
    for (const Leaf& cert : leaves) {
      const std::string base = dir_ + "/" + cert.name;
      {
        std::ofstream out(base + ".ext");
        out << cert.extensions;
        if (!out) throw std::runtime_error("cannot write " + base + ".ext");
      }
      OpenSsl({"req", "-new", "-newkey", "ec", "-pkeyopt", p256, "-nodes", "-keyout", base + ".key",
               "-out", base + ".csr", "-subj", cert.subject});
      OpenSsl({"x509", "-req", "-in", base + ".csr", "-CA", dir_ + "/" + cert.ca + ".pem", "-CAkey",
               dir_ + "/" + cert.ca + ".key", "-set_serial", std::to_string(++serial), "-days", "2",
               "-extfile", base + ".ext", "-out", base + ".pem"});
    }
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    throw;
  }
}

TestCertificates::~TestCertificates() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void TestCertificates::OpenSsl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv{openssl_};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = dir_ + "/openssl.log";
  std::error_code ignored;
  std::filesystem::remove(log, ignored);
  ChildProcess openssl(argv, log);
  const int code = openssl.Wait(std::chrono::seconds{10});  // -1: still running (then killed)
  if (code != 0) {
    std::string command = "openssl";
    for (const std::string& arg : args) command += " " + arg;
    throw std::runtime_error(
        command +
        (code < 0 ? ": not done within 10 s" : ": failed (" + std::to_string(code) + ")") + ":\n" +
        ReadFile(log));
  }
}

const TestCertificates& SharedCertificates() {
  static const TestCertificates certificates;
  return certificates;
}

const std::string& SharedSecret() {
  static const std::string secret = NewSecret();
  return secret;
}

WebhookReceiver& SharedReceiver() {
  static WebhookReceiver receiver{{SharedSecret()}};
  return receiver;
}

std::string NewSecret() {
  std::random_device device;
  std::string bytes(32, '\0');
  for (char& byte : bytes) byte = static_cast<char>(device() & 0xFFU);
  return "whsec_" + Base64Encode(bytes);
}

std::string UniqueDestination(std::string_view prefix) {
  std::random_device device;
  return std::string{prefix} + "-" + std::to_string(device()) + "-" + std::to_string(getpid());
}

std::string PercentEncode(std::string_view text) {
  constexpr std::string_view kHex = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
        (byte >= '0' && byte <= '9') || byte == '-' || byte == '.' || byte == '_' || byte == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4U]);
      out.push_back(kHex[byte & 0x0FU]);
    }
  }
  return out;
}

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const std::uint32_t group =
        (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16U) |
        (static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8U) |
        static_cast<unsigned char>(bytes[i + 2]);
    out.push_back(kBase64Alphabet[(group >> 18U) & 63U]);
    out.push_back(kBase64Alphabet[(group >> 12U) & 63U]);
    out.push_back(kBase64Alphabet[(group >> 6U) & 63U]);
    out.push_back(kBase64Alphabet[group & 63U]);
  }
  if (i < bytes.size()) {
    std::uint32_t group = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16U;
    if (i + 1 < bytes.size()) {
      group |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8U;
    }
    out.push_back(kBase64Alphabet[(group >> 18U) & 63U]);
    out.push_back(kBase64Alphabet[(group >> 12U) & 63U]);
    out.push_back(i + 1 < bytes.size() ? kBase64Alphabet[(group >> 6U) & 63U] : '=');
    out.push_back('=');
  }
  return out;
}

std::string Base64Decode(std::string_view text) {
  std::string out;
  std::uint32_t group = 0;
  int bits = 0;
  for (const char c : text) {
    if (c == '=') break;
    const auto value = kBase64Alphabet.find(c);
    if (value == std::string_view::npos) throw std::runtime_error("not base64");
    group = (group << 6U) | static_cast<std::uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((group >> static_cast<unsigned>(bits)) & 0xFFU));
    }
  }
  return out;
}

HttpAnswer HttpRequest(const std::string& method, const std::string& url, const std::string& body,
                       const std::vector<std::pair<std::string, std::string>>& headers,
                       milliseconds timeout, const TlsClient& tls) {
  CurlGlobalInit();
  const CurlPtr curl{curl_easy_init()};
  if (!curl) throw std::runtime_error("curl_easy_init failed");
  CURL* handle = curl.get();
  HttpAnswer answer;
  curl_slist* list = nullptr;
  for (const auto& [name, value] : headers) {
    list = curl_slist_append(list, (name + ": " + value).c_str());
  }
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip
  const SlistPtr header_list{list};
  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method == "GET") {
    curl_easy_setopt(handle, CURLOPT_HTTPGET, 1L);
  } else if (method != "DELETE" || !body.empty()) {
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, header_list.get());
  curl_easy_setopt(handle, CURLOPT_PROXY, "");       // never the environment's http_proxy
  curl_easy_setopt(handle, CURLOPT_PATH_AS_IS, 1L);  // a destination named ".." stays one
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));  // NOLINT
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(timeout.count()));  // NOLINT
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &answer.body);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, AppendHeader);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &answer.headers);
  if (!tls.ca_file.empty()) curl_easy_setopt(handle, CURLOPT_CAINFO, tls.ca_file.c_str());
  if (!tls.cert_file.empty()) {
    curl_easy_setopt(handle, CURLOPT_SSLCERT, tls.cert_file.c_str());
    curl_easy_setopt(handle, CURLOPT_SSLKEY, tls.key_file.c_str());
  }
  const CURLcode code = curl_easy_perform(handle);
  if (code != CURLE_OK) {
    throw std::runtime_error(method + " " + url + ": " + curl_easy_strerror(code));
  }
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &answer.status);
  return answer;
}

}  // namespace outbox::testing
