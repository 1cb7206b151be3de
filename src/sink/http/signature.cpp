#include "signature.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <array>
#include <stdexcept>

#include "outbox/sink/http.h"

namespace outbox::webhook {
namespace {

constexpr std::string_view kSecretPrefix = "whsec_";
// Standard Webhooks: secrets of 24 to 64 random bytes; 16 is the least we take.
constexpr std::size_t kMinKeyBytes = 16;
constexpr std::size_t kMaxKeyBytes = 64;

struct MacDeleter {
  void operator()(EVP_MAC* mac) const { EVP_MAC_free(mac); }
};
struct MacContextDeleter {
  void operator()(EVP_MAC_CTX* context) const { EVP_MAC_CTX_free(context); }
};
using MacPtr = std::unique_ptr<EVP_MAC, MacDeleter>;
using MacContextPtr = std::unique_ptr<EVP_MAC_CTX, MacContextDeleter>;

const unsigned char* Bytes(std::string_view text) {
  return reinterpret_cast<const unsigned char*>(text.data());  // NOLINT: OpenSSL takes bytes
}

}  // namespace

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int length = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),  // NOLINT
                                     Bytes(bytes), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(length));
  return out;
}

std::string SecretKey(std::string_view secret) {
  if (!secret.starts_with(kSecretPrefix)) {
    throw std::invalid_argument("must start with \"whsec_\" (a Standard Webhooks secret)");
  }
  const std::string_view encoded = secret.substr(kSecretPrefix.size());
  if (encoded.empty() || encoded.size() % 4 != 0) {
    throw std::invalid_argument(
        "must be \"whsec_\" followed by base64 with '=' padding (a length that is a multiple of "
        "4)");
  }
  std::string key(encoded.size() / 4 * 3, '\0');
  const int length = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(key.data()),  // NOLINT
                                     Bytes(encoded), static_cast<int>(encoded.size()));
  if (length < 0) throw std::invalid_argument("is not valid base64 after \"whsec_\"");
  // EVP_DecodeBlock counts the padding as zero bytes.
  std::size_t size = static_cast<std::size_t>(length);
  if (encoded.ends_with("==")) {
    size -= 2;
  } else if (encoded.ends_with('=')) {
    size -= 1;
  }
  key.resize(size);
  if (key.size() < kMinKeyBytes || key.size() > kMaxKeyBytes) {
    throw std::invalid_argument("must hold " + std::to_string(kMinKeyBytes) + " to " +
                                std::to_string(kMaxKeyBytes) + " bytes of key, got " +
                                std::to_string(key.size()));
  }
  return key;
}

struct Signer::Key {
  MacContextPtr keyed;  // initialised with the key; duplicated for each signature
};

Signer::Signer(const std::vector<std::string>& secrets) {
  if (secrets.empty()) return;
  const MacPtr mac{EVP_MAC_fetch(nullptr, "HMAC", nullptr)};
  if (!mac) throw std::runtime_error("OpenSSL has no HMAC");
  std::array<char, 7> digest{"SHA256"};
  const std::array<OSSL_PARAM, 2> params{
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest.data(), 0),
      OSSL_PARAM_construct_end()};
  for (std::size_t i = 0; i < secrets.size(); ++i) {
    std::string key;
    try {
      key = SecretKey(secrets[i]);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument("secret " + std::to_string(i + 1) + " " + error.what());
    }
    auto entry = std::make_unique<Key>();
    entry->keyed.reset(EVP_MAC_CTX_new(mac.get()));
    if (!entry->keyed ||
        EVP_MAC_init(entry->keyed.get(), Bytes(key), key.size(), params.data()) != 1) {
      throw std::runtime_error("OpenSSL could not set up HMAC-SHA256");
    }
    keys_.push_back(std::move(entry));
  }
}

Signer::~Signer() = default;

std::string Signer::Sign(std::string_view id, std::int64_t timestamp, std::string_view body) const {
  const std::string stamp = std::to_string(timestamp);
  std::string signatures;
  for (const auto& key : keys_) {
    const MacContextPtr context{EVP_MAC_CTX_dup(key->keyed.get())};
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    std::size_t length = 0;
    const bool ok = context && EVP_MAC_update(context.get(), Bytes(id), id.size()) == 1 &&
                    EVP_MAC_update(context.get(), Bytes("."), 1) == 1 &&
                    EVP_MAC_update(context.get(), Bytes(stamp), stamp.size()) == 1 &&
                    EVP_MAC_update(context.get(), Bytes("."), 1) == 1 &&
                    EVP_MAC_update(context.get(), Bytes(body), body.size()) == 1 &&
                    EVP_MAC_final(context.get(), digest.data(), &length, digest.size()) == 1;
    if (!ok) throw std::runtime_error("OpenSSL could not compute HMAC-SHA256");
    if (!signatures.empty()) signatures += ' ';
    signatures += "v1,";
    signatures += Base64(std::string_view{reinterpret_cast<const char*>(digest.data()),  // NOLINT
                                          length});
  }
  return signatures;
}

std::string Sign(const std::vector<std::string>& secrets, std::string_view id,
                 std::int64_t timestamp, std::string_view body) {
  return Signer{secrets}.Sign(id, timestamp, body);
}

}  // namespace outbox::webhook
