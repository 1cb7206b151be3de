#pragma once
// UTF-8 checks, in one place for the file sink (payload as text or base64) and the operator
// tools (payload as text or hex).

#include <string_view>

namespace outbox {

// True when `text` is well-formed UTF-8: no overlong forms, surrogates, code points past
// U+10FFFF or truncated sequences. NUL and other control characters are allowed.
bool IsValidUtf8(std::string_view text);

// True when `text` is well-formed UTF-8 without control characters (C0 other than tab, LF and
// CR; DEL; C1): safe to show on a terminal or in a JSON string as text.
bool IsPrintableUtf8(std::string_view text);

}  // namespace outbox
