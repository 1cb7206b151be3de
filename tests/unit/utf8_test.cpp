#include "outbox/core/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace outbox {
namespace {

TEST(Utf8Test, WellFormedTextIsValid) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8(std::string("nul\0inside", 10)));
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF
}

TEST(Utf8Test, MalformedTextIsNot) {
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong, 3 bytes
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\x80"));              // stray continuation
  EXPECT_FALSE(IsValidUtf8("\xff"));
}

TEST(Utf8Test, PrintableExcludesControlCharacters) {
  EXPECT_TRUE(
      IsPrintableUtf8("line one\nline two\ttabbed\r\n Gr\xc3\xbc\xc3\x9f"
                      "e"));
  EXPECT_FALSE(IsPrintableUtf8(std::string("nul\0", 4)));
  EXPECT_FALSE(IsPrintableUtf8("bell\x07"));
  EXPECT_FALSE(IsPrintableUtf8("del\x7f"));
  EXPECT_FALSE(IsPrintableUtf8("c1 \xc2\x85"));  // U+0085 NEL
  EXPECT_FALSE(IsPrintableUtf8("\xc0\xaf"));
}

}  // namespace
}  // namespace outbox
