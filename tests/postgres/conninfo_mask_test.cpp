// MaskConninfo (src/store/postgres/conninfo_mask.h): every form of connection string libpq reads,
// masked by libpq's own parse. No server: runs in the unit tier.
#include "conninfo_mask.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outbox::postgres {
namespace {

// The options libpq reads from `conninfo` (only those given).
std::map<std::string, std::string> Options(const std::string& conninfo) {
  std::map<std::string, std::string> options;
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &error);
  if (parsed == nullptr) {
    PQfreemem(error);
    return {{"error", "unparseable"}};
  }
  for (PQconninfoOption* option = parsed; option->keyword != nullptr; ++option) {
    if (option->val != nullptr) options[option->keyword] = option->val;
  }
  PQconninfoFree(parsed);
  return options;
}

TEST(MaskConninfoTest, LeavesAStringWithoutSecretsAsItIs) {
  for (const char* conninfo :
       {"postgresql://outbox@db/app", "postgresql://db:5432/app?sslmode=require",
        "postgres://[::1]:5432/app", "host=db user=app dbname=app", "", "postgresql://",
        "postgresql://db/a\x7f", "postgresql://u:@db/app"}) {
    EXPECT_EQ(MaskConninfo(conninfo), conninfo);
  }
}

// Each conninfo masked as expected.
struct Case {
  std::string_view conninfo;
  std::string masked;
};
void ExpectMasked(std::initializer_list<Case> cases) {
  for (const Case& masking : cases) {
    EXPECT_EQ(MaskConninfo(masking.conninfo), masking.masked) << masking.conninfo;
  }
}

// The reason given for a string that is not shown.
constexpr std::string_view kEncodeHint =
    "; in a URI, a user name or password must percent-encode '@', '/', ':', '?' and '#' (%40, "
    "%2F, %3A, %3F, %23))";
std::string NotShown(std::string_view scheme, std::string_view reason) {
  return std::string{scheme} + "*** (not a valid connection string: " + std::string{reason};
}

TEST(MaskConninfoTest, MasksTheUriPasswordInTheUsersForm) {
  ExpectMasked({
      {"postgresql://outbox:secret@h/db?sslmode=disable",
       "postgresql://outbox:***@h/db?sslmode=disable"},
      {"postgresql://u:p%40ss%2Fw@h1,h2:5433/db", "postgresql://u:***@h1,h2:5433/db"},
      // libpq's user info runs from the first ':' to the first '@'; a ':' in the password stays.
      {"postgresql://u:a:b@h/db", "postgresql://u:***@h/db"},
      {"postgresql://outbox:pa ss@h/db", "postgresql://outbox:***@h/db"},
  });
}

TEST(MaskConninfoTest, MasksEverySecretQueryParameter) {
  ExpectMasked({
      {"postgres://h/db?password=secret&user=x", "postgres://h/db?password=***&user=x"},
      // Both passwords are secrets, whichever libpq keeps; an encoded keyword is "password" too.
      {"postgresql://u:one@h/db?password=two", "postgresql://u:***@h/db?password=***"},
      {"postgresql://h/db?pass%77ord=secret", "postgresql://h/db?pass%77ord=***"},
      {"postgresql://h/db?sslpassword=secret&sslmode=require",
       "postgresql://h/db?sslpassword=***&sslmode=require"},
  });
}

TEST(MaskConninfoTest, MasksKeyValueStringsWithLibpqsQuotingAndEscapes) {
  ExpectMasked({
      // A backslash escapes the space: the password is "SECRET X", masked whole.
      {"host=h password=SECRET\\ X user=u", "host=h password=*** user=u"},
      {"password='a b\\' c' host=h", "password=*** host=h"},
      {" host = h  password = 'x y'  sslpassword=z", " host = h  password = ***  sslpassword=***"},
      // Each password the string spells, also one a later one overrides, also an empty one.
      {"password=a password=b host=h", "password=*** password=*** host=h"},
      {"host=h password=x password=''", "host=h password=*** password=***"},
  });
  // libpq's keywords are case-sensitive: PASSWORD is no option (and not shown).
  EXPECT_EQ(MaskConninfo("  host = h  PASSWORD = x "),
            NotShown("", "invalid connection option \"***\")"));
}

// postgresql://outbox:p#ss/w@... is no URI libpq reads as meant: the '/' ends its look for user
// info, so the host is "outbox", the port "p#ss" and the database "w@127.0.0.1:15432/db". Shown
// as parsed, that would print the password.
TEST(MaskConninfoTest, HidesAStringWhosePasswordLandsElsewhere) {
  ExpectMasked({
      {"postgresql://outbox:p#ss/w@127.0.0.1:15432/db",
       NotShown("postgresql://", "an '@' past the user info") + std::string{kEncodeHint}},
      {"postgresql://u:p@ss@h/db",
       NotShown("postgresql://", "an '@' past the user info") + std::string{kEncodeHint}},
      {"postgres://user:secret",
       NotShown("postgres://", "a port is not a number") + std::string{kEncodeHint}},
  });
}

TEST(MaskConninfoTest, ShowsNoneOfAnUnparseableStringButLibpqsReasonWithoutItsQuotes) {
  const std::string missing_equals =
      NotShown("", "missing \"=\" after \"***\" in connection info string)");
  constexpr char kWithNul[] = "host=h password=se\0cret";
  ExpectMasked({
      {"postgresql://u:p%zz@h/db",
       NotShown("postgresql://", "invalid percent-encoded token: \"***\")")},
      {"password=a b host=h", missing_equals},
      {"amqp://guest:secret@h", missing_equals},
      {"host=h password='secret",
       NotShown("", "unterminated quoted string in connection info string)")},
      {"postgresql://[::1",
       NotShown("postgresql://",
                "end of string reached when looking for matching \"]\" in IPv6 host address in "
                "URI: \"***\")")},
      {std::string_view{kWithNul, sizeof kWithNul - 1}, NotShown("", "it holds a NUL byte)")},
  });
}

// Whatever form the mask takes, libpq reads it as the original with each secret ***.
TEST(MaskConninfoTest, TheMaskedStringParsesToTheSameOptions) {
  for (const std::string conninfo :
       {"postgresql://outbox:secret@h/db?sslmode=disable&application_name=a%20b",
        "postgres://h/db?password=secret&user=x", "host=h password=SECRET\\ X user=u",
        "password='a b\\' c' host=h", "postgresql://u:p%40ss@h:5433/db"}) {
    std::map<std::string, std::string> expected = Options(conninfo);
    ASSERT_EQ(expected.count("error"), 0U) << conninfo;
    expected["password"] = "***";
    EXPECT_EQ(Options(MaskConninfo(conninfo)), expected) << conninfo;
  }
}

TEST(MaskConninfoTest, NoOutputHoldsTheSecret) {
  const std::vector<std::pair<std::string, std::string>> secrets = {
      {"postgresql://outbox:p#ss/w@127.0.0.1:15432/db", "p#ss"},
      {"postgresql://outbox:secret@h/db?sslmode=disable", "secret"},
      {"postgres://h/db?password=secret&user=x", "secret"},
      {"host=h password=SECRET\\ X user=u", "SECRET"},
      {"host=h password=SECRET\\ X user=u", " X"},
      {"password='a b\\' c' host=h", "a b"},
      {"password='a b\\' c' host=h", "' c"},
      {"postgresql://u:pw@zz9@h/db", "zz9"},
      {"postgresql://u:p%zz@h/db", "p%zz"},
      {"password=a bsecret host=h", "bsecret"},
      {"postgresql://[::1:secret", "secret"},
  };
  for (const auto& [conninfo, secret] : secrets) {
    const std::string masked = MaskConninfo(conninfo);
    EXPECT_EQ(masked.find(secret), std::string::npos) << conninfo << " -> " << masked;
  }
}

}  // namespace
}  // namespace outbox::postgres
