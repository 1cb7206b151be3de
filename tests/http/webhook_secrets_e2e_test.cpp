// Issue #39 (3), known secrets never leave: outboxd end to end (real PostgreSQL, the real binary)
// into a webhook_receiver.py that answers every request 400 and quotes in its body what it got
// (the request's Authorization and other configured headers, echoed as they arrived) and what it
// knows besides (the webhook signing secret, a Basic credential decoded, a URL's password as
// written and decoded), as an endpoint that says "400 invalid credentials: Bearer <token>" does.
// A 400 is permanent: each message is abandoned at once with the answer in its reason.
//
// Then no configured secret of 8 bytes or more shows in any message's last_error, in /api/outbox
// (recent errors), /api/messages (list and each message) or outboxd's log, each of which must
// show "***" where it was; and a header value shorter than 8 bytes, which is not redacted (the
// documented minimum), does show: the answers did reach the reasons.
//
// Three sinks, one per kind of credential: `bearer` (Authorization: Bearer, an API key header, a
// signing secret), `basic` (user:password in the URL, which libcurl sends as Basic
// authentication), `basichdr` (a configured Authorization: Basic header).

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "http_test_support.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kBearerToken = "HEADERSECRET77";
constexpr const char* kApiKey = "apikey-VALUE-1234";
constexpr const char* kShortHeader = "short7!";  // 7 bytes: not redacted
constexpr const char* kUrlUser = "relayuser";
constexpr const char* kUrlPasswordWritten = "URLPASS%2Fword99";
constexpr const char* kUrlPassword = "URLPASS/word99";
constexpr const char* kHeaderBasicUser = "admin";
constexpr const char* kHeaderBasicPassword = "HDRBASICPW66";
constexpr const char* kApiToken = "api-token-SECRET-42";

// A plan of `answers` (JSON objects without braces), each a 400.
std::string Plan(const std::vector<std::string>& answers) {
  std::string plan = R"({"plan": [)";
  for (std::size_t i = 0; i < answers.size(); ++i) {
    plan += (i == 0 ? "" : ", ") + std::string{R"({"status": 400, )"} + answers[i] + "}";
  }
  return plan + "]}";
}

std::string JsonString(const std::string& text) { return "\"" + text + "\""; }

class WebhookSecretsE2eTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!config_.empty()) {
      std::remove(config_.c_str());
      std::remove((config_ + ".log").c_str());
    }
  }

  std::string Log() {
    std::ifstream in(config_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  std::string Api(const std::string& path) {
    const HttpAnswer answer =
        HttpRequest("GET", "http://127.0.0.1:" + std::to_string(api_port_) + path, "",
                    {{"Authorization", std::string{"Bearer "} + kApiToken}});
    EXPECT_EQ(answer.status, 200) << path << ": " << answer.body;
    return answer.body;
  }

  TestSchema schema_;
  std::string config_;
  int api_port_ = FreePort();
};

TEST_F(WebhookSecretsE2eTest, NoConfiguredSecretInLogLastErrorOrApi) {
  const std::string signing_secret = NewSecret();
  const std::string signing_key = signing_secret.substr(6);  // the base64 after "whsec_"
  const std::string url_basic = std::string{kUrlUser} + ":" + kUrlPassword;
  const std::string header_basic = std::string{kHeaderBasicUser} + ":" + kHeaderBasicPassword;

  // Every form the relay must redact (each at least 8 bytes).
  const std::vector<std::string> secrets = {kBearerToken,
                                            kApiKey,
                                            signing_secret,
                                            signing_key,
                                            kUrlPassword,
                                            kUrlPasswordWritten,
                                            url_basic,
                                            Base64Encode(url_basic),
                                            kHeaderBasicPassword,
                                            header_basic,
                                            Base64Encode(header_basic),
                                            kApiToken};

  WebhookReceiver receiver;  // checks no signatures: two of the sinks sign nothing
  const std::string echo_authorization = R"("echo_headers": ["authorization"])";
  receiver.CreateDestination(
      "sec-bearer", Plan({R"("body": "invalid credentials:", )" + echo_authorization,
                          R"("body": "unknown key", "echo_headers": ["x-api-key", "x-short"])",
                          R"("body": )" + JsonString(std::string{"token "} + kBearerToken +
                                                     " expired; signing secret " + signing_secret +
                                                     " (key " + signing_key + ")")}));
  receiver.CreateDestination(
      "sec-basic",
      Plan({R"("body": "who is this?", )" + echo_authorization,
            R"("body": )" + JsonString("user " + url_basic + " password " + kUrlPassword +
                                       " as written " + kUrlPasswordWritten)}));
  receiver.CreateDestination(
      "sec-basichdr", Plan({R"("body": "who is this?", )" + echo_authorization,
                            R"("body": )" + JsonString("decoded " + header_basic + ", password " +
                                                       kHeaderBasicPassword)}));

  const std::string base = "127.0.0.1:" + std::to_string(receiver.port());
  config_ = "/tmp/outboxd-webhook-secrets-" + schema_.name() + ".toml";
  std::ofstream(config_) << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema_.name()
                         << "\"\n"
                         << R"([relay]
instance = "secrets-e2e"
sweep_interval = "100ms"
[sinks.bearer]
type = "http"
url = "http://)" << base << R"(/hooks/{topic}"
secrets = [")" << signing_secret
                         << R"("]
headers = { Authorization = "Bearer )"
                         << kBearerToken << R"(", X-Api-Key = ")" << kApiKey << R"(", X-Short = ")"
                         << kShortHeader << R"(" }
[sinks.basic]
type = "http"
url = "http://)" << kUrlUser
                         << ":" << kUrlPasswordWritten << "@" << base << R"(/hooks/{topic}"
[sinks.basichdr]
type = "http"
url = "http://)" << base << R"(/hooks/{topic}"
headers = { Authorization = "Basic )"
                         << Base64Encode(header_basic) << R"(" }
[http]
listen = "127.0.0.1:)" << api_port_
                         << "\"\ntoken = \"" << kApiToken << "\"\n";

  // Enqueued before outboxd starts: it finds them at once.
  const std::vector<std::pair<std::string, int>> targets = {
      {"bearer", 3}, {"basic", 2}, {"basichdr", 2}};
  int total = 0;
  for (const auto& [target, count] : targets) {
    for (int i = 0; i < count; ++i, ++total) {
      Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('sec-" + target + "', '{\"n\": " +
                              std::to_string(total) + "}'::jsonb, target => '" + target + "')");
    }
  }

  ChildProcess outboxd({OUTBOXD_PATH, "--config", config_}, config_ + ".log");
  const auto abandoned = [&] {
    return std::stoi(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                                ".messages WHERE status = 'abandoned'"));
  };
  ASSERT_TRUE(WaitUntil([&] { return abandoned() == total; }, seconds{30}, milliseconds{100}))
      << abandoned() << " of " << total << " abandoned; log:\n"
      << Log();

  // What each place shows.
  std::vector<std::pair<std::string, std::string>> shown;  // (where, text)
  const std::string errors =
      Scalar(schema_.conn(), "SELECT string_agg(last_error, E'\\n' ORDER BY id) FROM " +
                                 schema_.name() + ".messages");
  shown.emplace_back("last_error", errors);
  const std::string list = Api("/api/messages?status=abandoned&limit=100");
  shown.emplace_back("/api/messages", list);
  const std::string ids =
      Scalar(schema_.conn(),
             "SELECT string_agg(id::text, ' ' ORDER BY id) FROM " + schema_.name() + ".messages");
  for (std::size_t at = 0; at < ids.size();) {
    const std::size_t end = std::min(ids.find(' ', at), ids.size());
    const std::string id = ids.substr(at, end - at);
    shown.emplace_back("/api/messages/" + id, Api("/api/messages/" + id));
    at = end + 1;
  }
  // The relay records failures that spend an attempt as recent errors.
  ASSERT_TRUE(WaitUntil([&] { return Api("/api/outbox").find("HTTP 400") != std::string::npos; },
                        seconds{10}, milliseconds{100}));
  shown.emplace_back("/api/outbox", Api("/api/outbox"));
  outboxd.Signal(SIGTERM);
  EXPECT_EQ(outboxd.Wait(seconds{15}), 0);
  shown.emplace_back("outboxd's log", Log());

  for (const auto& [where, text] : shown) {
    for (const std::string& secret : secrets) {
      EXPECT_EQ(text.find(secret), std::string::npos) << secret << " in " << where << ":\n" << text;
    }
    EXPECT_NE(text.find("***"), std::string::npos) << where << ":\n" << text;
  }
  // Every answer's reason is there, redacted, and the short header value (not a secret by the
  // rule) too: the echo reached the reason.
  for (const std::string& expected :
       {std::string{"invalid credentials: authorization=***"}, std::string{"x-api-key=***"},
        std::string{"x-short="} + kShortHeader,
        std::string{"token *** expired; signing secret *** (key ***)"},
        // The URL's user info goes as Basic: its base64 is redacted, the scheme stays.
        std::string{"who is this? authorization=Basic ***"},
        // A configured Basic header is redacted whole.
        std::string{"who is this? authorization=***"},
        std::string{"user *** password *** as written ***"},
        std::string{"decoded ***, password ***"}}) {
    EXPECT_NE(errors.find(expected), std::string::npos) << expected << " not in:\n" << errors;
  }
}

}  // namespace
}  // namespace outbox::testing
