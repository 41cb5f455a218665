#include "transport/handshake.hpp"

#include <sodium.h>

#include <cstring>

namespace grove::transport {
namespace {
constexpr std::uint8_t kMagic[4] = {'G', 'R', 'V', '1'};
constexpr std::uint8_t kVersion = 1;
constexpr char kOpenSwarm[] = "grove-open-swarm-v1";
constexpr char kM1Label[] = "grove-m1-v1";
constexpr char kHsLabel[] = "grove-hs-v1";
constexpr char kRespLabel[] = "grove-resp-v1";
constexpr char kInitLabel[] = "grove-init-v1";
constexpr char kKdfCtx[crypto_kdf_CONTEXTBYTES + 1] = "grovehs1";
constexpr std::size_t kIdentityPayload = 32 + 64;  // pk | sig

template <std::size_t N>
std::span<const std::uint8_t> label(const char (&s)[N]) {
  return {reinterpret_cast<const std::uint8_t*>(s), N - 1};
}

Hash256 keyed_hash(const Key& key, std::initializer_list<std::span<const std::uint8_t>> parts) {
  Hash256 out;
  crypto_generichash_state st;
  crypto_generichash_init(&st, key.data(), key.size(), out.size());
  for (auto p : parts) crypto_generichash_update(&st, p.data(), p.size());
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

Hash256 hash(std::initializer_list<std::span<const std::uint8_t>> parts) {
  Hash256 out;
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, out.size());
  for (auto p : parts) crypto_generichash_update(&st, p.data(), p.size());
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

// Handshake payloads are sealed with XChaCha20-Poly1305 (available everywhere), nonce 0: each
// handshake key is used for exactly one message.
void hs_seal(const Key& k, const Hash256& ad, const std::uint8_t* in, std::uint8_t* out) {
  std::uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES] = {};
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(out, &clen, in, kIdentityPayload, ad.data(), ad.size(),
                                             nullptr, nonce, k.data());
}

bool hs_open(const Key& k, const Hash256& ad, const std::uint8_t* in, std::uint8_t* out) {
  std::uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES] = {};
  unsigned long long mlen = 0;
  return crypto_aead_xchacha20poly1305_ietf_decrypt(out, &mlen, nullptr, in,
                                                    kIdentityPayload + kTagSize, ad.data(),
                                                    ad.size(), nonce, k.data()) == 0;
}
}  // namespace

Handshake::Handshake(Role role, HandshakeConfig cfg) : role_(role), cfg_(std::move(cfg)) {
  ensure_sodium();
  if (!cfg_.self) throw ConfigError("handshake needs an identity");
  if (cfg_.suites == 0) cfg_.suites = local_suites();
  if (cfg_.swarm_key) {
    psk_ = cfg_.swarm_key->bytes;
  } else {
    psk_ = blake2b_256(label(kOpenSwarm));
  }
  crypto_box_keypair(e_pk_.data(), e_sk_.data());
}

Handshake::~Handshake() {
  sodium_memzero(e_sk_.data(), e_sk_.size());
  sodium_memzero(psk_.data(), psk_.size());
  sodium_memzero(hs_i2r_.data(), hs_i2r_.size());
  sodium_memzero(hs_r2i_.data(), hs_r2i_.size());
}

Result<Handshake::Step> Handshake::fail(errc e) {
  state_ = State::failed;
  return e;
}

std::vector<std::uint8_t> Handshake::start() {
  m1_.assign(kM1Size, 0);
  std::memcpy(m1_.data(), kMagic, 4);
  m1_[4] = kVersion;
  m1_[5] = cfg_.suites;
  std::memcpy(m1_.data() + 6, e_pk_.data(), 32);
  auto mac = keyed_hash(psk_, {label(kM1Label), std::span<const std::uint8_t>(m1_.data(), 38)});
  std::memcpy(m1_.data() + 38, mac.data(), 32);
  state_ = State::sent_m1;
  return m1_;
}

bool Handshake::derive(const std::uint8_t* peer_e) {
  std::uint8_t dh[crypto_scalarmult_BYTES];
  if (crypto_scalarmult(dh, e_sk_.data(), peer_e) != 0) return false;  // low-order point
  Key master = keyed_hash(psk_, {label(kHsLabel), std::span<const std::uint8_t>(dh, sizeof dh),
                                 std::span<const std::uint8_t>(th2_)});
  sodium_memzero(dh, sizeof dh);
  Key app_i2r, app_r2i;
  crypto_kdf_derive_from_key(hs_i2r_.data(), 32, 1, kKdfCtx, master.data());
  crypto_kdf_derive_from_key(hs_r2i_.data(), 32, 2, kKdfCtx, master.data());
  crypto_kdf_derive_from_key(app_i2r.data(), 32, 3, kKdfCtx, master.data());
  crypto_kdf_derive_from_key(app_r2i.data(), 32, 4, kKdfCtx, master.data());
  sodium_memzero(master.data(), master.size());
  keys_.tx = role_ == Role::initiator ? app_i2r : app_r2i;
  keys_.rx = role_ == Role::initiator ? app_r2i : app_i2r;
  sodium_memzero(app_i2r.data(), 32);
  sodium_memzero(app_r2i.data(), 32);
  return true;
}

// What a side signs: its label, the transcript, and (initiator only) the responder's key.
std::vector<std::uint8_t> Handshake::to_sign(std::span<const std::uint8_t> lbl,
                                             const PublicKey* responder) const {
  std::vector<std::uint8_t> msg(lbl.begin(), lbl.end());
  msg.insert(msg.end(), th2_.begin(), th2_.end());
  if (responder) msg.insert(msg.end(), responder->begin(), responder->end());
  return msg;
}

void Handshake::seal_identity(const Key& k, std::span<const std::uint8_t> lbl,
                              const PublicKey* responder, std::uint8_t* out) const {
  std::uint8_t payload[kIdentityPayload];
  std::memcpy(payload, cfg_.self->public_key().data(), 32);
  const auto sig = cfg_.self->sign(to_sign(lbl, responder));
  std::memcpy(payload + 32, sig.data(), 64);
  hs_seal(k, th2_, payload, out);
}

bool Handshake::open_identity(const Key& k, const std::uint8_t* in,
                              std::span<const std::uint8_t> lbl, const PublicKey* responder) {
  std::uint8_t payload[kIdentityPayload];
  if (!hs_open(k, th2_, in, payload)) return false;
  PublicKey pk;
  Signature sig;
  std::memcpy(pk.data(), payload, 32);
  std::memcpy(sig.data(), payload + 32, 64);
  if (!verify_signature(pk, to_sign(lbl, responder), sig)) return false;
  keys_.peer_key = pk;
  keys_.peer_id = node_id_from_key(pk);
  return true;
}

Result<Handshake::Step> Handshake::on_message(std::span<const std::uint8_t> msg) {
  if (role_ == Role::responder && state_ == State::init) return responder_m1(msg);
  if (role_ == Role::initiator && state_ == State::sent_m1) return initiator_m2(msg);
  if (role_ == Role::responder && state_ == State::sent_m2) return responder_m3(msg);
  return fail(errc::protocol_violation);
}

Result<Handshake::Step> Handshake::responder_m1(std::span<const std::uint8_t> m) {
  if (m.size() != kM1Size || std::memcmp(m.data(), kMagic, 4) != 0) return fail(errc::malformed);
  if (m[4] != kVersion) return fail(errc::handshake_failed);
  auto mac = keyed_hash(psk_, {label(kM1Label), m.first(38)});
  if (sodium_memcmp(mac.data(), m.data() + 38, 32) != 0) return fail(errc::handshake_failed);
  const std::uint8_t common = m[5] & cfg_.suites;
  Suite suite;
  if (common & (1u << static_cast<int>(Suite::aes256gcm))) {
    suite = Suite::aes256gcm;
  } else if (common & (1u << static_cast<int>(Suite::xchacha20poly1305))) {
    suite = Suite::xchacha20poly1305;
  } else {
    return fail(errc::handshake_failed);
  }
  keys_.suite = suite;
  m1_.assign(m.begin(), m.end());
  const std::uint8_t suite_byte = static_cast<std::uint8_t>(suite);
  auto th1 = hash({m});
  th2_ = hash({th1, e_pk_, std::span<const std::uint8_t>(&suite_byte, 1)});
  if (!derive(m.data() + 6)) return fail(errc::handshake_failed);

  Step step;
  step.reply.assign(kM2Size, 0);
  std::memcpy(step.reply.data(), e_pk_.data(), 32);
  step.reply[32] = suite_byte;
  seal_identity(hs_r2i_, label(kRespLabel), nullptr, step.reply.data() + 33);
  state_ = State::sent_m2;
  return step;
}

Result<Handshake::Step> Handshake::initiator_m2(std::span<const std::uint8_t> m) {
  if (m.size() != kM2Size) return fail(errc::malformed);
  const std::uint8_t suite_byte = m[32];
  if (suite_byte != static_cast<std::uint8_t>(Suite::aes256gcm) &&
      suite_byte != static_cast<std::uint8_t>(Suite::xchacha20poly1305))
    return fail(errc::handshake_failed);
  if (!(cfg_.suites & (1u << suite_byte))) return fail(errc::handshake_failed);
  keys_.suite = static_cast<Suite>(suite_byte);
  auto th1 = hash({m1_});
  th2_ = hash({th1, m.first(32), m.subspan(32, 1)});
  if (!derive(m.data())) return fail(errc::handshake_failed);
  if (!open_identity(hs_r2i_, m.data() + 33, label(kRespLabel), nullptr))
    return fail(errc::handshake_failed);
  if (cfg_.expected_peer && *cfg_.expected_peer != keys_.peer_id) return fail(errc::wrong_peer);

  Step step;
  step.reply.assign(kM3Size, 0);
  seal_identity(hs_i2r_, label(kInitLabel), &keys_.peer_key, step.reply.data());
  step.done = true;
  state_ = State::done;
  return step;
}

Result<Handshake::Step> Handshake::responder_m3(std::span<const std::uint8_t> m) {
  if (m.size() != kM3Size) return fail(errc::malformed);
  if (!open_identity(hs_i2r_, m.data(), label(kInitLabel), &cfg_.self->public_key()))
    return fail(errc::handshake_failed);
  state_ = State::done;
  Step step;
  step.done = true;
  return step;
}

}  // namespace grove::transport
