#include "dht/key.hpp"

#include <bit>
#include <cstring>

#include "transport/crypto.hpp"

namespace grove::dht {

Key key_of(std::string_view name) {
  static constexpr std::string_view kDomain = "grove-dht-key-v1";
  std::string buf;
  buf.reserve(kDomain.size() + name.size());
  buf.append(kDomain).append(name);
  const auto h = transport::blake2b_256(
      std::span(reinterpret_cast<const std::uint8_t*>(buf.data()), buf.size()));
  Key k;
  std::memcpy(k.data(), h.data(), k.size());
  return k;
}

Key distance(const Key& a, const Key& b) {
  Key d;
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = a[i] ^ b[i];
  return d;
}

int common_prefix_bits(const Key& a, const Key& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::uint8_t x = a[i] ^ b[i];
    if (x) return static_cast<int>(i * 8) + std::countl_zero(x);
  }
  return kKeyBits;
}

bool closer(const Key& target, const Key& a, const Key& b) {
  for (std::size_t i = 0; i < target.size(); ++i) {
    const std::uint8_t da = a[i] ^ target[i], db = b[i] ^ target[i];
    if (da != db) return da < db;
  }
  return false;
}

Key random_key(std::mt19937_64& rng) {
  Key k;
  for (std::size_t i = 0; i < k.size(); i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(k.data() + i, &r, 8);
  }
  return k;
}

Key random_key_in_bucket(const Key& self, int prefix, std::mt19937_64& rng) {
  Key k = random_key(rng);
  // Copy the first `prefix` bits of self, flip bit `prefix`, keep the rest random.
  const int full = prefix / 8, bit = prefix % 8;
  for (int i = 0; i < full; ++i) k[i] = self[i];
  const std::uint8_t keep = static_cast<std::uint8_t>(0xFF00u >> bit);  // top `bit` bits
  const std::uint8_t flip = static_cast<std::uint8_t>(0x80u >> bit);
  k[full] = static_cast<std::uint8_t>((self[full] & keep) | (~self[full] & flip) |
                                      (k[full] & ~keep & ~flip & 0xFF));
  return k;
}

std::string hex(const Key& k) {
  return transport::to_hex(std::span<const std::uint8_t>(k));
}
std::string short_hex(const Key& k) {
  return hex(k).substr(0, 8);
}

}  // namespace grove::dht
