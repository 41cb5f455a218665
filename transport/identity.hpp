// Node identity: an Ed25519 key pair kept in the state directory; the node id derives from it.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "transport/crypto.hpp"

namespace grove::transport {

using PublicKey = std::array<std::uint8_t, 32>;
using Signature = std::array<std::uint8_t, 64>;
/// 256-bit node id = BLAKE2b-256("grove-node-id-v1" || Ed25519 public key). Used as the DHT id.
using NodeId = std::array<std::uint8_t, 32>;

NodeId node_id_from_key(const PublicKey& pk);
/// Full hex form (64 characters).
std::string to_hex(const NodeId& id);
/// Short form for logs (first 8 hex characters).
std::string short_id(const NodeId& id);

/// Verifies an Ed25519 signature; false for any mismatch.
bool verify_signature(const PublicKey& pk, std::span<const std::uint8_t> msg, const Signature& sig);

/// An Ed25519 key pair. Thread-safe for concurrent sign() calls (immutable after creation).
class Identity {
 public:
  /// A fresh random identity (tests, ephemeral nodes).
  static Identity generate();
  /// The identity of a 32-byte seed (deterministic simulations and tests; never for real nodes).
  static Identity from_seed(const std::array<std::uint8_t, 32>& seed);
  /// Loads `<state_dir>/identity.key`, or creates it (mode 0600, written atomically) on first
  /// start. Throws ConfigError if the file is unreadable, corrupt, or readable by others.
  static Identity load_or_create(const std::filesystem::path& state_dir);

  Identity(const Identity&) = default;
  Identity& operator=(const Identity&) = default;
  ~Identity();

  const PublicKey& public_key() const noexcept { return pk_; }
  const NodeId& id() const noexcept { return id_; }
  Signature sign(std::span<const std::uint8_t> msg) const;

 private:
  Identity() = default;
  void finish();
  std::array<std::uint8_t, 64> sk_{};
  PublicKey pk_{};
  NodeId id_{};
};

}  // namespace grove::transport
