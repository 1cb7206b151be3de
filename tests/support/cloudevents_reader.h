#pragma once
// The sink tests' independent reader of CloudEvents (issue #43): what a broker delivered, handed
// to the official CloudEvents SDK for JavaScript (npm `cloudevents`, installed into the build
// directory on first use) by cloudevents_reader.js, and the events it parsed checked against the
// envelopes they came from. A target using it defines OUTBOX_CE_NODE_DIR (where the SDK is
// installed) and OUTBOX_SOURCE_DIR (the project's source directory), and links nlohmann_json.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/core/percent_decode.h"
#include "support/npm_package.h"

namespace outbox::testing {

// The SDK in OUTBOX_CE_NODE_DIR, installed with npm on first use: "" when it is there, else why
// not.
inline std::string EnsureCloudEventsSdk() {
  return EnsureNpmPackage(OUTBOX_CE_NODE_DIR, "cloudevents", "8", "the reader of this test");
}

// One message as the broker delivered it, for cloudevents_reader.js: `binding` is http, kafka,
// amqp, nats, redis or json (a structured event on its own).
inline nlohmann::json DeliveredMessage(std::string_view binding, const nlohmann::json& headers,
                                       std::string_view body) {
  nlohmann::json message = {{"binding", binding}, {"headers", headers}};
  message["body"] = std::string{body};
  return message;
}

// What the SDK made of each of `messages`: {"ok": true, "event": {...}} or {"ok": false,
// "error": "..."}, in order. Fails the test (and returns an empty array) when node fails.
inline nlohmann::json ReadWithCloudEventsSdk(const nlohmann::json& messages) {
  const std::string input = std::filesystem::temp_directory_path() /
                            ("outbox-ce-" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(input, std::ios::binary);
    out << messages.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  const std::string command = "NODE_PATH='" + std::string{OUTBOX_CE_NODE_DIR} +
                              "/node_modules' node '" + std::string{OUTBOX_SOURCE_DIR} +
                              "/tests/support/cloudevents_reader.js' < '" + input + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  if (pipe != nullptr) {
    char buffer[4096];
    std::size_t read = 0;
    while ((read = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, read);
    const int status = ::pclose(pipe);
    std::filesystem::remove(input);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return nlohmann::json::parse(output);
  }
  ADD_FAILURE() << "cloudevents_reader.js failed: " << output;
  return nlohmann::json::array();
}

// Checks that the SDK read `result` as the CloudEvent of `envelope` (docs/cloudevents.md), with
// source `source`; `data` is what the event's data should be (the parsed JSON for a JSON
// payload, else the payload as a string). `percent_encoded`: the binding percent-encodes header
// values (HTTP, NATS), which the SDK (8.x) does not decode, though the spec says a receiver must:
// the extension values are decoded here.
inline void ExpectCloudEventOf(const nlohmann::json& result, const Envelope& envelope,
                               const std::string& source, const nlohmann::json& data,
                               bool percent_encoded = false) {
  ASSERT_TRUE(result.value("ok", false)) << result.dump();
  const nlohmann::json& event = result.at("event");
  EXPECT_EQ(event.value("specversion", ""), "1.0");
  EXPECT_EQ(event.value("id", ""), envelope.id.ToString());
  EXPECT_EQ(event.value("source", ""), source);
  EXPECT_EQ(event.value("type", ""), envelope.type.value_or(envelope.topic));
  EXPECT_EQ(event.value("time", ""), FormatRfc3339(envelope.created_at, 3));
  if (envelope.stream_key) {
    EXPECT_EQ(event.value("subject", ""), *envelope.stream_key);
  } else {
    EXPECT_FALSE(event.contains("subject")) << event.dump();
  }
  EXPECT_EQ(event.value("datacontenttype", ""), envelope.content_type);
  EXPECT_EQ(event.value("eventid", ""), envelope.EventId().ToString());
  if (envelope.stream_seq) {
    EXPECT_EQ(event.value("streamseq", ""), std::to_string(*envelope.stream_seq));
  } else {
    EXPECT_FALSE(event.contains("streamseq")) << event.dump();
  }
  EXPECT_EQ(event.value("partition", ""), std::to_string(envelope.partition));
  EXPECT_EQ(event.value("data", nlohmann::json{}), data) << event.dump();
  const auto text = [&](const char* name) {
    const std::string value = event.value(name, "");
    return percent_encoded ? PercentDecode(value).value_or("(bad percent-encoding) " + value)
                           : value;
  };
  // The database the message was read from, only when the relay serves several.
  if (!envelope.database.empty()) {
    EXPECT_EQ(text("outboxdatabase"), envelope.database);
  } else {
    EXPECT_FALSE(event.contains("outboxdatabase")) << event.dump();
  }
  // The well-known headers under their extension names; a legal name as it is; others left out.
  for (const auto& [name, value] : envelope.headers) {
    if (name == kCorrelationIdHeader) {
      EXPECT_EQ(text("correlationid"), value);
    } else if (name == kTraceparentHeader) {
      EXPECT_EQ(text("traceparent"), value);
    }
  }
  EXPECT_FALSE(event.contains("correlation_id"));
  EXPECT_FALSE(event.contains("X-Trace-Id"));
  EXPECT_FALSE(event.contains("xtraceid"));
}

// The envelope the CloudEvents tests publish: a type, a stream, a seq, a database (as from a
// relay serving several), the well-known headers, a legal and an illegal extension name, and a
// value that HTTP and NATS must percent-encode.
inline void DecorateForCloudEvents(Envelope& envelope, std::int64_t seq) {
  envelope.type = "OrderPlaced";
  envelope.stream_key = "order-42";
  envelope.stream_seq = seq;
  envelope.partition = 3;
  envelope.database = "tenant-7";
  envelope.headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  envelope.headers["correlation_id"] = "corr 1 \"quoted\" 100% caf\xC3\xA9";
  envelope.headers["X-Trace-Id"] = "left-out";
}

}  // namespace outbox::testing
