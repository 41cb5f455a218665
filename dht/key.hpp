// 256-bit DHT keys and the XOR metric. Node IDs are keys (transport::NodeId, derived from the
// node's Ed25519 public key); so are record keys, hashed from a name.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "transport/identity.hpp"

namespace grove::dht {

using Key = transport::NodeId;
using NodeId = transport::NodeId;
constexpr int kKeyBits = 256;

/// The record key of a name: BLAKE2b-256("grove-dht-key-v1" || name).
Key key_of(std::string_view name);

/// a XOR b.
Key distance(const Key& a, const Key& b);
/// Number of leading bits a and b share (256 when equal).
int common_prefix_bits(const Key& a, const Key& b);
/// True when `a` is strictly closer to `target` than `b` in the XOR metric.
bool closer(const Key& target, const Key& a, const Key& b);

/// A uniformly random key that shares exactly `prefix` leading bits with `self`
/// (prefix < 256): a target inside bucket `prefix` of self's routing table.
Key random_key_in_bucket(const Key& self, int prefix, std::mt19937_64& rng);
Key random_key(std::mt19937_64& rng);

std::string hex(const Key& k);
std::string short_hex(const Key& k);  ///< first 8 hex digits, for logs

}  // namespace grove::dht
