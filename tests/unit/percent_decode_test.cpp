#include "outbox/core/percent_decode.h"

#include <gtest/gtest.h>

namespace outbox {
namespace {

TEST(PercentDecodeTest, DecodesEscapesAndOptionallyPlus) {
  EXPECT_EQ(PercentDecode("a%20b%2F%2f"), "a b//");
  EXPECT_EQ(PercentDecode("a+b"), "a+b");
  EXPECT_EQ(PercentDecode("a+b", /*plus_is_space=*/true), "a b");
  EXPECT_EQ(PercentDecode("%00"), std::string(1, '\0'));
  EXPECT_EQ(PercentDecode(""), "");
}

TEST(PercentDecodeTest, RefusesATruncatedOrNonHexEscape) {
  for (const char* bad : {"%", "%4", "a%4", "%G0", "%0g", "%%41"}) {
    EXPECT_FALSE(PercentDecode(bad).has_value()) << bad;
  }
  EXPECT_EQ(HexDigitValue('f'), 15);
  EXPECT_EQ(HexDigitValue('F'), 15);
  EXPECT_EQ(HexDigitValue('9'), 9);
  EXPECT_EQ(HexDigitValue('g'), -1);
}

TEST(PercentEncodeTest, KeepsOnlyUnreservedBytesAndRoundTrips) {
  EXPECT_EQ(PercentEncode("orders"), "orders");
  EXPECT_EQ(PercentEncode("A-z_0.9~"), "A-z_0.9~");
  EXPECT_EQ(PercentEncode("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
  EXPECT_EQ(PercentEncode(std::string{"\0\xff", 2}), "%00%FF");
  EXPECT_EQ(PercentEncode(""), "");
  const std::string every_byte = [] {
    std::string bytes;
    for (int byte = 0; byte < 256; ++byte) bytes += static_cast<char>(byte);
    return bytes;
  }();
  EXPECT_EQ(PercentDecode(PercentEncode(every_byte)), every_byte);
}

}  // namespace
}  // namespace outbox
