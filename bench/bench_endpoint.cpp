#include "bench_endpoint.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <time.h>

#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>
#include <ctime>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

namespace outbox::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Parser = bhttp::request_parser<bhttp::string_body>;

constexpr std::string_view kOk = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
constexpr std::string_view kOkClose =
    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
constexpr std::string_view kNotAllowed =
    "HTTP/1.1 405 Method Not Allowed\r\nAllow: POST, PUT\r\nContent-Length: 0\r\n\r\n";
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
constexpr std::string_view kSecretPrefix = "whsec_";

std::string Base64(const unsigned char* bytes, std::size_t size) {
  std::string out(4 * ((size + 2) / 3), '\0');
  const int written =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes, static_cast<int>(size));
  out.resize(static_cast<std::size_t>(written));
  return out;
}

std::string SecretKey(const std::string& secret) {
  if (!secret.starts_with(kSecretPrefix)) throw std::invalid_argument("secret: no whsec_ prefix");
  const std::string_view text = std::string_view{secret}.substr(kSecretPrefix.size());
  std::string key(3 * (text.size() / 4) + 3, '\0');
  const int decoded = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(key.data()),
                                      reinterpret_cast<const unsigned char*>(text.data()),
                                      static_cast<int>(text.size()));
  if (decoded < 0 || text.size() % 4 != 0) throw std::invalid_argument("secret: bad base64");
  std::size_t size = static_cast<std::size_t>(decoded);  // EVP_DecodeBlock counts the padding
  for (std::size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --size;
  key.resize(size);
  return key;
}

double ThreadCpuSeconds(std::thread& thread) {
  clockid_t clock{};
  timespec spent{};
  if (pthread_getcpuclockid(thread.native_handle(), &clock) != 0 ||
      clock_gettime(clock, &spent) != 0) {
    return 0;
  }
  return static_cast<double>(spent.tv_sec) + static_cast<double>(spent.tv_nsec) / 1e9;
}

}  // namespace

std::string WebhookSignature(const std::string& secret, std::string_view id, std::int64_t timestamp,
                             std::string_view body) {
  const std::string key = SecretKey(secret);
  std::string signed_content;
  signed_content.reserve(id.size() + body.size() + 24);
  signed_content.append(id).append(".").append(std::to_string(timestamp)).append(".").append(body);
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int mac_size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(signed_content.data()), signed_content.size(),
           mac.data(), &mac_size) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return "v1," + Base64(mac.data(), mac_size);
}

std::string NewWebhookSecret() {
  std::array<unsigned char, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    throw std::runtime_error("RAND_bytes failed");
  }
  return std::string{kSecretPrefix} + Base64(bytes.data(), bytes.size());
}

class BenchEndpoint::Impl {
 public:
  Impl(int threads, std::int64_t messages, std::string secret,
       std::function<void(std::string_view body)> on_body)
      : on_body_(std::move(on_body)),
        messages_(messages),
        seen_(std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(messages))),
        secret_(std::move(secret)) {
    const tcp::endpoint endpoint{asio::ip::make_address("127.0.0.1"), 0};
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen(asio::socket_base::max_listen_connections);
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  ~Impl() {
    io_.stop();
    for (auto& thread : threads_) thread.join();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] std::int64_t distinct() const { return distinct_.load(); }
  EndpointCounts counts() {
    EndpointCounts counts{.requests = requests_.load(),
                          .distinct = distinct_.load(),
                          .without_id = without_id_.load(),
                          .without_signature = without_signature_.load(),
                          .expect_continue = expect_continue_.load(),
                          .connections = connections_.load()};
    for (auto& thread : threads_) counts.cpu_seconds += ThreadCpuSeconds(thread);
    return counts;
  }
  std::string first_signature() {
    if (secret_.empty()) return "no secret";
    const std::lock_guard lock(mutex_);
    return first_signature_.empty() ? "not received yet" : first_signature_;
  }

 private:
  class Session;

  void Accept();

  // A request read to the end: counted when it is a POST or PUT.
  void Count(const bhttp::request<bhttp::string_body>& request) {
    ++requests_;
    const auto id = request.find("webhook-id");
    const auto signature = request.find("webhook-signature");
    if (id == request.end()) ++without_id_;
    if (signature == request.end()) ++without_signature_;
    const std::string& body = request.body();
    if (on_body_) on_body_(body);
    if (body.size() >= 13 && body[0] == '"') {
      std::int64_t seq = 0;
      bool digits = true;
      for (std::size_t i = 1; i < 13 && digits; ++i) {
        digits = body[i] >= '0' && body[i] <= '9';
        seq = seq * 10 + (body[i] - '0');
      }
      if (digits && seq < messages_ &&
          seen_[static_cast<std::size_t>(seq)].exchange(1, std::memory_order_relaxed) == 0) {
        ++distinct_;
      }
    }
    if (!secret_.empty() && !checked_.exchange(true)) CheckFirst(request);
  }

  // The first request's signature and timestamp, once.
  void CheckFirst(const bhttp::request<bhttp::string_body>& request) {
    std::string verdict = "ok";
    try {
      const auto id = request.find("webhook-id");
      const auto timestamp = request.find("webhook-timestamp");
      const auto signature = request.find("webhook-signature");
      if (id == request.end() || timestamp == request.end() || signature == request.end()) {
        verdict = "webhook-id, -timestamp or -signature missing";
      } else {
        const std::int64_t sent = std::stoll(std::string{timestamp->value()});
        const std::string expected =
            WebhookSignature(secret_, std::string_view{id->value().data(), id->value().size()},
                             sent, request.body());
        const std::string_view got{signature->value().data(), signature->value().size()};
        bool found = false;
        for (std::size_t at = 0; at <= got.size();) {
          const std::size_t space = got.find(' ', at);
          const std::size_t end = space == std::string_view::npos ? got.size() : space;
          found = found || got.substr(at, end - at) == expected;
          at = end + 1;
        }
        const std::int64_t skew = static_cast<std::int64_t>(std::time(nullptr)) - sent;
        if (!found) {
          verdict = "signature mismatch (got \"" + std::string{got} + "\", expected \"" + expected +
                    "\")";
        } else if (skew > 300 || skew < -300) {
          verdict = "timestamp " + std::to_string(skew) + " s off";
        }
      }
    } catch (const std::exception& error) {
      verdict = std::string{"cannot check: "} + error.what();
    }
    const std::lock_guard lock(mutex_);
    first_signature_ = verdict;
  }

  std::function<void(std::string_view body)> on_body_;
  std::int64_t messages_;
  std::unique_ptr<std::atomic<std::uint8_t>[]> seen_;
  std::string secret_;
  std::atomic<std::int64_t> requests_{0};
  std::atomic<std::int64_t> distinct_{0};
  std::atomic<std::int64_t> without_id_{0};
  std::atomic<std::int64_t> without_signature_{0};
  std::atomic<std::int64_t> expect_continue_{0};
  std::atomic<std::int64_t> connections_{0};
  std::atomic<bool> checked_{false};
  std::mutex mutex_;
  std::string first_signature_;
  int port_ = 0;
  // Declared after what sessions touch: io_'s destructor destroys the sessions it still holds.
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  tcp::acceptor acceptor_{io_};
  std::vector<std::thread> threads_;
};

// One connection: read a request (answering Expect: 100-continue), answer it, read the next.
// Its handlers run one after the other, so it needs no strand with several I/O threads.
class BenchEndpoint::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {}

  void Read() {
    parser_.emplace();
    parser_->body_limit(std::uint64_t{64} * 1024 * 1024);
    bhttp::async_read_header(socket_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code error, std::size_t) {
                               if (error) return self->Close();
                               self->OnHeader();
                             });
  }

 private:
  void OnHeader() {
    if (parser_->is_done()) return Answer();
    if (beast::iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
      ++server_.expect_continue_;
      asio::async_write(socket_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = shared_from_this()](beast::error_code error, std::size_t) {
                          if (error) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(socket_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code error, std::size_t) {
                        if (error) return self->Close();
                        self->Answer();
                      });
  }

  void Answer() {
    const auto& request = parser_->get();
    const bool keep_alive = request.keep_alive();
    std::string_view answer = kNotAllowed;
    if (request.method() == bhttp::verb::post || request.method() == bhttp::verb::put) {
      server_.Count(request);
      answer = keep_alive ? kOk : kOkClose;
    }
    asio::async_write(
        socket_, asio::buffer(answer.data(), answer.size()),
        [self = shared_from_this(), keep_alive](beast::error_code error, std::size_t) {
          if (error || !keep_alive) return self->Close();
          self->Read();
        });
  }

  void Close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  Impl& server_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
};

void BenchEndpoint::Impl::Accept() {
  acceptor_.async_accept([this](const beast::error_code& error, tcp::socket socket) {
    if (error == asio::error::operation_aborted) return;
    if (!error) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      ++connections_;
      std::make_shared<Session>(*this, std::move(socket))->Read();
    }
    Accept();
  });
}

BenchEndpoint::BenchEndpoint(int threads, std::int64_t messages, std::string secret,
                             std::function<void(std::string_view body)> on_body)
    : impl_(std::make_unique<Impl>(threads, messages, std::move(secret), std::move(on_body))) {}
BenchEndpoint::~BenchEndpoint() = default;
int BenchEndpoint::port() const { return impl_->port(); }
std::int64_t BenchEndpoint::distinct() const { return impl_->distinct(); }
EndpointCounts BenchEndpoint::counts() const { return impl_->counts(); }
std::string BenchEndpoint::first_signature() const { return impl_->first_signature(); }

}  // namespace outbox::bench
