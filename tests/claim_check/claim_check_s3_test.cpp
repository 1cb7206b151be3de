// The claim-check step and FetchClaimCheck against a real S3-compatible server (s3rver, see
// support/s3rver.h for what it does not check), in front of a sink that records what it was handed.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>

#include "outbox/sink/claim_check.h"
#include "outbox/sink/cloudevents.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/s3rver.h"
#include "support/wait.h"

namespace outbox::claim_check {
namespace {

using testing::S3rver;

// The inner sink: records each batch and reports every message published.
class RecordingSink final : public Sink {
 public:
  [[nodiscard]] std::string_view Name() const override { return "recording"; }
  std::vector<PublishOutcome> Publish(std::span<const Envelope> batch, Deadline) override {
    std::vector<PublishOutcome> outcomes;
    for (const Envelope& envelope : batch) {
      received->push_back(envelope);
      outcomes.push_back(PublishOutcome{.id = envelope.id, .failure = std::nullopt});
    }
    return outcomes;
  }
  void Close() override {}
  std::shared_ptr<std::vector<Envelope>> received = std::make_shared<std::vector<Envelope>>();
};

Envelope MakeEnvelope(std::string payload, std::optional<std::string> stream = std::nullopt) {
  Envelope envelope;
  envelope.id = NewUuidV7();
  envelope.topic = "orders";
  envelope.stream_key = std::move(stream);
  envelope.payload = std::move(payload);
  envelope.content_type = "application/octet-stream";
  envelope.headers["correlation_id"] = "c-1";
  return envelope;
}

std::string BigPayload(std::size_t size) {
  std::string payload(size, '\0');
  for (std::size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 7919) % 251);
  return payload;
}

Deadline In(std::chrono::milliseconds duration) {
  return std::chrono::steady_clock::now() + duration;
}

class ClaimCheckS3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string missing = testing::EnsureS3rver();
    if (!missing.empty()) GTEST_SKIP() << missing;
    server_ = std::make_unique<S3rver>("claims");
    ASSERT_TRUE(server_->ready()) << server_->Log();
  }

  [[nodiscard]] Options MakeOptions() const {
    Options options;
    options.store.endpoint = server_->endpoint();
    options.store.bucket = server_->bucket();
    options.store.access_key_id = testing::kS3rverAccessKey;
    options.store.secret_access_key = testing::kS3rverSecretKey;
    options.store.request_timeout = std::chrono::seconds{10};
    options.threshold = 1000;
    options.prefix = "big/";
    return options;
  }

  std::unique_ptr<S3rver> server_;
};

TEST_F(ClaimCheckS3Test, ALargePayloadIsStoredAndTheSinkGetsAReferenceTheConsumerCanFetch) {
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  const Options options = MakeOptions();
  auto sink = WrapSink(std::move(recording), options);
  const std::string big = BigPayload(5 * 1024 * 1024);
  const std::vector<Envelope> batch{MakeEnvelope("{\"small\":1}"), MakeEnvelope(big),
                                    MakeEnvelope(std::string(1000, 'x'))};
  const auto outcomes = sink->Publish(batch, In(std::chrono::seconds{20}));
  ASSERT_EQ(outcomes.size(), 3U);
  for (const auto& outcome : outcomes) {
    EXPECT_TRUE(outcome.published()) << outcome.failure->reason;
  }
  ASSERT_EQ(received->size(), 3U);
  // At or under the threshold: untouched.
  EXPECT_EQ((*received)[0].payload, batch[0].payload);
  EXPECT_EQ((*received)[2].payload, batch[2].payload);
  EXPECT_EQ((*received)[2].headers.count(std::string{kUrlHeader}), 0U);
  // Over it: a reference, the user's headers kept.
  const Envelope& reference = (*received)[1];
  EXPECT_EQ(reference.id, batch[1].id);
  EXPECT_EQ(reference.content_type, kReferenceContentType);
  EXPECT_LT(reference.payload.size(), 400U);
  const std::string url = server_->endpoint() + "/claims/big/" + batch[1].id.ToString();
  EXPECT_EQ(reference.headers.at(std::string{kUrlHeader}), url);
  EXPECT_EQ(reference.headers.at(std::string{kDataRefHeader}), url);
  EXPECT_EQ(reference.headers.at(std::string{kSizeHeader}), std::to_string(big.size()));
  EXPECT_EQ(reference.headers.at(std::string{kSha256Header}), Sha256Hex(big));
  EXPECT_EQ(reference.headers.at(std::string{kContentTypeHeader}), "application/octet-stream");
  EXPECT_EQ(reference.headers.at("correlation_id"), "c-1");
  EXPECT_NE(reference.payload.find("\"sha256\":\"" + Sha256Hex(big) + "\""), std::string::npos)
      << reference.payload;
  EXPECT_EQ(server_->Keys(), std::vector<std::string>{"big/" + batch[1].id.ToString()});

  const FetchResult fetched = FetchClaimCheck(reference.headers, options.store);
  ASSERT_TRUE(fetched.ok()) << fetched.message;
  EXPECT_TRUE(fetched.payload == big);
  EXPECT_EQ(fetched.content_type, "application/octet-stream");

  // Published again (an unknown outcome, a restart): the same object, written again.
  const Headers first_headers = reference.headers;
  received->clear();
  const auto again = sink->Publish(std::span{batch}.subspan(1, 1), In(std::chrono::seconds{20}));
  ASSERT_TRUE(again.at(0).published());
  EXPECT_EQ(server_->Keys().size(), 1U);
  EXPECT_EQ((*received)[0].headers, first_headers);
}

// What the CloudEvents envelope makes of a claim-checked message (every sink maps it through
// cloudevents::Mapper): the reference as data and datacontenttype, the URL as `dataref`; the
// claim-check-* headers are not legal attribute names and are left out.
TEST_F(ClaimCheckS3Test, TheCloudEventsEnvelopeCarriesTheReferenceAndDataref) {
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  auto sink = WrapSink(std::move(recording), MakeOptions());
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(5000))};
  ASSERT_TRUE(sink->Publish(batch, In(std::chrono::seconds{10})).at(0).published());
  const cloudevents::Mapper mapper{cloudevents::Options{}};
  std::vector<cloudevents::Attribute> attributes;
  ASSERT_FALSE(mapper.Attributes(received->at(0), attributes));
  std::map<std::string, std::string> by_name;
  for (const auto& attribute : attributes) by_name[attribute.name] = attribute.value;
  EXPECT_EQ(by_name["dataref"], received->at(0).headers.at(std::string{kUrlHeader}));
  EXPECT_EQ(by_name["datacontenttype"], kReferenceContentType);
  EXPECT_EQ(by_name["correlationid"], "c-1");
  EXPECT_EQ(by_name.count("claim-check-sha256"), 0U);
  std::string structured;
  ASSERT_FALSE(mapper.StructuredJson(received->at(0), structured));
  // Structured mode: `data` is the reference as a string (only application/json is embedded).
  EXPECT_NE(structured.find("\"data\":\"{\\\"claim_check\\\":"), std::string::npos) << structured;
  EXPECT_NE(structured.find(Sha256Hex(batch[0].payload)), std::string::npos) << structured;
}

// retention: the sink deletes the objects of its prefix older than it, and nothing else.
TEST_F(ClaimCheckS3Test, RetentionDeletesOldObjectsOfItsPrefixOnly) {
  Options keep = MakeOptions();
  keep.prefix = "keep/";
  auto keeping = WrapSink(std::make_unique<RecordingSink>(), keep);
  Options expire = MakeOptions();
  expire.prefix = "expire/";
  expire.retention = std::chrono::seconds{1};
  auto expiring = WrapSink(std::make_unique<RecordingSink>(), expire);
  const std::vector<Envelope> one{MakeEnvelope(BigPayload(2000))};
  const std::vector<Envelope> two{MakeEnvelope(BigPayload(2000))};
  ASSERT_TRUE(keeping->Publish(one, In(std::chrono::seconds{10})).at(0).published());
  ASSERT_TRUE(expiring->Publish(two, In(std::chrono::seconds{10})).at(0).published());
  EXPECT_EQ(server_->Keys().size(), 2U);
  // Swept every second (retention / 4, at least 1 s); S3 times have whole seconds.
  EXPECT_TRUE(
      testing::WaitUntil([&] { return server_->Keys().size() == 1; }, std::chrono::seconds{8}));
  EXPECT_EQ(server_->Keys(), std::vector<std::string>{"keep/" + one[0].id.ToString()});
}

TEST_F(ClaimCheckS3Test, VirtualHostUrlsWork) {
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  Options options = MakeOptions();
  options.store.endpoint = server_->virtual_host_endpoint();
  options.store.url_style = UrlStyle::kVirtualHost;
  auto sink = WrapSink(std::move(recording), options);
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(3000))};
  const auto outcomes = sink->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_TRUE(outcomes.at(0).published()) << outcomes.at(0).failure->reason;
  const std::string url = received->at(0).headers.at(std::string{kUrlHeader});
  EXPECT_EQ(url, "http://claims.s3.localhost:" + std::to_string(server_->port()) + "/big/" +
                     batch[0].id.ToString());
  EXPECT_EQ(server_->Keys().size(), 1U);
  const FetchResult fetched = FetchClaimCheck(received->at(0).headers, options.store);
  ASSERT_TRUE(fetched.ok()) << fetched.message;
  EXPECT_TRUE(fetched.payload == batch[0].payload);
}

TEST_F(ClaimCheckS3Test, AStoreThatIsDownHoldsTheMessageAndItsStreamAndNothingIsLost) {
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  auto sink = WrapSink(std::move(recording), MakeOptions());
  server_->Stop();
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(2000), "s1"), MakeEnvelope("{}", "s1"),
                                    MakeEnvelope("{}", "s2"), MakeEnvelope(BigPayload(2000), "s3")};
  const auto outcomes = sink->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_EQ(outcomes.size(), 4U);
  for (const std::size_t held : {0U, 1U, 3U}) {
    ASSERT_FALSE(outcomes[held].published()) << held;
    EXPECT_EQ(outcomes[held].failure->kind, FailureKind::kUnavailable) << held;
    EXPECT_EQ(outcomes[held].id, batch[held].id);
  }
  EXPECT_NE(outcomes[0].failure->reason.find("claim check: PUT"), std::string::npos)
      << outcomes[0].failure->reason;
  EXPECT_NE(outcomes[1].failure->reason.find("earlier message of its stream"), std::string::npos)
      << outcomes[1].failure->reason;
  EXPECT_TRUE(outcomes[2].published());
  ASSERT_EQ(received->size(), 1U);
  EXPECT_EQ(received->at(0).id, batch[2].id);
}

TEST_F(ClaimCheckS3Test, RefusedCredentialsAreUnavailableAndTheSecretIsNeverQuoted) {
  auto recording = std::make_unique<RecordingSink>();
  Options options = MakeOptions();
  options.store.access_key_id = "AKIAUNKNOWN";
  options.store.secret_access_key = "very-secret-value-1";
  auto sink = WrapSink(std::move(recording), options);
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(2000))};
  const auto outcomes = sink->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_FALSE(outcomes.at(0).published());
  EXPECT_EQ(outcomes[0].failure->kind, FailureKind::kUnavailable);
  EXPECT_NE(outcomes[0].failure->reason.find("HTTP 403 InvalidAccessKeyId"), std::string::npos)
      << outcomes[0].failure->reason;
  EXPECT_EQ(outcomes[0].failure->reason.find("very-secret"), std::string::npos);
  EXPECT_TRUE(server_->Keys().empty());
}

TEST_F(ClaimCheckS3Test, FetchClaimCheckSaysClearlyWhatIsWrong) {
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  const Options options = MakeOptions();
  auto sink = WrapSink(std::move(recording), options);
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(4096))};
  ASSERT_TRUE(sink->Publish(batch, In(std::chrono::seconds{10})).at(0).published());
  const Headers good = received->at(0).headers;

  EXPECT_EQ(FetchClaimCheck(Headers{{"correlation_id", "c"}}, options.store).error,
            FetchError::kNotClaimChecked);
  Headers changed = good;
  changed[std::string{kSha256Header}] = Sha256Hex("something else");
  FetchResult result = FetchClaimCheck(changed, options.store);
  EXPECT_EQ(result.error, FetchError::kDigestMismatch) << result.message;
  EXPECT_NE(result.message.find("SHA-256"), std::string::npos) << result.message;
  changed = good;
  changed[std::string{kSizeHeader}] = "4095";
  result = FetchClaimCheck(changed, options.store);
  EXPECT_EQ(result.error, FetchError::kSizeMismatch) << result.message;
  EXPECT_NE(result.message.find("4096 bytes, the message says 4095"), std::string::npos)
      << result.message;
  changed = good;
  changed[std::string{kSizeHeader}] = "12x";
  EXPECT_EQ(FetchClaimCheck(changed, options.store).error, FetchError::kMalformed);
  changed = good;
  changed.erase(std::string{kSha256Header});
  EXPECT_EQ(FetchClaimCheck(changed, options.store).error, FetchError::kMalformed);
  changed = good;
  changed[std::string{kUrlHeader}] = server_->endpoint() + "/claims/big/no-such-object";
  result = FetchClaimCheck(changed, options.store);
  EXPECT_EQ(result.error, FetchError::kMissing) << result.message;
  EXPECT_NE(result.message.find("no such object"), std::string::npos) << result.message;
  // Not an object of the consumer's store: not fetched (its credentials are not sent elsewhere).
  changed[std::string{kUrlHeader}] = "http://attacker.example/claims/big/x";
  result = FetchClaimCheck(changed, options.store);
  EXPECT_EQ(result.error, FetchError::kMalformed) << result.message;
  StoreOptions wrong = options.store;
  wrong.access_key_id = "AKIAUNKNOWN";
  EXPECT_EQ(FetchClaimCheck(good, wrong).error, FetchError::kDenied);
  server_->Stop();
  result = FetchClaimCheck(good, options.store);
  EXPECT_EQ(result.error, FetchError::kUnavailable) << result.message;
}

// A Python with botocore (the AWS SDK's core) for sigv4_s3.py, or "" when there is none.
std::string PythonWithBotocore() {
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    if (std::system((std::string{python} + " -c 'import botocore' >/dev/null 2>&1").c_str()) == 0) {
      return python;
    }
  }
  return {};
}

// s3rver does not verify signatures: sigv4_s3.py does, with botocore's signer, as AWS would.
class ClaimCheckSigV4Test : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    const std::string python = PythonWithBotocore();
    if (python.empty()) GTEST_SKIP() << "no python3 with botocore (Debian: python3-botocore)";
    port_ = testing::FreePort();
    log_ = ::testing::TempDir() + "sigv4_s3-" + std::to_string(port_) + ".log";
    std::vector<std::string> argv{"/usr/bin/env",
                                  python,
                                  std::string{OUTBOX_SOURCE_DIR} + "/tests/claim_check/sigv4_s3.py",
                                  std::to_string(port_),
                                  "AKIDEXAMPLE",
                                  "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    server_ = std::make_unique<testing::ChildProcess>(
        argv, log_, testing::Ready::LogLine("sigv4_s3 listening"));
    ASSERT_TRUE(server_->WaitReady(std::chrono::seconds{20}));
  }
  void TearDown() override {
    if (server_) server_->Stop(SIGTERM, std::chrono::seconds{5});
    std::remove(log_.c_str());
  }
  [[nodiscard]] Options MakeOptions() const {
    Options options;
    options.store.endpoint = "http://127.0.0.1:" + std::to_string(port_);
    options.store.bucket = "signed";
    options.store.region = "eu-west-1";
    options.store.access_key_id = "AKIDEXAMPLE";
    options.store.secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY";
    options.threshold = 100;
    return options;
  }
  int port_ = 0;
  std::string log_;
  std::unique_ptr<testing::ChildProcess> server_;
};

TEST_F(ClaimCheckSigV4Test, UploadsAndFetchesAreSignedAsAwsChecksAndAWrongSecretIsRefused) {
  Start();
  if (IsSkipped()) return;
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  const Options options = MakeOptions();
  auto sink = WrapSink(std::move(recording), options);
  // Over 1 MiB: libcurl asks with Expect: 100-continue first.
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(2 * 1024 * 1024))};
  const auto outcomes = sink->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_TRUE(outcomes.at(0).published()) << outcomes.at(0).failure->reason;
  const FetchResult fetched = FetchClaimCheck(received->at(0).headers, options.store);
  ASSERT_TRUE(fetched.ok()) << fetched.message;
  EXPECT_TRUE(fetched.payload == batch[0].payload);

  Options wrong = options;
  wrong.store.secret_access_key = "not-the-secret-0000";
  auto refused = WrapSink(std::make_unique<RecordingSink>(), wrong)
                     ->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_FALSE(refused.at(0).published());
  EXPECT_NE(refused[0].failure->reason.find("HTTP 403 SignatureDoesNotMatch"), std::string::npos)
      << refused[0].failure->reason;
  EXPECT_EQ(refused[0].failure->reason.find("not-the-secret"), std::string::npos);
  const FetchResult denied = FetchClaimCheck(received->at(0).headers, wrong.store);
  EXPECT_EQ(denied.error, FetchError::kDenied) << denied.message;
}

TEST_F(ClaimCheckSigV4Test, ASessionTokenIsSentAndSigned) {
  Start({"session-token-1234"});
  if (IsSkipped()) return;
  Options options = MakeOptions();
  options.store.session_token = "session-token-1234";
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(1000))};
  auto outcomes = WrapSink(std::make_unique<RecordingSink>(), options)
                      ->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_TRUE(outcomes.at(0).published()) << outcomes.at(0).failure->reason;
  options.store.session_token = "session-token-other";
  outcomes = WrapSink(std::make_unique<RecordingSink>(), options)
                 ->Publish(batch, In(std::chrono::seconds{10}));
  ASSERT_FALSE(outcomes.at(0).published());
  EXPECT_NE(outcomes[0].failure->reason.find("InvalidToken"), std::string::npos)
      << outcomes[0].failure->reason;
}

TEST_F(ClaimCheckSigV4Test, TheRetentionSweepsListingIsSignedAsAwsChecks) {
  Start();
  if (IsSkipped()) return;
  auto recording = std::make_unique<RecordingSink>();
  const auto received = recording->received;
  Options options = MakeOptions();
  options.prefix = "sweep/me/";  // a '/' in the query: encoded as %2F, as AWS signs it
  options.retention = std::chrono::seconds{1};
  auto sink = WrapSink(std::move(recording), options);
  const std::vector<Envelope> batch{MakeEnvelope(BigPayload(1000))};
  ASSERT_TRUE(sink->Publish(batch, In(std::chrono::seconds{10})).at(0).published());
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        return FetchClaimCheck(received->at(0).headers, options.store).error ==
               FetchError::kMissing;
      },
      std::chrono::seconds{8}));
}

}  // namespace
}  // namespace outbox::claim_check
