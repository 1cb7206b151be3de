#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/sink/file.h"

namespace outbox::file {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

Deadline Soon() { return std::chrono::steady_clock::now() + 10s; }

class FileSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "outbox_file_sink_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  [[nodiscard]] std::string PathOf(const std::string& name) const { return (dir_ / name).string(); }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream content;
    content << in.rdbuf();
    return content.str();
  }

  static std::vector<std::string> Lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  fs::path dir_;
};

Envelope Message(int n) {
  Envelope envelope;
  envelope.id = NewUuidV7();
  envelope.topic = "orders";
  envelope.payload = R"({"order":)" + std::to_string(n) + "}";
  envelope.partition = n % 64;
  envelope.created_at = std::chrono::sys_days{std::chrono::year{2024} / 5 / 1} + 1h + 2min + 3s +
                        std::chrono::milliseconds{n};
  return envelope;
}

void ExpectAllPublished(const std::vector<PublishOutcome>& outcomes,
                        const std::vector<Envelope>& batch) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id);
    EXPECT_TRUE(outcomes[i].published()) << outcomes[i].failure->Describe();
  }
}

TEST_F(FileSinkTest, LinesRoundTripEveryField) {
  const std::string path = PathOf("out.jsonl");
  auto sink = OpenSink({.path = path});
  EXPECT_EQ(sink->Name(), "file");

  Envelope full = Message(1);
  full.stream_key = "order-42";
  full.stream_seq = 17;
  full.target = "audit";
  full.type = "OrderPlaced";
  full.headers = {{"correlation_id", "req-7f3a"}, {"traceparent", "00-abc-01"}};
  full.attempts = 3;
  full.payload = R"({"id": 42, "total": 99.5, "items": ["a", "b"]})";
  Envelope text = Message(2);
  text.content_type = "text/plain; charset=utf-8";
  text.payload = "h\xc3\xa9llo \"world\"\n";
  const std::vector<Envelope> batch{full, text};

  ExpectAllPublished(sink->Publish(batch, Soon()), batch);

  const auto lines = Lines(ReadFile(path));
  ASSERT_EQ(lines.size(), 2U);
  const auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["id"], full.id.ToString());
  EXPECT_EQ(first["event_id"], full.id.ToString()) << "no event_id set: the message's own id";
  EXPECT_EQ(first["topic"], "orders");
  EXPECT_EQ(first["stream_key"], "order-42");
  EXPECT_EQ(first["stream_seq"], 17);
  EXPECT_EQ(first["partition"], 1);
  EXPECT_EQ(first["target"], "audit");
  EXPECT_EQ(first["type"], "OrderPlaced");
  EXPECT_EQ(first["content_type"], "application/json");
  EXPECT_EQ(first["headers"],
            (nlohmann::json{{"correlation_id", "req-7f3a"}, {"traceparent", "00-abc-01"}}));
  EXPECT_EQ(first["attempts"], 3);
  EXPECT_EQ(first["created_at"], "2024-05-01T01:02:03.001Z");
  EXPECT_EQ(first["payload"], nlohmann::json::parse(full.payload)) << "embedded as JSON";
  EXPECT_FALSE(first.contains("payload_base64"));

  const auto second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["id"], text.id.ToString());
  EXPECT_TRUE(second["stream_key"].is_null());
  EXPECT_TRUE(second["stream_seq"].is_null());
  EXPECT_TRUE(second["type"].is_null());
  EXPECT_EQ(second["target"], "default");
  EXPECT_EQ(second["headers"], nlohmann::json::object());
  EXPECT_EQ(second["payload"], text.payload) << "a string, byte for byte";
}

TEST_F(FileSinkTest, FullStyleCarriesTheSharedEventId) {
  const std::string path = PathOf("full.jsonl");
  auto sink = OpenSink({.path = path});  // envelope kFull, the default
  Envelope copy = Message(1);
  copy.event_id = NewUuidV7();  // a copy of a message written to several targets
  copy.stream_key = "order-42";
  copy.stream_seq = 5;
  copy.target = "audit";
  copy.database = "tenant-7";  // from a relay serving several databases
  copy.attempts = 2;
  // Refused by the stores; left out so that they cannot pass for ours.
  copy.headers = {{"event_id", "forged"}, {"Event_Id", "forged"}, {"correlation_id", "corr-1"}};
  const Envelope single = Message(2);
  const std::vector<Envelope> batch{copy, single};
  ExpectAllPublished(sink->Publish(batch, Soon()), batch);

  const auto lines = Lines(ReadFile(path));
  ASSERT_EQ(lines.size(), 2U);
  const auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["id"], copy.id.ToString());
  EXPECT_EQ(first["event_id"], copy.event_id->ToString());
  EXPECT_EQ(first["headers"], (nlohmann::json{{"correlation_id", "corr-1"}}));
  EXPECT_EQ(first["topic"], "orders");
  EXPECT_EQ(first["stream_key"], "order-42");
  EXPECT_EQ(first["stream_seq"], 5);
  EXPECT_EQ(first["target"], "audit");
  EXPECT_EQ(first["database"], "tenant-7");
  EXPECT_EQ(first["attempts"], 2);
  const auto second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["event_id"], single.id.ToString());
  EXPECT_FALSE(second.contains("database")) << "from a relay serving one database: no key";
}

TEST_F(FileSinkTest, ExternalStyleWritesNothingInternal) {
  const std::string path = PathOf("external.jsonl");
  auto sink = OpenSink({.path = path, .envelope = EnvelopeStyle::kExternal});
  Envelope envelope = Message(1);
  envelope.event_id = NewUuidV7();
  envelope.stream_key = "order-42";
  envelope.stream_seq = 5;
  envelope.stream_prev_seq = 3;
  envelope.target = "partner";
  envelope.database = "tenant-7";
  envelope.attempts = 2;
  envelope.type = "OrderPlaced";
  envelope.content_type = "application/vnd.test+json";
  envelope.headers = {{"correlation_id", "corr-1"},
                      {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                      {"x-custom", "value"},
                      {"event_id", "forged"}};
  const std::vector<Envelope> batch{envelope};
  ExpectAllPublished(sink->Publish(batch, Soon()), batch);

  const auto lines = Lines(ReadFile(path));
  ASSERT_EQ(lines.size(), 1U);
  const auto line = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(line["id"], envelope.id.ToString());
  EXPECT_EQ(line["event_id"], envelope.event_id->ToString());
  EXPECT_EQ(line["type"], "OrderPlaced");
  EXPECT_EQ(line["content_type"], "application/vnd.test+json");
  EXPECT_EQ(
      line["headers"],
      (nlohmann::json{{"correlation_id", "corr-1"},
                      {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                      {"x-custom", "value"}}));
  EXPECT_EQ(line["created_at"], "2024-05-01T01:02:03.001Z");
  EXPECT_EQ(line["payload"], envelope.payload) << "not application/json: kept as a string";
  const auto ordered = nlohmann::ordered_json::parse(lines[0]);
  std::vector<std::string> keys;  // in the order written
  for (auto it = ordered.begin(); it != ordered.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"id", "event_id", "type", "content_type", "headers",
                                            "created_at", "payload"}));
}

TEST_F(FileSinkTest, BinaryPayloadIsBase64) {
  const std::string path = PathOf("out.jsonl");
  auto sink = OpenSink({.path = path});
  Envelope binary = Message(1);
  binary.content_type = "application/x-protobuf";
  binary.payload = std::string("\x00\x01\xff\xfe payload", 12);
  Envelope json_but_not_utf8 = Message(2);
  json_but_not_utf8.payload = "\"\xff\"";
  const std::vector<Envelope> batch{binary, json_but_not_utf8};
  ExpectAllPublished(sink->Publish(batch, Soon()), batch);

  const auto lines = Lines(ReadFile(path));
  ASSERT_EQ(lines.size(), 2U);
  const auto first = nlohmann::json::parse(lines[0]);
  EXPECT_FALSE(first.contains("payload"));
  EXPECT_EQ(first["payload_base64"], "AAH//iBwYXlsb2Fk");
  const auto second = nlohmann::json::parse(lines[1]);
  EXPECT_FALSE(second.contains("payload"));
  EXPECT_EQ(second["payload_base64"], "Iv8i");
}

// Close() and Publish again (appending after the reopen) is in the sink contract suite
// (file_sink_contract_test.cpp).
TEST_F(FileSinkTest, AppendsToAnExistingFile) {
  const std::string path = PathOf("out.jsonl");
  std::ofstream(path) << "existing line\n";
  auto sink = OpenSink({.path = path, .fsync = true});
  const std::vector<Envelope> batch{Message(1), Message(2)};
  ExpectAllPublished(sink->Publish(batch, Soon()), batch);

  const auto lines = Lines(ReadFile(path));
  ASSERT_EQ(lines.size(), 3U);
  EXPECT_EQ(lines[0], "existing line");
  EXPECT_EQ(nlohmann::json::parse(lines[1])["id"], batch[0].id.ToString());
  EXPECT_EQ(nlohmann::json::parse(lines[2])["id"], batch[1].id.ToString());
}

TEST_F(FileSinkTest, CreatesMissingFileWithFsync) {
  const std::string path = PathOf("new.jsonl");
  auto sink = OpenSink({.path = path, .fsync = true});
  EXPECT_TRUE(fs::exists(path));
  const std::vector<Envelope> batch{Message(1)};
  ExpectAllPublished(sink->Publish(batch, Soon()), batch);
  EXPECT_EQ(Lines(ReadFile(path)).size(), 1U);
}

TEST_F(FileSinkTest, WriteErrorIsUnavailableNotAnException) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  auto sink = OpenSink({.path = "/dev/full", .fsync = true});
  const std::vector<Envelope> batch{Message(1), Message(2)};
  for (int call = 0; call < 2; ++call) {  // the second call reopens and fails again
    const auto outcomes = sink->Publish(batch, Soon());
    ASSERT_EQ(outcomes.size(), 2U);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      EXPECT_EQ(outcomes[i].id, batch[i].id);
      ASSERT_FALSE(outcomes[i].published());
      EXPECT_EQ(outcomes[i].failure->kind, FailureKind::kUnavailable);
      EXPECT_NE(outcomes[i].failure->reason.find("No space left on device"), std::string::npos)
          << outcomes[i].failure->reason;
      EXPECT_NE(outcomes[i].failure->reason.find("/dev/full"), std::string::npos);
    }
  }
}

void ExpectConfigError(const std::string& path, const std::string& text) {
  try {
    OpenSink({.path = path});
    ADD_FAILURE() << "no ConfigError for '" << path << "'";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "path");
    EXPECT_NE(std::string{error.what()}.find(text), std::string::npos) << error.what();
  }
}

TEST_F(FileSinkTest, UnopenablePathsAreConfigErrors) {
  ExpectConfigError(dir_.string(), "Is a directory");
  ExpectConfigError(PathOf("missing/out.jsonl"), "No such file or directory");
  ExpectConfigError("", "must not be empty");
}

TEST_F(FileSinkTest, FifoWithoutReaderIsAConfigErrorNotAHang) {
  const std::string path = PathOf("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  ExpectConfigError(path, "FIFO without a reader");
}

// Reads what is available from a non-blocking descriptor.
std::string Drain(int fd) {
  std::string data;
  std::array<char, 65536> buffer{};
  for (;;) {
    const ssize_t count = ::read(fd, buffer.data(), buffer.size());
    if (count <= 0) return data;
    data.append(buffer.data(), static_cast<std::size_t>(count));
  }
}

TEST_F(FileSinkTest, StalledReaderMeetsTheDeadlineAndLaterLinesStayIntact) {
  const std::string path = PathOf("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  auto sink = OpenSink({.path = path, .fsync = true});

  // Far more than a pipe holds (64 KiB), and nobody reads.
  std::vector<Envelope> big;
  for (int i = 0; i < 400; ++i) {
    big.push_back(Message(i));
    big.back().payload = "\"" + std::string(1000, 'x') + "\"";
  }
  const auto start = std::chrono::steady_clock::now();
  // Long enough that the first lines go out even on a loaded machine under ASan (200 ms did not).
  const auto outcomes = sink->Publish(big, start + 1s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ASSERT_EQ(outcomes.size(), big.size());
  EXPECT_TRUE(outcomes.front().published());
  ASSERT_FALSE(outcomes.back().published());
  EXPECT_EQ(outcomes.back().failure->kind, FailureKind::kUnavailable);
  EXPECT_NE(outcomes.back().failure->reason.find("deadline"), std::string::npos);
  std::size_t published = 0;
  while (published < outcomes.size() && outcomes[published].published()) ++published;
  for (std::size_t i = published; i < outcomes.size(); ++i) EXPECT_FALSE(outcomes[i].published());

  std::string received = Drain(reader);
  const std::vector<Envelope> next{Message(1000)};
  ExpectAllPublished(sink->Publish(next, Soon()), next);
  received += Drain(reader);
  ::close(reader);

  // The published lines, then the one line the deadline cut short, then the next batch intact.
  const auto lines = Lines(received);
  ASSERT_EQ(lines.size(), published + 2);
  for (std::size_t i = 0; i < published; ++i) {
    EXPECT_EQ(nlohmann::json::parse(lines[i])["id"], big[i].id.ToString());
  }
  EXPECT_TRUE(nlohmann::json::parse(lines[published], nullptr, false).is_discarded());
  EXPECT_EQ(nlohmann::json::parse(lines.back())["id"], next[0].id.ToString());
}

TEST_F(FileSinkTest, DashIsStandardOutput) {
  std::array<int, 2> pipe_fds{};
  ASSERT_EQ(::pipe(pipe_fds.data()), 0);
  std::fflush(stdout);
  const int saved_stdout = ::dup(STDOUT_FILENO);
  ASSERT_GE(saved_stdout, 0);
  ASSERT_GE(::dup2(pipe_fds[1], STDOUT_FILENO), 0);
  ::close(pipe_fds[1]);

  std::vector<PublishOutcome> outcomes;
  const std::vector<Envelope> batch{Message(1)};
  {
    auto sink = OpenSink({});  // path "-"
    outcomes = sink->Publish(batch, Soon());
    sink->Close();  // must not close standard output
  }
  EXPECT_NE(::fcntl(STDOUT_FILENO, F_GETFD), -1) << "standard output was closed";
  ::dup2(saved_stdout, STDOUT_FILENO);
  ::close(saved_stdout);

  ExpectAllPublished(outcomes, batch);
  ASSERT_EQ(::fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK), 0);
  const std::string received = Drain(pipe_fds[0]);
  ::close(pipe_fds[0]);
  const auto lines = Lines(received);
  ASSERT_EQ(lines.size(), 1U);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["id"], batch[0].id.ToString());
}

}  // namespace
}  // namespace outbox::file
