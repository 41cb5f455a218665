// Sans-IO authenticated key exchange. Three messages, ephemeral X25519, Ed25519 identities,
// optional pre-shared swarm key mixed into every key and MAC:
//
//   M1 I->R  magic "GRV1" | version | suites | e_i | MAC_psk(...)   (70 bytes)
//   M2 R->I  e_r | suite | AEAD_hs_r2i(pk_r | sig_r)               (145 bytes)
//   M3 I->R  AEAD_hs_i2r(pk_i | sig_i)                               (112 bytes)
//
//   psk    = swarm key, or BLAKE2b("grove-open-swarm-v1") when there is none
//   th2    = BLAKE2b(BLAKE2b(M1) | e_r | suite)        (transcript; binds the suite choice)
//   master = BLAKE2b_psk("grove-hs-v1" | X25519(e_i, e_r) | th2)
//   keys   = KDF(master, 1..4): handshake i->r, r->i, traffic i->r, r->i
//   sig_r  = Ed25519_r("grove-resp-v1" | th2);   sig_i = Ed25519_i("grove-init-v1" | th2 | pk_r)
//
// A responder without the swarm key rejects M1 (bad MAC) before doing any public-key work on
// it; an initiator without it cannot open M2; neither can produce a valid M3/M2 payload, so no
// traffic key is ever shared with an outsider. Without a swarm key identities are still proven.
// The object takes bytes and returns bytes: the TCP driver (tcp_link.cpp) and the fuzzer both
// use it unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "transport/crypto.hpp"
#include "transport/error.hpp"
#include "transport/identity.hpp"

namespace grove::transport {

constexpr std::size_t kHandshakeMaxMessage = 256;
constexpr std::size_t kM1Size = 70;
constexpr std::size_t kM2Size = 145;
constexpr std::size_t kM3Size = 112;

struct HandshakeConfig {
  const Identity* self = nullptr;       ///< must outlive the handshake
  std::optional<SwarmKey> swarm_key;    ///< absent: open swarm (identities still proven)
  std::optional<NodeId> expected_peer;  ///< initiator: fail with wrong_peer if it differs
  std::uint8_t suites = 0;              ///< 0: local_suites()
};

/// What a finished handshake yields: traffic keys for both directions and the proven peer.
struct SessionKeys {
  Suite suite = Suite::xchacha20poly1305;
  Key tx{};
  Key rx{};
  PublicKey peer_key{};
  NodeId peer_id{};
};

class Handshake {
 public:
  enum class Role { initiator, responder };
  Handshake(Role role, HandshakeConfig cfg);
  ~Handshake();
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  /// Initiator only: the first message.
  std::vector<std::uint8_t> start();

  struct Step {
    std::vector<std::uint8_t> reply;  ///< bytes to send (may be empty)
    bool done = false;                ///< keys() is valid
  };
  /// Feeds one received handshake message. Errors: handshake_failed, wrong_peer, malformed.
  Result<Step> on_message(std::span<const std::uint8_t> msg);

  bool done() const noexcept { return state_ == State::done; }
  const SessionKeys& keys() const noexcept { return keys_; }

 private:
  enum class State { init, sent_m1, sent_m2, done, failed };
  Result<Step> fail(errc e);
  Result<Step> responder_m1(std::span<const std::uint8_t> m);
  Result<Step> initiator_m2(std::span<const std::uint8_t> m);
  Result<Step> responder_m3(std::span<const std::uint8_t> m);
  bool derive(const std::uint8_t* peer_e);
  std::vector<std::uint8_t> to_sign(std::span<const std::uint8_t> lbl,
                                    const PublicKey* responder) const;
  /// Writes AEAD_k(own pk | own signature) (kIdentityPayload + tag bytes) to `out`.
  void seal_identity(const Key& k, std::span<const std::uint8_t> lbl, const PublicKey* responder,
                     std::uint8_t* out) const;
  /// Opens the peer's sealed identity, checks its signature, records it in keys_.
  bool open_identity(const Key& k, const std::uint8_t* in, std::span<const std::uint8_t> lbl,
                     const PublicKey* responder);

  Role role_;
  HandshakeConfig cfg_;
  State state_ = State::init;
  Key psk_{};
  std::array<std::uint8_t, 32> e_pk_{}, e_sk_{};
  std::vector<std::uint8_t> m1_;
  Hash256 th2_{};
  Key hs_i2r_{}, hs_r2i_{};
  SessionKeys keys_{};
};

}  // namespace grove::transport
