#include "nats_test_support.h"

#include <signal.h>
#include <stdlib.h>

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
using SteadyClock = std::chrono::steady_clock;

[[noreturn]] void Throw(const std::string& what, natsStatus status) {
  throw std::runtime_error(what + ": " + nats::LastError(status));
}

// How many times `text` occurs in `haystack`.
std::size_t Occurrences(const std::string& haystack, std::string_view text) {
  std::size_t count = 0;
  for (std::size_t at = haystack.find(text); at != std::string::npos;
       at = haystack.find(text, at + text.size())) {
    ++count;
  }
  return count;
}

StoredMessage Stored(natsMsg* message) {
  StoredMessage stored;
  stored.subject = natsMsg_GetSubject(message);
  stored.payload.assign(natsMsg_GetData(message),
                        static_cast<std::size_t>(natsMsg_GetDataLength(message)));
  const char** keys = nullptr;
  int count = 0;
  if (natsMsgHeader_Keys(message, &keys, &count) == NATS_OK) {
    for (int i = 0; i < count; ++i) {
      const char* value = nullptr;
      if (natsMsgHeader_Get(message, keys[i], &value) == NATS_OK) {
        stored.headers.emplace(keys[i], value != nullptr ? value : "");
      }
    }
    free(static_cast<void*>(keys));  // NOLINT: the array libnats allocated, freed as it says
  }
  return stored;
}

}  // namespace

std::string NatsUrl() {
  const char* url = std::getenv("OUTBOX_TEST_NATS_URL");
  return url != nullptr && url[0] != '\0' ? url : "nats://127.0.0.1:4222";
}

std::string UniqueName(std::string_view prefix) {
  std::random_device device;
  return std::string{prefix} + "_" + std::to_string(device()) + "_" + std::to_string(getpid());
}

JetStreamClient::JetStreamClient(const std::string& url, const ClientTls& tls) {
  natsOptions* raw_options = nullptr;
  if (natsOptions_Create(&raw_options) != NATS_OK) Throw("natsOptions_Create", NATS_NO_MEMORY);
  const nats::OptionsPtr options{raw_options};
  natsOptions_SetURL(options.get(), url.c_str());
  if (!tls.ca_file.empty()) {
    natsOptions_SetSecure(options.get(), true);
    natsOptions_LoadCATrustedCertificates(options.get(), tls.ca_file.c_str());
  }
  if (!tls.cert_file.empty()) {
    natsOptions_LoadCertificatesChain(options.get(), tls.cert_file.c_str(), tls.key_file.c_str());
  }
  natsOptions_SetTimeout(options.get(), 5000);
  natsOptions_SetAllowReconnect(options.get(), false);
  natsConnection* connection = nullptr;
  if (const natsStatus status = natsConnection_Connect(&connection, options.get());
      status != NATS_OK) {
    Throw("cannot connect to the test NATS server " + url + " (start it with scripts/services)",
          status);
  }
  connection_.reset(connection);
  jsCtx* js = nullptr;
  if (const natsStatus status = natsConnection_JetStream(&js, connection_.get(), nullptr);
      status != NATS_OK) {
    Throw("natsConnection_JetStream", status);
  }
  js_.reset(js);
}

void JetStreamClient::AddStream(const StreamSpec& spec) {
  jsStreamConfig config;
  jsStreamConfig_Init(&config);
  config.Name = spec.name.c_str();
  std::vector<const char*> subjects;
  for (const std::string& subject : spec.subjects) subjects.push_back(subject.c_str());
  config.Subjects = subjects.data();
  config.SubjectsLen = static_cast<int>(subjects.size());
  config.Storage = spec.file_storage ? js_FileStorage : js_MemoryStorage;
  config.Duplicates = std::chrono::nanoseconds{spec.duplicate_window}.count();
  config.MaxMsgSize = spec.max_msg_size;
  jsStreamInfo* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  const natsStatus status = js_AddStream(&raw, js_.get(), &config, nullptr, &code);
  const nats::StreamInfoPtr info{raw};
  if (status != NATS_OK) {
    Throw("js_AddStream " + spec.name + " (err_code " + std::to_string(code) + ")", status);
  }
}

void JetStreamClient::DeleteStream(const std::string& name) noexcept {
  jsErrCode code = static_cast<jsErrCode>(0);
  js_DeleteStream(js_.get(), name.c_str(), nullptr, &code);
}

std::uint64_t JetStreamClient::Count(const std::string& stream) {
  jsStreamInfo* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  const natsStatus status = js_GetStreamInfo(&raw, js_.get(), stream.c_str(), nullptr, &code);
  const nats::StreamInfoPtr info{raw};
  if (status != NATS_OK) Throw("js_GetStreamInfo " + stream, status);
  return info->State.Msgs;
}

std::uint64_t JetStreamClient::WaitForCount(const std::string& stream, std::uint64_t expected,
                                            milliseconds limit) {
  const auto until = SteadyClock::now() + limit;
  for (;;) {
    const std::uint64_t count = Count(stream);
    if (count >= expected || SteadyClock::now() >= until) return count;
    std::this_thread::sleep_for(milliseconds{20});
  }
}

std::vector<StoredMessage> JetStreamClient::ReadAll(const std::string& stream, milliseconds limit) {
  jsStreamInfo* raw_info = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  natsStatus status = js_GetStreamInfo(&raw_info, js_.get(), stream.c_str(), nullptr, &code);
  const nats::StreamInfoPtr info{raw_info};
  if (status != NATS_OK) Throw("js_GetStreamInfo " + stream, status);
  const std::uint64_t count = info->State.Msgs;
  std::vector<StoredMessage> messages;
  if (count == 0) return messages;
  messages.reserve(count);
  const auto until = SteadyClock::now() + limit;

  if (info->Config->SubjectsLen != 1) {
    for (std::uint64_t seq = info->State.FirstSeq; seq <= info->State.LastSeq; ++seq) {
      natsMsg* raw = nullptr;
      status = js_GetMsg(&raw, js_.get(), stream.c_str(), seq, nullptr, &code);
      const nats::MsgPtr message{raw};
      if (status == NATS_NOT_FOUND) continue;  // deleted
      if (status != NATS_OK) Throw("js_GetMsg " + stream, status);
      messages.push_back(Stored(message.get()));
      messages.back().seq = seq;
    }
    return messages;
  }

  jsSubOptions options;
  jsSubOptions_Init(&options);
  options.Stream = stream.c_str();
  options.Ordered = true;
  options.Config.DeliverPolicy = js_DeliverAll;
  natsSubscription* raw_subscription = nullptr;
  status = js_SubscribeSync(&raw_subscription, js_.get(), info->Config->Subjects[0], nullptr,
                            &options, &code);
  const nats::SubscriptionPtr subscription{raw_subscription};
  if (status != NATS_OK) Throw("js_SubscribeSync (ordered consumer) on " + stream, status);
  natsSubscription_SetPendingLimits(subscription.get(), -1, -1);
  while (messages.size() < count) {
    const auto remaining = std::chrono::ceil<milliseconds>(until - SteadyClock::now());
    if (remaining <= milliseconds::zero()) {
      throw std::runtime_error("read " + std::to_string(messages.size()) + " of " +
                               std::to_string(count) + " messages of " + stream + " in time");
    }
    natsMsg* raw = nullptr;
    status = natsSubscription_NextMsg(&raw, subscription.get(), remaining.count());
    const nats::MsgPtr message{raw};
    if (status == NATS_TIMEOUT) continue;
    if (status != NATS_OK) Throw("reading " + stream, status);
    jsMsgMetaData* raw_meta = nullptr;
    if (natsMsg_GetMetaData(&raw_meta, message.get()) != NATS_OK) continue;  // not a stream msg
    const nats::MetaDataPtr meta{raw_meta};
    messages.push_back(Stored(message.get()));
    messages.back().seq = meta->Sequence.Stream;
  }
  return messages;
}

NatsServer::NatsServer(std::string extra_config)
    : extra_config_(std::move(extra_config)), port_(FreePort()) {
  std::string pattern = (std::filesystem::temp_directory_path() / "outbox-nats-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  std::ofstream(dir_ + "/nats.conf") << "listen: 127.0.0.1:" << port_ << "\n"
                                     << "server_name: outbox_test_" << port_ << "\n"
                                     << "jetstream {\n  store_dir: \"" << dir_ << "/js\"\n}\n"
                                     << extra_config_ << "\n";
  Start();
}

NatsServer::~NatsServer() {
  process_.reset();  // SIGKILL and wait
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void NatsServer::Start() {
  const std::size_t ready_before = Occurrences(Log(), "Server is ready");
  process_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{"/usr/sbin/nats-server", "-c", dir_ + "/nats.conf"},
      dir_ + "/nats.log");
  const auto until = SteadyClock::now() + std::chrono::seconds{20};
  while (Occurrences(Log(), "Server is ready") <= ready_before) {
    if (SteadyClock::now() > until) {
      throw std::runtime_error("nats-server on port " + std::to_string(port_) +
                               " not ready within 20 s:\n" + Log());
    }
    std::this_thread::sleep_for(milliseconds{20});
  }
}

void NatsServer::Stop(int signal) {
  if (!process_) return;
  if (process_->Stop(signal, std::chrono::seconds{30}) < 0) process_.reset();  // SIGKILL
  process_.reset();
}

std::string NatsServer::url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

std::string NatsServer::Log() const {
  std::ifstream in(dir_ + "/nats.log");
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace outbox::testing
