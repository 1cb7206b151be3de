// MaskAmqpUrl (src/sink/rabbitmq/url_mask.h): AMQP URLs masked by librabbitmq's own parse. No
// broker: runs in the unit tier.
#include "url_mask.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "connection.h"

namespace outbox::rabbitmq {
namespace {

// A URL, its mask, and a piece of its password the mask must not show ("" for none).
struct Case {
  std::string_view url;
  std::string_view masked;
  std::string_view secret;
};

void ExpectMasked(std::initializer_list<Case> cases) {
  for (const Case& masking : cases) {
    const std::string masked = MaskAmqpUrl(masking.url);
    EXPECT_EQ(masked, masking.masked) << masking.url;
    if (!masking.secret.empty()) {
      EXPECT_EQ(masked.find(masking.secret), std::string::npos) << masking.url << " -> " << masked;
    }
  }
}

TEST(MaskAmqpUrlTest, MasksThePasswordInTheUsersForm) {
  ExpectMasked({
      {"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/", ""},
      {"amqp://u:pw-mq-1@mq/", "amqp://u:***@mq/", "pw-"},
      // A space is no delimiter to amqp_parse_url: the password is "pa ss".
      {"amqp://guest:pa ss@localhost:5672/%2f", "amqp://guest:***@localhost:5672/%2f", "pa"},
      {"amqps://u:p%40ss@h/v", "amqps://u:***@h/v", "p%40ss"},
      {"amqp://u:p%2Fw%3A@[::1]:5673/vh", "amqp://u:***@[::1]:5673/vh", "p%2F"},
  });
}

TEST(MaskAmqpUrlTest, LeavesAUrlWithoutAPasswordAsItIs) {
  for (const char* url :
       {"amqp://guest@h", "amqp://h:5672/", "amqp://", "amqp://u:@h/", "amqps://mq/"}) {
    EXPECT_EQ(MaskAmqpUrl(url), url);
  }
}

// What amqp_parse_url refuses shows as the scheme and *** only: the sink would not connect with
// it, and where the password stops in it is anybody's guess.
TEST(MaskAmqpUrlTest, ShowsOnlyTheSchemeOfAUrlTheLibraryRefuses) {
  constexpr char kWithNul[] = "amqp://u:se\0cret@h/";
  ExpectMasked({
      {"amqp://u:p@ss@mq/vh", "amqp://***", "p@ss"},
      {"amqp://u:p#ss/w@mq/vh", "amqp://***", "p#ss"},
      {"amqp://u@mq/?password=secret", "amqp://***", "secret"},
      {"amqps://u:p%zzss@mq/", "amqps://***", "zzss"},
      {std::string_view{kWithNul, sizeof kWithNul - 1}, "amqp://***", "cret"},
  });
}

TEST(MaskAmqpUrlTest, MasksAnythingElseAsFreeText) {
  ExpectMasked({
      {"http://u:secret@mq/", "http://u:***@mq/", "secret"},
      {"http://u:pa ss@mq/", "http://u:***@mq/", "pa"},
      {"AMQP://u:p#ss/w@mq/", "AMQP://u:***@mq/", "p#ss"},
  });
}

// The masked URL is what the sink would parse, with *** for the password.
TEST(MaskAmqpUrlTest, TheMaskedUrlParsesToTheSameEndpoint) {
  for (const std::string url : {"amqp://guest:pa ss@localhost:5672/%2f",
                                "amqp://us%3Aer:p%40ss@mq:5673/v%2Fh", "amqp://u:x@[::1]/"}) {
    Endpoint expected = ParseUrl(url);
    expected.password = "***";
    const Endpoint masked = ParseUrl(MaskAmqpUrl(url));
    EXPECT_EQ(masked.user, expected.user) << url;
    EXPECT_EQ(masked.password, expected.password) << url;
    EXPECT_EQ(masked.host, expected.host) << url;
    EXPECT_EQ(masked.port, expected.port) << url;
    EXPECT_EQ(masked.vhost, expected.vhost) << url;
  }
}

}  // namespace
}  // namespace outbox::rabbitmq
