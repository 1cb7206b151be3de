// The file sink type for outboxd: the `envelope` key of [sinks.<name>] type = "file" read from
// TOML and shown by --check-config (the other keys: tests/outboxd/config_test.cpp).
#include "outbox/sink/file_type.h"

#include <gtest/gtest.h>

#include <string>

#include "support/sink_type_test.h"

namespace outbox::file {
namespace {

TEST(FileSinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(Type(), "path = \"-\"\n", [](const outbox::SinkSettings& settings) {
    return dynamic_cast<const SinkSettings&>(settings).options().envelope;
  });
  EXPECT_EQ(testing::DescribeSink(testing::ParseSinkTable(Type(), "envelope = \"external\"\n")),
            "path = \"-\"\nfsync = false\nenvelope = \"external\"\n");
}

TEST(FileSinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), "path = \"-\"\n",
      [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().cloudevents;
      },
      {"structured"});
}

}  // namespace
}  // namespace outbox::file
