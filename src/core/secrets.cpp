#include "outbox/core/secrets.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>

#include "outbox/core/percent_decode.h"

namespace outbox {
namespace {

constexpr std::string_view kBase64 =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t at = 0; at < bytes.size(); at += 3) {
    const std::size_t left = bytes.size() - at;
    std::uint32_t group = static_cast<std::uint32_t>(static_cast<std::uint8_t>(bytes[at])) << 16U;
    if (left > 1)
      group |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(bytes[at + 1])) << 8U;
    if (left > 2) group |= static_cast<std::uint8_t>(bytes[at + 2]);
    out += kBase64[(group >> 18U) & 0x3FU];
    out += kBase64[(group >> 12U) & 0x3FU];
    out += left > 1 ? kBase64[(group >> 6U) & 0x3FU] : '=';
    out += left > 2 ? kBase64[group & 0x3FU] : '=';
  }
  return out;
}

// Standard base64, padded or not; nullopt for anything else.
std::optional<std::string> Base64Decode(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  std::uint32_t group = 0;
  int bits = 0;
  for (const char c : text) {
    const std::size_t value = kBase64.find(c);
    if (value == std::string_view::npos) return std::nullopt;
    group = (group << 6U) | static_cast<std::uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((group >> static_cast<unsigned>(bits)) & 0xFFU);
    }
  }
  return out;
}

std::string_view Trim(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

std::string Decoded(std::string_view text) {
  return PercentDecode(text).value_or(std::string{text});
}

struct Installed {
  std::mutex mutex;
  std::shared_ptr<const SecretRedactor> redactor;  // guarded by mutex
};

Installed& TheInstalled() {
  static Installed installed;
  return installed;
}

}  // namespace

SecretRedactor::SecretRedactor(std::vector<std::string> secrets) {
  std::erase_if(secrets, [](const std::string& secret) { return secret.size() < kMinSecretBytes; });
  std::sort(secrets.begin(), secrets.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  secrets.erase(std::unique(secrets.begin(), secrets.end()), secrets.end());
  secrets_ = std::move(secrets);
}

std::string SecretRedactor::Redact(std::string_view text, bool cut) const {
  if (secrets_.empty() || text.size() < kMinSecretBytes) return std::string{text};
  std::vector<bool> covered;  // by an occurrence of a secret; sized at the first one found
  const auto cover = [&](std::size_t from, std::size_t length) {
    if (covered.empty()) covered.resize(text.size(), false);
    std::fill_n(covered.begin() + static_cast<std::ptrdiff_t>(from), length, true);
  };
  for (const std::string& secret : secrets_) {
    for (std::size_t at = text.find(secret); at != std::string_view::npos;
         at = text.find(secret, at + 1)) {
      cover(at, secret.size());
    }
    if (!cut) continue;
    // The longest tail that is the start of this secret (a whole one was found above).
    for (std::size_t length = std::min(secret.size() - 1, text.size()); length >= kMinSecretBytes;
         --length) {
      if (text.ends_with(std::string_view{secret}.substr(0, length))) {
        cover(text.size() - length, length);
        break;
      }
    }
  }
  if (covered.empty()) return std::string{text};
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size(); ++at) {
    if (!covered[at]) {
      out += text[at];
    } else if (at == 0 || !covered[at - 1]) {
      out += kRedactedSecret;
    }
  }
  return out;
}

std::vector<std::string> HeaderSecretForms(std::string_view value) {
  std::vector<std::string> forms{std::string{value}};
  const std::string_view trimmed = Trim(value);
  if (trimmed != value) forms.emplace_back(trimmed);
  const std::size_t space = trimmed.find_first_of(" \t");
  if (space == std::string_view::npos) return forms;
  const std::string_view scheme = trimmed.substr(0, space);
  const std::string_view credentials = Trim(trimmed.substr(space));
  forms.emplace_back(credentials);
  const bool basic =
      scheme.size() == 5 && std::equal(scheme.begin(), scheme.end(), "basic",
                                       [](char a, char b) { return (a | 0x20) == b; });
  if (!basic) return forms;
  if (const auto decoded = Base64Decode(credentials)) {
    forms.push_back(*decoded);
    const std::size_t colon = decoded->find(':');
    if (colon != std::string::npos) forms.push_back(decoded->substr(colon + 1));
  }
  return forms;
}

std::vector<std::string> UrlSecretForms(std::string_view url, bool lone_user_is_secret) {
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  const std::size_t start = scheme_end + 3;
  const std::size_t end = std::min(url.find_first_of("/?#", start), url.size());
  const std::size_t at = url.substr(start, end - start).rfind('@');
  if (at == std::string_view::npos) return {};
  const std::string_view user_info = url.substr(start, at);
  const std::size_t colon = user_info.find(':');
  if (colon == std::string_view::npos) {
    if (!lone_user_is_secret) return {};
    return {std::string{user_info}, Decoded(user_info)};
  }
  const std::string_view password = user_info.substr(colon + 1);
  const std::string plain = Decoded(user_info.substr(0, colon)) + ":" + Decoded(password);
  return {std::string{password}, Decoded(password), std::string{user_info}, plain,
          Base64Encode(plain)};
}

void InstallKnownSecrets(std::shared_ptr<const SecretRedactor> redactor) {
  Installed& installed = TheInstalled();
  const std::lock_guard lock(installed.mutex);
  installed.redactor = std::move(redactor);
}

std::string RedactKnownSecrets(std::string_view text, bool cut) {
  std::shared_ptr<const SecretRedactor> redactor;
  {
    Installed& installed = TheInstalled();
    const std::lock_guard lock(installed.mutex);
    redactor = installed.redactor;
  }
  return redactor ? redactor->Redact(text, cut) : std::string{text};
}

}  // namespace outbox
