// envelope = "cloudevents" on the file sink (issue #43): each line a structured CloudEvent (the
// JSON event format), read from the file and validated by the official CloudEvents SDK for
// JavaScript; a message whose source expands to nothing is permanent and gets no line.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/core/uuid.h"
#include "outbox/sink/file.h"
#include "support/cloudevents_reader.h"

namespace outbox::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

Envelope MakeMessage(const std::string& topic, std::string payload) {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .created_at = std::chrono::system_clock::now()};
}

class FileCloudEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string problem = EnsureCloudEventsSdk(); !problem.empty()) FAIL() << problem;
    std::string pattern = (fs::temp_directory_path() / "outbox_file_ce_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  [[nodiscard]] std::vector<std::string> Lines() const {
    std::ifstream in(dir_ + "/events.jsonl", std::ios::binary);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  file::SinkOptions Options() const {
    file::SinkOptions options;
    options.path = dir_ + "/events.jsonl";
    options.envelope = EnvelopeStyle::kCloudEvents;
    options.cloudevents.source = "/audit/{type}";
    return options;
  }

  std::string dir_;
};

TEST_F(FileCloudEventsTest, EachLineIsAStructuredCloudEventTheSdkValidates) {
  auto sink = file::OpenSink(Options());
  std::vector<Envelope> batch;
  batch.push_back(MakeMessage("orders", R"({"order":42})"));
  DecorateForCloudEvents(batch.back(), 2);
  batch.push_back(MakeMessage("orders", "plain text"));
  batch.back().type = "Note";
  batch.back().content_type = "text/plain";
  batch.push_back(MakeMessage("orders", std::string("\x00\xff", 2)));
  batch.back().type = "Blob";
  batch.back().content_type = "application/octet-stream";
  batch.push_back(MakeMessage("orders", "{}"));  // no type: source "/audit/", not empty
  for (const PublishOutcome& outcome : sink->Publish(batch, SteadyClock::now() + seconds{5})) {
    ASSERT_TRUE(outcome.published()) << outcome.failure->Describe();
  }
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), batch.size());
  nlohmann::json messages = nlohmann::json::array();
  for (const std::string& line : lines) {
    messages.push_back(DeliveredMessage("json", nlohmann::json::object(), line));
  }
  const nlohmann::json results = ReadWithCloudEventsSdk(messages);
  ASSERT_EQ(results.size(), batch.size());
  ExpectCloudEventOf(results[0], batch[0], "/audit/OrderPlaced", {{"order", 42}});
  ExpectCloudEventOf(results[1], batch[1], "/audit/Note", "plain text");
  ASSERT_TRUE(results[2].value("ok", false)) << results[2].dump();
  EXPECT_EQ(results[2]["event"].value("data_base64", ""), "AP8=");
  ExpectCloudEventOf(results[3], batch[3], "/audit/", nlohmann::json::object());
}

TEST_F(FileCloudEventsTest, EmptySourceIsPermanentWithoutALine) {
  file::SinkOptions options = Options();
  options.cloudevents.source = "{type}";
  auto sink = file::OpenSink(options);
  std::vector<Envelope> batch{MakeMessage("orders", "{}"), MakeMessage("orders", "{}")};
  batch[1].type = "Kept";
  const auto outcomes = sink->Publish(batch, SteadyClock::now() + seconds{5});
  ASSERT_EQ(outcomes.size(), 2U);
  ASSERT_FALSE(outcomes[0].published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kPermanent);
  EXPECT_NE(outcomes[0].failure->reason.find("empty source"), std::string::npos);
  EXPECT_TRUE(outcomes[1].published());
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1U);
  EXPECT_NE(lines[0].find(batch[1].id.ToString()), std::string::npos);
}

TEST_F(FileCloudEventsTest, OnlyStructuredModeAndAValidSource) {
  file::SinkOptions options = Options();
  options.cloudevents.mode = cloudevents::Mode::kBinary;
  EXPECT_THROW(file::OpenSink(options), ConfigError);
  options = Options();
  options.cloudevents.source = "";
  EXPECT_THROW(file::OpenSink(options), ConfigError);
}

}  // namespace
}  // namespace outbox::testing
