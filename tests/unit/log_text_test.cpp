#include "outbox/core/log_text.h"

#include <gtest/gtest.h>

#include <string>

namespace outbox {
namespace {

TEST(SanitizeForLogTest, KeepsPlainTextAndValidUtf8AsTheyAre) {
  EXPECT_EQ(SanitizeForLog(""), "");
  EXPECT_EQ(SanitizeForLog("published 3 messages to \"orders\" {topic}\\x"),
            "published 3 messages to \"orders\" {topic}\\x");
  EXPECT_EQ(SanitizeForLog("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0");
}

// The case: an abandon reason with a newline and an escape sequence forged a log line
// and put a raw ESC into the log.
TEST(SanitizeForLogTest, AForgedLineAndAnEscapeSequenceStayOnOneLine) {
  const std::string reason =
      "abandoned: bad\n2024-05-01T12:00:00.000+0000 info relay stopped\x1b[2J\x1b]0;x\x07";
  const std::string line = SanitizeForLog(reason);
  EXPECT_EQ(
      line,
      "abandoned: bad\\n2024-05-01T12:00:00.000+0000 info relay stopped\\x1b[2J\\x1b]0;x\\x07");
  for (const char c : line) {
    EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == '\x7f') << line;
  }
}

TEST(SanitizeForLogTest, EscapesEveryControlCharacter) {
  EXPECT_EQ(SanitizeForLog("a\r\nb\tc"), "a\\r\\nb\\tc");
  EXPECT_EQ(SanitizeForLog(std::string{"nul\0!", 5}), "nul\\x00!");
  EXPECT_EQ(SanitizeForLog("\x01\x1f\x7f"), "\\x01\\x1f\\x7f");
  // C1 controls are valid UTF-8 (U+0080..U+009F) but control a terminal all the same: CSI is
  // U+009B, NEL (a line break to some readers) U+0085.
  EXPECT_EQ(SanitizeForLog("\xc2\x9b"
                           "2J \xc2\x85 \xc2\x80 \xc2\x9f"),
            "\\u009b2J \\u0085 \\u0080 \\u009f");
}

TEST(SanitizeForLogTest, EscapesEachByteOfInvalidUtf8) {
  EXPECT_EQ(SanitizeForLog("\xff"), "\\xff");
  EXPECT_EQ(SanitizeForLog("a\xc3"), "a\\xc3");                           // truncated sequence
  EXPECT_EQ(SanitizeForLog("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(SanitizeForLog("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(SanitizeForLog("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(SanitizeForLog("\x80z\xe2\x82"), "\\x80z\\xe2\\x82");
}

TEST(SanitizeForLogTest, BoundsTheLengthAtACharacterBoundary) {
  EXPECT_EQ(SanitizeForLog(std::string(10, 'x'), 10), std::string(10, 'x'));
  EXPECT_EQ(SanitizeForLog(std::string(12, 'x'), 10), std::string(10, 'x') + " …(2 bytes cut)");
  // A two-byte character that does not fit whole is left out whole.
  EXPECT_EQ(SanitizeForLog("abcd\xc3\xa9", 5), "abcd …(2 bytes cut)");
  // So is an escape.
  EXPECT_EQ(SanitizeForLog("abc\n", 4), "abc …(1 bytes cut)");
  EXPECT_EQ(SanitizeForLog("ab\n", 4), "ab\\n");
  // The bound counts what is written: escapes take room.
  EXPECT_EQ(SanitizeForLog(std::string(6, '\x1b'), 8), "\\x1b\\x1b …(4 bytes cut)");
  const std::string huge(1 << 20, 'y');
  const std::string bounded = SanitizeForLog(huge);
  EXPECT_EQ(bounded, std::string(kMaxLogTextBytes, 'y') + " …(" +
                         std::to_string(huge.size() - kMaxLogTextBytes) + " bytes cut)");
}

TEST(BoundForLogTest, OnlyBoundsAndNeverSplitsACharacter) {
  EXPECT_EQ(BoundForLog("a\nb"), "a\nb");
  EXPECT_EQ(BoundForLog("abcdef", 4), "abcd …(2 bytes cut)");
  EXPECT_EQ(BoundForLog("ab\xe2\x82\xac", 4), "ab …(3 bytes cut)");
  EXPECT_EQ(BoundForLog("ab\xf0\x9f\x98\x80", 5), "ab …(4 bytes cut)");
  // Invalid UTF-8 (continuation bytes only) is cut near the bound, not emptied.
  EXPECT_EQ(BoundForLog(std::string(10, '\x80'), 6).substr(0, 3), std::string(3, '\x80'));
}

}  // namespace
}  // namespace outbox
