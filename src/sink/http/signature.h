#pragma once
// Standard Webhooks signatures: HMAC-SHA256 over "id.timestamp.body", keyed by each whsec_
// secret, base64 (OpenSSL's libcrypto).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::webhook {

// Standard base64 (with '=' padding, no line breaks).
std::string Base64(std::string_view bytes);

// The key of a "whsec_<base64>" secret; throws std::invalid_argument saying what is wrong (never
// quoting the secret).
std::string SecretKey(std::string_view secret);

// Signs with every configured secret; the keys are read once. Not thread-safe (one per sink).
class Signer {
 public:
  // Throws std::invalid_argument as SecretKey does, naming the secret's position.
  explicit Signer(const std::vector<std::string>& secrets);
  ~Signer();
  Signer(const Signer&) = delete;
  Signer& operator=(const Signer&) = delete;

  [[nodiscard]] bool empty() const { return keys_.empty(); }
  // "v1,<base64> v1,<base64>": one per secret, in order; "" without secrets.
  [[nodiscard]] std::string Sign(std::string_view id, std::int64_t timestamp,
                                 std::string_view body) const;

 private:
  struct Key;
  std::vector<std::unique_ptr<Key>> keys_;
};

}  // namespace outbox::webhook
