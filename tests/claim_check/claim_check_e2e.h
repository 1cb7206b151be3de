#pragma once
// The claim check end to end (issue #43), shared by the RabbitMQ and the Kafka test: the real
// outboxd on PostgreSQL with one sink whose max_message_bytes is under the 5 MiB payload and a
// [sinks.<name>.claim_check] table pointing at s3rver (support/s3rver.h). One event to the target,
// then a small one of its stream: the relay is killed (SIGKILL) between its upload and the
// publish, started again, and the consumer gets the reference, fetches the object and finds its
// SHA-256; one object, one delivered message (or a duplicate with its id). A target using it
// defines OUTBOXD_PATH and OUTBOX_S3RVER_NODE_DIR.

#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "outbox/sink/claim_check.h"
#include "support/child_process.h"
#include "support/pg_test_support.h"
#include "support/s3rver.h"
#include "support/wait.h"

namespace outbox::testing {

inline constexpr std::size_t kClaimCheckPayloadBytes = 5 * 1024 * 1024;

// A delivery as the test's consumer read it.
struct ClaimCheckDelivery {
  std::string id;
  Headers headers;
  std::string body;
};

class ClaimCheckE2e : public ::testing::Test {
 protected:
  // `sink_table`: [sinks.<sink_name>] without its claim_check table; `secret_in_env`: the
  // secret from OUTBOX_SINK_<NAME>_CLAIM_CHECK_SECRET_ACCESS_KEY instead of the file.
  void Start(const std::string& sink_name, const std::string& sink_table, bool secret_in_env) {
    const std::string missing = EnsureS3rver();
    if (!missing.empty()) GTEST_SKIP() << missing;
    s3_ = std::make_unique<S3rver>("payloads");
    ASSERT_TRUE(s3_->ready()) << s3_->Log();
    sink_name_ = sink_name;
    secret_in_env_ = secret_in_env;
    Sql(schema_.conn(), "UPDATE " + schema_.name() + ".settings SET max_payload_bytes = " +
                            std::to_string(kClaimCheckPayloadBytes + 1024));
    config_ = "/tmp/outboxd-claim-check-" + schema_.name() + ".toml";
    std::ofstream out(config_);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema_.name() << "\"\n"
        << "[relay]\ninstance = \"claim-check\"\nbatch_size = 10\nlease = \"4s\"\n"
        << "publish_timeout = \"2s\"\nsweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[retry]\ninitial_delay = \"50ms\"\nmax_delay = \"100ms\"\n"
        << sink_table << "[sinks." << sink_name << ".claim_check]\nendpoint = \"" << s3_->endpoint()
        << "\"\nbucket = \"payloads\"\nthreshold = 65536\n"
        << "prefix = \"" << sink_name << "/\"\naccess_key_id = \"" << kS3rverAccessKey << "\"\n";
    if (!secret_in_env) out << "secret_access_key = \"" << kS3rverSecretKey << "\"\n";
    out << "[http]\nlisten = \"\"\n";
  }
  void TearDown() override {
    if (config_.empty()) return;
    std::remove(config_.c_str());
    std::remove((config_ + ".log").c_str());
  }

  // outboxd; with `kill_after_upload`, the test-only hook of claim_check.h.
  std::unique_ptr<ChildProcess> StartOutboxd(bool kill_after_upload) {
    std::vector<std::string> argv{"/usr/bin/env"};
    if (secret_in_env_) {
      std::string name = sink_name_;  // sink/registry.h's SinkSecretEnv, for a plain name
      for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      argv.push_back("OUTBOX_SINK_" + name + "_CLAIM_CHECK_SECRET_ACCESS_KEY=" + kS3rverSecretKey);
    }
    if (kill_after_upload) argv.emplace_back("OUTBOX_TEST_CLAIM_CHECK_KILL_AFTER_UPLOAD=1");
    for (const char* arg : {OUTBOXD_PATH, "--config"}) argv.emplace_back(arg);
    argv.push_back(config_);
    return std::make_unique<ChildProcess>(argv, config_ + ".log", Ready::Notify());
  }

  std::int64_t Rows() {
    return std::stoll(
        Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages"));
  }
  std::string Log() {
    std::ifstream in(config_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }
  [[nodiscard]] claim_check::StoreOptions Store() const {
    claim_check::StoreOptions store;
    store.endpoint = s3_->endpoint();
    store.bucket = "payloads";
    store.access_key_id = kS3rverAccessKey;
    store.secret_access_key = kS3rverSecretKey;
    return store;
  }

  // The scenario; `published` says how many messages the broker holds now, `read` reads them
  // (at least `expected`, duplicates included) once outboxd has been stopped.
  void Run(const std::function<std::size_t()>& published,
           const std::function<std::vector<ClaimCheckDelivery>(std::size_t expected)>& read) {
    Sql(schema_.conn(), "SELECT " + schema_.name() +
                            ".enqueue(topic => 'orders', payload => jsonb_build_object('blob', "
                            "repeat('0123456789', " +
                            std::to_string(kClaimCheckPayloadBytes / 10) +
                            ")), stream_key => 'order-1', type => 'OrderPlaced', targets => "
                            "ARRAY['" +
                            sink_name_ + "'])");
    Sql(schema_.conn(), "SELECT " + schema_.name() +
                            ".enqueue(topic => 'orders', payload => '{\"small\": true}', "
                            "stream_key => 'order-1', targets => ARRAY['" +
                            sink_name_ + "'])");
    // The payload as the relay reads it (the bytes it stored), and its id.
    const std::string where = " FROM " + schema_.name() + ".messages WHERE stream_seq = 1";
    const std::string payload =
        Scalar(schema_.conn(), "SELECT convert_from(payload, 'UTF8')" + where);
    ASSERT_GT(payload.size(), kClaimCheckPayloadBytes);
    const std::string expected_sha256 = claim_check::Sha256Hex(payload);
    const std::string big_id = Scalar(schema_.conn(), "SELECT id::text" + where);

    // Killed between the upload and the publish: the object is there, nothing is published.
    {
      auto relay = StartOutboxd(/*kill_after_upload=*/true);
      EXPECT_EQ(relay->Wait(std::chrono::seconds{20}), 128 + SIGKILL) << Log();
    }
    EXPECT_EQ(s3_->Keys(), std::vector<std::string>{sink_name_ + "/" + big_id}) << Log();
    EXPECT_EQ(published(), 0U);
    EXPECT_EQ(Rows(), 2);

    // Started again (once the dead relay's 4 s lease is over): the big one goes by reference, the
    // small one as it is.
    auto relay = StartOutboxd(/*kill_after_upload=*/false);
    ASSERT_TRUE(WaitUntil([&] { return Rows() == 0; }, std::chrono::seconds{30}))
        << Rows() << " rows\n"
        << Log();
    EXPECT_EQ(relay->Stop(SIGTERM, std::chrono::seconds{20}), 0) << Log();
    const std::vector<ClaimCheckDelivery> deliveries = read(2);

    // One object: the upload after the restart wrote the same one again.
    EXPECT_EQ(s3_->Keys(), std::vector<std::string>{sink_name_ + "/" + big_id});
    ASSERT_GE(deliveries.size(), 2U);
    std::set<std::string> ids;
    for (const auto& delivery : deliveries) ids.insert(delivery.id);
    EXPECT_EQ(ids.size(), 2U) << "a duplicate carries its message's id";
    const ClaimCheckDelivery& big = deliveries[0];
    EXPECT_EQ(big.id, big_id);
    EXPECT_EQ(big.headers.at(std::string{claim_check::kSha256Header}), expected_sha256);
    EXPECT_EQ(big.headers.at(std::string{claim_check::kSizeHeader}),
              std::to_string(payload.size()));
    EXPECT_EQ(big.headers.at(std::string{claim_check::kContentTypeHeader}), "application/json");
    EXPECT_LT(big.body.size(), 1000U);
    const claim_check::FetchResult fetched = claim_check::FetchClaimCheck(big.headers, Store());
    ASSERT_TRUE(fetched.ok()) << fetched.message;
    EXPECT_EQ(claim_check::Sha256Hex(fetched.payload), expected_sha256);
    EXPECT_TRUE(fetched.payload == payload);
    const ClaimCheckDelivery& small = deliveries.back();
    EXPECT_EQ(small.body, "{\"small\": true}");
    EXPECT_EQ(small.headers.count(std::string{claim_check::kUrlHeader}), 0U);
  }

  TestSchema schema_;
  std::unique_ptr<S3rver> s3_;
  std::string sink_name_;
  bool secret_in_env_ = false;
  std::string config_;
};

}  // namespace outbox::testing
