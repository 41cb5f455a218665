#include "transport/crypto.hpp"

#include <sodium.h>

#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>

#include "transport/error.hpp"

namespace grove::transport {

void ensure_sodium() {
  static const int rc = sodium_init();
  if (rc < 0) throw ConfigError("libsodium failed to initialise");
}

const char* suite_name(Suite s) {
  switch (s) {
    case Suite::aes256gcm:
      return "AES-256-GCM";
    case Suite::xchacha20poly1305:
      return "XChaCha20-Poly1305";
  }
  return "unknown";
}

std::uint8_t local_suites() {
  ensure_sodium();
  std::uint8_t m = 1u << static_cast<int>(Suite::xchacha20poly1305);
  if (crypto_aead_aes256gcm_is_available()) m |= 1u << static_cast<int>(Suite::aes256gcm);
  return m;
}

SwarmKey SwarmKey::generate() {
  ensure_sodium();
  SwarmKey k;
  randombytes_buf(k.bytes.data(), k.bytes.size());
  return k;
}

SwarmKey SwarmKey::parse(const std::string& text) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  SwarmKey k;
  std::size_t bin_len = 0;
  if (s.size() != 2 * kKeySize ||
      sodium_hex2bin(k.bytes.data(), k.bytes.size(), s.data(), s.size(), nullptr, &bin_len,
                     nullptr) != 0 ||
      bin_len != kKeySize) {
    throw ConfigError("swarm key must be exactly 64 hexadecimal characters");
  }
  return k;
}

SwarmKey SwarmKey::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read swarm key file '" + file.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse(ss.str());
  } catch (const ConfigError& e) {
    throw ConfigError("swarm key file '" + file.string() + "': " + e.what());
  }
}

std::string SwarmKey::hex() const {
  return to_hex(bytes);
}

Hash256 blake2b_256(std::span<const std::uint8_t> data) {
  Hash256 h;
  crypto_generichash(h.data(), h.size(), data.data(), data.size(), nullptr, 0);
  return h;
}

static_assert(sizeof(crypto_generichash_state) <= 384 && alignof(crypto_generichash_state) <= 64);

Blake2b256::Blake2b256() {
  crypto_generichash_init(reinterpret_cast<crypto_generichash_state*>(state_.data()), nullptr, 0,
                          32);
}
void Blake2b256::update(std::span<const std::uint8_t> data) {
  crypto_generichash_update(reinterpret_cast<crypto_generichash_state*>(state_.data()), data.data(),
                            data.size());
}
Hash256 Blake2b256::final() {
  Hash256 h;
  crypto_generichash_final(reinterpret_cast<crypto_generichash_state*>(state_.data()), h.data(),
                           h.size());
  return h;
}

std::string to_hex(std::span<const std::uint8_t> data) {
  std::string s(data.size() * 2 + 1, '\0');
  sodium_bin2hex(s.data(), s.size(), data.data(), data.size());
  s.pop_back();
  return s;
}

CipherState::~CipherState() {
  sodium_memzero(key_.data(), key_.size());
}

void CipherState::nonce(std::uint8_t* out) const {
  // Little-endian counter in the first 8 bytes, zero padding (12 bytes for GCM, 24 for XChaCha).
  std::uint64_t c = counter_;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(c >> (8 * i));
}

bool CipherState::seal(std::span<std::uint8_t> data, std::span<const std::uint8_t> ad,
                       std::uint8_t* tag) {
  if (counter_ == std::numeric_limits<std::uint64_t>::max()) return false;
  std::uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES] = {};
  nonce(n);
  unsigned long long tag_len = 0;
  if (suite_ == Suite::aes256gcm) {
    crypto_aead_aes256gcm_encrypt_detached(data.data(), tag, &tag_len, data.data(), data.size(),
                                           ad.data(), ad.size(), nullptr, n, key_.data());
  } else {
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(data.data(), tag, &tag_len, data.data(),
                                                        data.size(), ad.data(), ad.size(), nullptr,
                                                        n, key_.data());
  }
  ++counter_;
  return true;
}

bool CipherState::open(std::span<std::uint8_t> data, std::span<const std::uint8_t> ad,
                       const std::uint8_t* tag) {
  if (counter_ == std::numeric_limits<std::uint64_t>::max()) return false;
  std::uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES] = {};
  nonce(n);
  int rc;
  if (suite_ == Suite::aes256gcm) {
    rc = crypto_aead_aes256gcm_decrypt_detached(data.data(), nullptr, data.data(), data.size(), tag,
                                                ad.data(), ad.size(), n, key_.data());
  } else {
    rc = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
        data.data(), nullptr, data.data(), data.size(), tag, ad.data(), ad.size(), n, key_.data());
  }
  if (rc != 0) return false;
  ++counter_;
  return true;
}

}  // namespace grove::transport
