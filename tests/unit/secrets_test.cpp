#include "outbox/core/secrets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "conninfo_mask.h"
#include "outbox/core/log_text.h"
#include "outbox/sink/sink.h"

namespace outbox {
namespace {

bool Has(const std::vector<std::string>& forms, const std::string& form) {
  return std::find(forms.begin(), forms.end(), form) != forms.end();
}

// Installs `secrets` as the process's for one test, and none again after it.
class Installed {
 public:
  explicit Installed(std::vector<std::string> secrets) {
    InstallKnownSecrets(std::make_shared<const SecretRedactor>(std::move(secrets)));
  }
  ~Installed() { InstallKnownSecrets(nullptr); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;
};

TEST(SecretRedactorTest, WithoutSecretsTextStaysAsItIs) {
  const SecretRedactor none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.Redact(""), "");
  EXPECT_EQ(none.Redact("400 invalid credentials: Bearer HEADERSECRET77"),
            "400 invalid credentials: Bearer HEADERSECRET77");
  const SecretRedactor empty_strings{{"", ""}};
  EXPECT_TRUE(empty_strings.empty());
  EXPECT_EQ(empty_strings.Redact("anything"), "anything");
}

TEST(SecretRedactorTest, TheIssuesCase) {
  const SecretRedactor redactor{HeaderSecretForms("Bearer HEADERSECRET77")};
  EXPECT_EQ(redactor.Redact("HTTP 400: invalid credentials: Bearer HEADERSECRET77"),
            "HTTP 400: invalid credentials: ***");
  // The credential alone, without its scheme, too.
  EXPECT_EQ(redactor.Redact("token HEADERSECRET77 refused"), "token *** refused");
}

TEST(SecretRedactorTest, ShorterThanEightBytesIsNotRedacted) {
  const SecretRedactor redactor{{"guest", "1234567", "12345678"}};
  EXPECT_EQ(redactor.secrets(), std::vector<std::string>{"12345678"});
  EXPECT_EQ(redactor.Redact("guest 1234567 12345678"), "guest 1234567 ***");
  EXPECT_EQ(redactor.Redact("1234567"), "1234567");  // shorter than any secret
}

TEST(SecretRedactorTest, EveryOccurrenceIsRedacted) {
  const SecretRedactor redactor{{"s3cr3t-pw"}};
  EXPECT_EQ(redactor.Redact("s3cr3t-pw and s3cr3t-pw, s3cr3t-pws3cr3t-pw!"), "*** and ***, ***!");
  EXPECT_EQ(redactor.Redact("s3cr3t-pw"), "***");
}

TEST(SecretRedactorTest, OverlappingSecretsLeaveNoByteOfEither) {
  // Longest first is not enough on its own: "abcdefgh12" found first would leave "345678" of the
  // second. Every byte of every occurrence goes, one "***" per run.
  const SecretRedactor redactor{{"abcdefgh12", "gh12345678", "abcdefgh"}};
  EXPECT_EQ(redactor.secrets().front().size(), 10U);
  EXPECT_EQ(redactor.Redact("x abcdefgh12345678 y"), "x *** y");
  // One secret inside another.
  const SecretRedactor nested{{"password", "my-password-1"}};
  EXPECT_EQ(nested.Redact("my-password-1 / password"), "*** / ***");
  // A secret overlapping itself ("aaaaaaaa" in nine a's).
  const SecretRedactor repeated{{"aaaaaaaa"}};
  EXPECT_EQ(repeated.Redact("[aaaaaaaaa]"), "[***]");
  // Duplicates are kept once.
  EXPECT_EQ(SecretRedactor({"same-secret", "same-secret"}).secrets().size(), 1U);
}

TEST(SecretRedactorTest, Utf8AroundASecretStaysValid) {
  const SecretRedactor redactor{{"pässwörd-1", "ascii-secret"}};
  EXPECT_EQ(redactor.Redact("é«ascii-secret»€"), "é«***»€");
  EXPECT_EQ(redactor.Redact("\xf0\x9f\x98\x80pässwörd-1\xf0\x9f\x98\x80"),
            "\xf0\x9f\x98\x80***\xf0\x9f\x98\x80");
  // Bytes are compared as they are: another case or encoding is another text.
  EXPECT_EQ(redactor.Redact("ASCII-SECRET"), "ASCII-SECRET");
  // Invalid UTF-8 and NUL bytes around it do not matter.
  EXPECT_EQ(redactor.Redact(std::string{"\xff\0ascii-secret\0\xfe", 16}),
            std::string("\xff\0***\0\xfe", 7));
}

TEST(SecretRedactorTest, ACutTextLosesTheStartOfASecretAtItsEnd) {
  const SecretRedactor redactor{{"eyJhbGciOiJIUzI1NiJ9.long-token"}};
  const std::string cut = "invalid token eyJhbGciOiJIUzI1";  // the answer's start, cut there
  EXPECT_EQ(redactor.Redact(cut, /*cut=*/true), "invalid token ***");
  EXPECT_EQ(redactor.Redact(cut), cut);  // not cut: only whole secrets
  // Fewer than 8 bytes of it at the end are left (too short to say anything).
  EXPECT_EQ(redactor.Redact("invalid token eyJhbGc", true), "invalid token eyJhbGc");
}

TEST(SecretFormsTest, HeaderValues) {
  const auto bearer = HeaderSecretForms("Bearer HEADERSECRET77");
  EXPECT_TRUE(Has(bearer, "Bearer HEADERSECRET77"));
  EXPECT_TRUE(Has(bearer, "HEADERSECRET77"));
  // Basic: the base64, the decoded user:password and the password alone.
  const auto basic = HeaderSecretForms("Basic YWRtaW46QkFTSUNQQVNTNTU=");  // admin:BASICPASS55
  EXPECT_TRUE(Has(basic, "YWRtaW46QkFTSUNQQVNTNTU="));
  EXPECT_TRUE(Has(basic, "admin:BASICPASS55"));
  EXPECT_TRUE(Has(basic, "BASICPASS55"));
  EXPECT_TRUE(Has(HeaderSecretForms("basic YWRtaW46QkFTSUNQQVNTNTU"), "BASICPASS55"));
  // Not base64: no decoded form, nothing thrown.
  EXPECT_EQ(HeaderSecretForms("Basic ***not base64***").size(), 2U);
  // A plain value (an API key) is itself.
  EXPECT_EQ(HeaderSecretForms("k-123456789"), std::vector<std::string>{"k-123456789"});
  EXPECT_EQ(HeaderSecretForms(""), std::vector<std::string>{""});
}

TEST(SecretFormsTest, UrlUserInfo) {
  const auto forms = UrlSecretForms("http://relay:p%40ss-word99@127.0.0.1:8080/hooks/{topic}");
  EXPECT_TRUE(Has(forms, "p%40ss-word99"));
  EXPECT_TRUE(Has(forms, "p@ss-word99"));
  EXPECT_TRUE(Has(forms, "relay:p@ss-word99"));
  EXPECT_TRUE(Has(forms, "cmVsYXk6cEBzcy13b3JkOTk="));  // base64("relay:p@ss-word99"): Basic
  EXPECT_TRUE(UrlSecretForms("http://127.0.0.1/a@b").empty());  // '@' in the path
  EXPECT_TRUE(UrlSecretForms("amqp://guest@host").empty());     // a user is no secret...
  EXPECT_TRUE(
      Has(UrlSecretForms("nats://tok-123456789@host", true), "tok-123456789"));  // ...a token
  EXPECT_TRUE(UrlSecretForms("not a url").empty());
  EXPECT_TRUE(UrlSecretForms("").empty());
  EXPECT_TRUE(Has(UrlSecretForms("redis://:redis-pass-1@h:6379"), "redis-pass-1"));
}

TEST(SecretFormsTest, PostgresConnectionStrings) {
  EXPECT_TRUE(Has(postgres::ConninfoSecrets("postgresql://u:pg%2Dpass-1@h/db"), "pg-pass-1"));
  EXPECT_TRUE(Has(postgres::ConninfoSecrets("postgresql://u:pg%2Dpass-1@h/db"), "pg%2Dpass-1"));
  const auto key_value = postgres::ConninfoSecrets("host=h password='it\\'s a secret' dbname=x");
  EXPECT_TRUE(Has(key_value, "it's a secret")) << key_value.size();
  EXPECT_TRUE(postgres::ConninfoSecrets("host=h dbname=x").empty());
  EXPECT_TRUE(postgres::ConninfoSecrets("host='unterminated").empty());
}

// Both paths of the relay call the same redactor: the log sanitizer and the outcomes' reasons.
TEST(KnownSecretsTest, LogLinesAndReasonsAreRedacted) {
  EXPECT_EQ(RedactKnownSecrets("Bearer HEADERSECRET77"), "Bearer HEADERSECRET77");  // none yet
  const Installed installed{HeaderSecretForms("Bearer HEADERSECRET77")};
  EXPECT_EQ(RedactKnownSecrets("x HEADERSECRET77"), "x ***");
  // Redacted before escaping and cutting, so neither can break one up.
  EXPECT_EQ(SanitizeForLog("a\nHEADERSECRET77\n"), "a\\n***\\n");
  EXPECT_EQ(SanitizeForLog("0123456789HEADERSECRET77", 12), "0123456789** …(1 bytes cut)");
  EXPECT_EQ(BoundForLog("HEADERSECRET77"), "***");
  std::vector<PublishOutcome> outcomes(2);
  outcomes[1].failure = Failure{FailureKind::kPermanent, "HTTP 400: Bearer HEADERSECRET77"};
  outcomes = RedactReasons(std::move(outcomes));
  EXPECT_FALSE(outcomes[0].failure.has_value());
  EXPECT_EQ(outcomes[1].failure->reason, "HTTP 400: ***");
}

}  // namespace
}  // namespace outbox
