// The [sinks.<name>.claim_check] table (claim_check_type.h): keys read, defaults, credentials from
// the file, the environment or a file, secrets masked, and a clear error naming the key for each
// bad value. No server.

#include "outbox/sink/claim_check_type.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "outbox/core/error.h"
#include "outbox/sink/file_type.h"

namespace outbox::claim_check {
namespace {

using Environment = std::map<std::string, std::string>;

constexpr std::string_view kValid =
    "endpoint = \"https://s3.eu-west-1.amazonaws.com\"\nbucket = \"orders-payloads\"\n"
    "access_key_id = \"AKIAEXAMPLE\"\nsecret_access_key = \"s3cr3t-value-xyz\"\n";

std::optional<Options> Read(const std::string& body, Environment env = {}) {
  std::istringstream stream("[sinks.events.claim_check]\n" + body);
  const config::TomlValue root =
      toml::parse<toml::discard_comments, std::map, std::vector>(stream, "test.toml");
  const config::Section table{&root.at("sinks").at("events").at("claim_check"),
                              "sinks.events.claim_check"};
  const config::GetenvFn getenv = [env = std::move(env)](const char* name) -> const char* {
    const auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  };
  return ReadOptions(table, "events", getenv);
}

std::pair<std::string, std::string> Error(const std::string& body, Environment env = {}) {
  try {
    Read(body, std::move(env));
  } catch (const ConfigError& error) {
    return {error.key(), error.what()};
  }
  ADD_FAILURE() << "no ConfigError for:\n" << body;
  return {};
}

std::string Describe(const Options& options) {
  config::TomlWriter out;
  DescribeOptions(out, options);
  return out.Take();
}

TEST(ClaimCheckTypeTest, ReadsTheTableWithItsDefaults) {
  const auto options = Read(std::string{kValid});
  ASSERT_TRUE(options);
  EXPECT_EQ(options->store.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(options->store.bucket, "orders-payloads");
  EXPECT_EQ(options->store.region, "us-east-1");
  EXPECT_EQ(options->store.url_style, UrlStyle::kPath);
  EXPECT_EQ(options->prefix, "outbox/");
  EXPECT_EQ(options->threshold, 256U * 1024U);
  EXPECT_EQ(options->store.secret_access_key, "s3cr3t-value-xyz");
  const std::string described = Describe(*options);
  EXPECT_NE(described.find("secret_access_key = \"***\"\n"), std::string::npos) << described;
  EXPECT_EQ(described.find("s3cr3t"), std::string::npos) << described;
  EXPECT_NE(described.find("threshold = 262144\n"), std::string::npos) << described;

  const auto all = Read(std::string{kValid} +
                        "region = \"eu-west-1\"\nurl_style = \"virtual\"\nprefix = \"big/\"\n"
                        "threshold = 1000\nconnect_timeout = \"2s\"\nrequest_timeout = \"9s\"\n");
  ASSERT_TRUE(all);
  EXPECT_EQ(all->store.url_style, UrlStyle::kVirtualHost);
  EXPECT_EQ(all->threshold, 1000U);
  EXPECT_EQ(all->store.request_timeout, std::chrono::seconds{9});
  EXPECT_EQ(ObjectUrl(all->store, "big/k"),
            "https://orders-payloads.s3.eu-west-1.amazonaws.com/big/k");
  EXPECT_EQ(ObjectUrl(options->store, "outbox/k"),
            "https://s3.eu-west-1.amazonaws.com/orders-payloads/outbox/k");
  EXPECT_FALSE(Read(std::string{kValid} + "enabled = false\n"));
  EXPECT_EQ(options->retention, std::chrono::milliseconds{0}) << "no sweep unless asked";
  EXPECT_NE(described.find("retention = \"0s\"\n"), std::string::npos) << described;
  EXPECT_EQ(Read(std::string{kValid} + "retention = \"7d\"\n")->retention, std::chrono::hours{168});
}

TEST(ClaimCheckTypeTest, BadValuesAreRefusedNamingTheKey) {
  const std::string base = std::string{kValid};
  auto [key, message] = Error(base + "threshold = \"big\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.threshold") << message;
  std::tie(key, message) = Error(base + "threshold = 0\n");
  EXPECT_EQ(key, "sinks.events.claim_check.threshold") << message;
  std::tie(key, message) = Error(
      "endpoint = \"http://127.0.0.1:9000\"\naccess_key_id = \"a\"\nsecret_access_key = \"b\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.bucket") << message;
  EXPECT_NE(message.find("is required"), std::string::npos) << message;
  const std::string no_bucket =
      "endpoint = \"http://127.0.0.1:9000\"\naccess_key_id = \"a\"\n"
      "secret_access_key = \"s3cr3t-value-xyz\"\n";
  std::tie(key, message) = Error(no_bucket + "bucket = \"Orders_Payloads\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.bucket") << message;
  const std::string no_endpoint =
      "bucket = \"claims\"\naccess_key_id = \"a\"\nsecret_access_key = \"s3cr3t-value-xyz\"\n";
  for (const char* endpoint : {"ftp://s3.example.com", "s3.example.com", "https://",
                               "https://s3.example.com/bucket", "https://user:pw@s3.example.com"}) {
    std::tie(key, message) = Error(no_endpoint + "endpoint = \"" + endpoint + "\"\n");
    EXPECT_EQ(key, "sinks.events.claim_check.endpoint") << endpoint << ": " << message;
    EXPECT_EQ(message.find("pw@"), std::string::npos) << message;
  }
  std::tie(key, message) = Error(base + "url_style = \"vhost\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.url_style") << message;
  std::tie(key, message) = Error(base + "prefix = \"a b/\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.prefix") << message;
  std::tie(key, message) = Error(base + "retention = \"1d\"\nprefix = \"\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.retention") << message;
  EXPECT_NE(message.find("needs a prefix"), std::string::npos) << message;
  std::tie(key, message) = Error(base + "retention = 7\n");
  EXPECT_EQ(key, "sinks.events.claim_check.retention") << message;
  std::tie(key, message) = Error(base + "region = \"\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.region") << message;
  std::tie(key, message) = Error(base + "treshold = 10\n");
  EXPECT_EQ(key, "sinks.events.claim_check.treshold") << message;
  std::tie(key, message) = Error(base + "ca_file = \"/nonexistent/ca.pem\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.ca_file") << message;
  // No error quotes the secret.
  std::tie(key, message) = Error(no_bucket + "bucket = \"x\"\n");
  EXPECT_EQ(message.find("s3cr3t"), std::string::npos) << message;
}

TEST(ClaimCheckTypeTest, CredentialsComeFromTheFileTheEnvironmentOrAFile) {
  const std::string store = "endpoint = \"http://127.0.0.1:9000\"\nbucket = \"claims\"\n";
  // None anywhere: the key id is asked for, and the AWS variables are named.
  auto [key, message] = Error(store);
  EXPECT_EQ(key, "sinks.events.claim_check.access_key_id") << message;
  EXPECT_NE(message.find("AWS_ACCESS_KEY_ID"), std::string::npos) << message;
  std::tie(key, message) = Error(store + "access_key_id = \"a\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.secret_access_key") << message;
  EXPECT_NE(message.find("OUTBOX_SINK_EVENTS_CLAIM_CHECK_SECRET_ACCESS_KEY"), std::string::npos)
      << message;

  // The AWS tools' variables, all three.
  auto options = Read(store, {{"AWS_ACCESS_KEY_ID", "AKIAENV"},
                              {"AWS_SECRET_ACCESS_KEY", "env-secret-123"},
                              {"AWS_SESSION_TOKEN", "env-token-456"}});
  ASSERT_TRUE(options);
  EXPECT_EQ(options->store.access_key_id, "AKIAENV");
  EXPECT_EQ(options->store.secret_access_key, "env-secret-123");
  EXPECT_EQ(options->store.session_token, "env-token-456");
  EXPECT_EQ(Describe(*options).find("env-"), std::string::npos) << Describe(*options);

  // The sink's own variable wins over the file.
  options = Read(store + "access_key_id = \"a\"\nsecret_access_key = \"from-file\"\n",
                 {{"OUTBOX_SINK_EVENTS_CLAIM_CHECK_SECRET_ACCESS_KEY", "from-env-789"}});
  ASSERT_TRUE(options);
  EXPECT_EQ(options->store.secret_access_key, "from-env-789");

  // A file holding the secret (its trailing newline dropped).
  const std::string path = ::testing::TempDir() + "claim-check-secret";
  { std::ofstream(path) << "file-secret-000\n"; }
  options = Read(store + "access_key_id = \"a\"\nsecret_access_key_file = \"" + path + "\"\n");
  ASSERT_TRUE(options);
  EXPECT_EQ(options->store.secret_access_key, "file-secret-000");
  std::tie(key, message) = Error(store + "access_key_id = \"a\"\nsecret_access_key = \"x\"\n" +
                                 "secret_access_key_file = \"" + path + "\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.secret_access_key_file") << message;
  std::tie(key, message) =
      Error(store + "access_key_id = \"a\"\nsecret_access_key_file = \"/nonexistent/key\"\n");
  EXPECT_EQ(key, "sinks.events.claim_check.secret_access_key_file") << message;
  std::remove(path.c_str());
}

TEST(ClaimCheckTypeTest, TheWrappedSettingsDescribeBothTablesAndGiveTheSecretsToTheRedactor) {
  std::istringstream stream("[sinks.events]\ntype = \"file\"\npath = \"-\"\n");
  const config::TomlValue root =
      toml::parse<toml::discard_comments, std::map, std::vector>(stream, "test.toml");
  const config::GetenvFn no_env = [](const char*) -> const char* { return nullptr; };
  auto inner = file::Type().parse(config::Section{&root.at("sinks").at("events"), "sinks.events"},
                                  "events", no_env);
  auto options = Read(std::string{kValid} + "session_token = \"token-abcdef\"\n");
  ASSERT_TRUE(options);
  const auto settings = WithClaimCheck(std::move(inner), "events", *options);
  config::TomlWriter out;
  settings->Describe(out);
  const std::string described = out.Take();
  EXPECT_NE(described.find("path = \"-\"\n"), std::string::npos) << described;
  EXPECT_NE(described.find("\n[sinks.events.claim_check]\nendpoint = "), std::string::npos)
      << described;
  EXPECT_EQ(described.find("s3cr3t"), std::string::npos) << described;
  EXPECT_EQ(described.find("token-abcdef"), std::string::npos) << described;
  const auto secrets = settings->Secrets();
  EXPECT_NE(std::find(secrets.begin(), secrets.end(), "s3cr3t-value-xyz"), secrets.end());
  EXPECT_NE(std::find(secrets.begin(), secrets.end(), "token-abcdef"), secrets.end());
}

}  // namespace
}  // namespace outbox::claim_check
