// The sink contract suite (tests/sink/) against the file sink: each test bed writes to a file of
// its own in a temporary directory (with fsync), and reads it back line by line with
// nlohmann-json and a base64 decoder of its own, not with the sink's code. The file sink has no
// server, so the suite's fault tests are skipped; its own faults (a full disk, a stalled reader)
// are in file_sink_test.cpp.
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../sink/sink_contract.h"
#include "outbox/sink/file.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Standard base64 (RFC 4648, with padding) to bytes; throws on anything else.
std::string DecodeBase64(const std::string& text) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (text.size() % 4 != 0) throw std::runtime_error("base64 length not a multiple of 4");
  std::string bytes;
  std::uint32_t bits = 0;
  int count = 0;
  std::size_t padding = 0;
  for (const char c : text) {
    if (c == '=') {
      ++padding;
      bits <<= 6U;
    } else {
      const std::size_t value = kAlphabet.find(c);
      if (value == std::string_view::npos || padding > 0) {
        throw std::runtime_error("not base64: '" + text + "'");
      }
      bits = (bits << 6U) | static_cast<std::uint32_t>(value);
    }
    if (++count == 4) {
      for (const unsigned shift : {16U, 8U, 0U}) bytes.push_back(static_cast<char>(bits >> shift));
      bits = 0;
      count = 0;
    }
  }
  if (padding > 2) throw std::runtime_error("not base64: '" + text + "'");
  bytes.resize(bytes.size() - padding);
  return bytes;
}

// application/json, with or without parameters, in any case.
bool IsJson(std::string content_type) {
  content_type = content_type.substr(0, content_type.find(';'));
  while (!content_type.empty() && content_type.back() == ' ') content_type.pop_back();
  for (char& c : content_type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return content_type == "application/json";
}

ArrivedMessage Parse(const std::string& line) {
  const json object = json::parse(line);  // throws on a broken line
  ArrivedMessage message;
  message.id = object.at("id").get<std::string>();
  if (!object.at("stream_key").is_null()) message.stream_key = object["stream_key"];
  if (!object.at("stream_seq").is_null()) message.stream_seq = object["stream_seq"];
  if (object.contains("payload_base64")) {
    message.payload = DecodeBase64(object["payload_base64"].get<std::string>());
  } else if (IsJson(object.at("content_type").get<std::string>())) {
    message.payload = object.at("payload").dump();  // embedded as JSON
  } else {
    message.payload = object.at("payload").get<std::string>();
  }
  return message;
}

class FileTestBed final : public SinkTestBed {
 public:
  FileTestBed() {
    std::string pattern = (fs::temp_directory_path() / "outbox_sink_contract_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    path_ = (dir_ / "out.jsonl").string();
  }
  ~FileTestBed() override { fs::remove_all(dir_); }
  FileTestBed(const FileTestBed&) = delete;
  FileTestBed& operator=(const FileTestBed&) = delete;

  [[nodiscard]] std::string Topic() const override { return "orders"; }

  std::unique_ptr<Sink> OpenSink() override {
    return file::OpenSink({.path = path_, .fsync = true});
  }

  std::vector<ArrivedMessage> ReadBack(std::size_t expected,
                                       std::chrono::milliseconds limit) override {
    std::vector<ArrivedMessage> arrived;
    WaitUntil(
        [&] {
          arrived = ReadAll();
          return arrived.size() >= expected;
        },
        limit);
    return arrived;
  }

 private:
  [[nodiscard]] std::vector<ArrivedMessage> ReadAll() const {
    std::vector<ArrivedMessage> arrived;
    std::ifstream in(path_, std::ios::binary);
    for (std::string line; std::getline(in, line);) arrived.push_back(Parse(line));
    return arrived;
  }

  fs::path dir_;
  std::string path_;
};

class FileHarness final : public SinkHarness {
 public:
  [[nodiscard]] std::string Name() const override { return "file"; }
  [[nodiscard]] std::optional<std::string> Lacks(SinkFault fault) const override {
    static const std::map<SinkFault, std::string> kWhy{
        {SinkFault::kServerDown,
         "the file sink has no server to stop (its write errors are "
         "FileSinkTest.WriteErrorIsUnavailableNotAnException)"},
        {SinkFault::kUnknownDestination, "the file sink writes every topic to its one file"},
        {SinkFault::kTooLarge, "the file sink has no message size limit"},
        {SinkFault::kLostConfirmation,
         "the file sink has no server whose confirmation could be lost"},
        {SinkFault::kFreeze, "the file sink has no connection that could freeze"},
    };
    return kWhy.at(fault);
  }
  std::unique_ptr<SinkTestBed> NewTestBed() override { return std::make_unique<FileTestBed>(); }
};

FileHarness harness;
INSTANTIATE_TEST_SUITE_P(File, SinkContractTest, ::testing::Values(&harness), SinkHarnessName);

}  // namespace
}  // namespace outbox::testing
