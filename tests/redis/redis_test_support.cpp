#include "redis_test_support.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <thread>

#include "support/free_port.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

constexpr const char* kRedisServer = "/usr/bin/redis-server";
constexpr std::size_t kPage = 1000;

std::string Text(const redisReply& reply) { return {reply.str, reply.len}; }

}  // namespace

std::string RedisUrl() {
  const char* url = std::getenv("OUTBOX_TEST_REDIS_URL");
  return url != nullptr && url[0] != '\0' ? url : "redis://127.0.0.1:6379";
}

std::pair<std::string, int> RedisAddress() {
  const redis::Endpoint endpoint = redis::ParseUrl(RedisUrl());
  return {endpoint.host, endpoint.port};
}

std::string UniqueKey(const std::string& stem) {
  static std::atomic<int> counter{0};
  static const unsigned run = std::random_device{}() % 100000;
  return "outbox-test:" + std::to_string(getpid()) + "-" + std::to_string(run) + ":" +
         std::to_string(++counter) + ":" + stem;
}

Deadline In(milliseconds duration) { return std::chrono::steady_clock::now() + duration; }

Envelope MakeEnvelope(const std::string& topic, std::string payload) {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .created_at = std::chrono::system_clock::now()};
}

std::vector<Envelope> MakeEnvelopes(const std::string& topic, std::size_t count) {
  std::vector<Envelope> batch;
  batch.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    batch.push_back(MakeEnvelope(topic, R"({"n":)" + std::to_string(i) + "}"));
  }
  return batch;
}

std::optional<std::string> StreamEntry::Field(const std::string& name) const {
  for (const auto& [key, value] : fields) {
    if (key == name) return value;
  }
  return std::nullopt;
}

RedisClient::RedisClient(const std::string& host, int port, const std::string& user,
                         const std::string& password) {
  context_.reset(redisConnectWithTimeout(host.c_str(), port, timeval{.tv_sec = 5, .tv_usec = 0}));
  if (!context_ || context_->err != 0) {
    throw std::runtime_error("redis test client: cannot connect to " + host + ":" +
                             std::to_string(port) + ": " +
                             (context_ ? context_->errstr : "out of memory"));
  }
  redisSetTimeout(context_.get(), timeval{.tv_sec = 30, .tv_usec = 0});
  if (!password.empty()) {
    if (user.empty()) {
      Ok({"AUTH", password});
    } else {
      Ok({"AUTH", user, password});
    }
  }
}

void RedisClient::Send(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  if (redisAppendCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(),
                             lengths.data()) != REDIS_OK) {
    throw std::runtime_error(std::string{"redis test client: "} + context_->errstr);
  }
  int done = 0;
  while (done == 0) {
    if (redisBufferWrite(context_.get(), &done) != REDIS_OK) {
      throw std::runtime_error(std::string{"redis test client: "} + context_->errstr);
    }
  }
}

redis::ReplyPtr RedisClient::Command(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  redis::ReplyPtr reply{static_cast<redisReply*>(redisCommandArgv(
      context_.get(), static_cast<int>(argv.size()), argv.data(), lengths.data()))};
  if (!reply) {
    throw std::runtime_error("redis test client: " + args.front() + ": " + context_->errstr);
  }
  return reply;
}

redis::ReplyPtr RedisClient::Ok(const std::vector<std::string>& args) {
  redis::ReplyPtr reply = Command(args);
  if (reply->type == REDIS_REPLY_ERROR) {
    throw std::runtime_error("redis test client: " + args.front() + ": " + Text(*reply));
  }
  return reply;
}

std::vector<StreamEntry> RedisClient::ReadStream(const std::string& key) {
  std::vector<StreamEntry> entries;
  std::string from = "-";
  for (;;) {
    const redis::ReplyPtr reply = Ok({"XRANGE", key, from, "+", "COUNT", std::to_string(kPage)});
    if (reply->type != REDIS_REPLY_ARRAY) throw std::runtime_error("XRANGE: not an array");
    for (std::size_t i = 0; i < reply->elements; ++i) {
      const redisReply& entry = *reply->element[i];
      if (entry.type != REDIS_REPLY_ARRAY || entry.elements != 2) {
        throw std::runtime_error("XRANGE: an entry that is not [id, fields]");
      }
      StreamEntry out{.entry_id = Text(*entry.element[0])};
      const redisReply& fields = *entry.element[1];
      if (fields.type != REDIS_REPLY_ARRAY || fields.elements % 2 != 0) {
        throw std::runtime_error("XRANGE: fields are not name/value pairs");
      }
      for (std::size_t f = 0; f + 1 < fields.elements; f += 2) {
        out.fields.emplace_back(Text(*fields.element[f]), Text(*fields.element[f + 1]));
      }
      entries.push_back(std::move(out));
    }
    if (reply->elements < kPage) return entries;
    from = "(" + entries.back().entry_id;  // exclusive: after the last one read
  }
}

std::int64_t RedisClient::Length(const std::string& key) { return Ok({"XLEN", key})->integer; }

std::optional<std::string> RedisClient::Get(const std::string& key) {
  const redis::ReplyPtr reply = Ok({"GET", key});
  if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
  return Text(*reply);
}

bool RedisClient::Exists(const std::string& key) { return Ok({"EXISTS", key})->integer == 1; }

void RedisClient::Delete(const std::string& key) { Ok({"UNLINK", key}); }

void RedisClient::DeletePrefix(const std::string& prefix) {
  std::string cursor = "0";
  do {
    const redis::ReplyPtr reply = Ok({"SCAN", cursor, "MATCH", prefix + "*", "COUNT", "1000"});
    cursor = Text(*reply->element[0]);
    std::vector<std::string> unlink = {"UNLINK"};
    const redisReply& keys = *reply->element[1];
    for (std::size_t i = 0; i < keys.elements; ++i) unlink.push_back(Text(*keys.element[i]));
    if (unlink.size() > 1) Ok(unlink);
  } while (cursor != "0");
}

RedisServer::RedisServer(std::vector<std::string> extra)
    : extra_(std::move(extra)), port_(FreePort()) {
  std::string pattern = (std::filesystem::temp_directory_path() / "outbox-redis-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  try {
    Start();
  } catch (...) {
    process_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);  // no destructor runs for a failed constructor
    throw;
  }
}

RedisServer::~RedisServer() {
  process_.reset();  // SIGKILL if still running
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void RedisServer::Start() {
  std::vector<std::string> argv = {kRedisServer,  "--port",       std::to_string(port_),
                                   "--bind",      "127.0.0.1",    "--dir",
                                   dir_,          "--save",       "",
                                   "--daemonize", "no",           "--protected-mode",
                                   "no",          "--unixsocket", dir_ + "/redis.sock"};
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  process_ = std::make_unique<ChildProcess>(argv, dir_ + "/redis.log");
  // Ready when it answers PING (not LOADING): bounded.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{20};
  std::string last;
  while (std::chrono::steady_clock::now() < until) {
    if (process_->Wait(std::chrono::seconds{0}) != -1) {
      process_.reset();
      throw std::runtime_error("redis-server exited at start: " + log_tail());
    }
    try {
      RedisClient client("127.0.0.1", port_);
      const redis::ReplyPtr reply = client.Command({"PING"});
      // Answering: PONG, or NOAUTH when it wants a password; not while LOADING.
      if (reply->type == REDIS_REPLY_STATUS ||
          (reply->type == REDIS_REPLY_ERROR && !Text(*reply).starts_with("LOADING"))) {
        return;
      }
      last = Text(*reply);
    } catch (const std::runtime_error& error) {
      last = error.what();
    }
    std::this_thread::sleep_for(milliseconds{20});
  }
  throw std::runtime_error("redis-server on port " + std::to_string(port_) +
                           " not ready in 20 s: " + last + "\n" + log_tail());
}

void RedisServer::Stop() {
  if (!process_) return;
  const int status = process_->Stop(SIGTERM, std::chrono::seconds{30});
  process_.reset();
  if (status != 0) throw std::runtime_error("redis-server did not stop cleanly: " + log_tail());
}

void RedisServer::Kill() {
  if (!process_) return;
  process_->Stop(SIGKILL, std::chrono::seconds{10});
  process_.reset();
}

std::string RedisServer::log_tail() const {
  std::ifstream in(dir_ + "/redis.log");
  const std::string log{std::istreambuf_iterator<char>(in), {}};
  return log.size() > 3000 ? "..." + log.substr(log.size() - 3000) : log;
}

}  // namespace outbox::testing
