// What the DHT fuzz target (dht_fuzz.cpp) and its seed generator (make_seeds.cpp) agree on: the
// fuzzed node's identity and clock, the fixed peers, the keys its own operations use, and the
// layout of an input.
//
// An input is [selector][message bytes]:
//   selector bits 0-1  which of the kPeers fixed peers sends it
//   selector bit  2    reply mode: when the message decodes, its txid is replaced by that of a
//                      request the node has sent (one of a matching type when there is one) and
//                      it comes from that request's destination, so that replies reach the
//                      lookup/put/ping callbacks; with no message bytes, the request's send fails
//   selector bits 3-7  milliseconds the clock advances before the message (0-31); in reply mode
//                      also which pending request is answered
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "dht/key.hpp"
#include "dht/record.hpp"
#include "transport/identity.hpp"

namespace grove::fuzz::dht_fuzz {

/// The fuzzed node's clock starts here (the simulator's epoch: a realistic wall-clock value, so
/// record expiry behaves as on a real node) whenever the node is (re)created.
inline constexpr dht::Time kEpoch{1'780'000'000'000};
/// Seed records expire this long after kEpoch: valid for every input of a node's life.
inline constexpr dht::Time kRecordTtl{std::chrono::hours(1)};
inline constexpr char kSelfAddress[] = "me:1";
inline constexpr std::uint64_t kNodeSeed = 0x6772'6f76'6564'6874;  // "grovedht"

inline constexpr std::size_t kPeers = 4;
inline constexpr std::uint8_t kPeerMask = 0x03;
inline constexpr std::uint8_t kReplyBit = 0x04;
inline constexpr int kAdvanceShift = 3;

inline std::uint8_t selector(std::size_t peer, bool reply_mode, unsigned advance_ms = 8) {
  return static_cast<std::uint8_t>((peer & kPeerMask) | (reply_mode ? kReplyBit : 0) |
                                   ((advance_ms & 31u) << kAdvanceShift));
}

inline transport::Identity identity_of(std::uint8_t tag) {
  std::array<std::uint8_t, 32> seed{};
  for (std::size_t i = 0; i < seed.size(); ++i) seed[i] = static_cast<std::uint8_t>(tag + 7 * i);
  return transport::Identity::from_seed(seed);
}
inline transport::Identity node_identity() {
  return identity_of(0xA0);
}
/// Peer i (also signs seed records); i < kPeers are the senders, more are third parties.
inline transport::Identity peer_identity(std::size_t i) {
  return identity_of(static_cast<std::uint8_t>(0xB0 + i));
}
inline std::string peer_address(std::size_t i) {
  return "peer" + std::to_string(i) + ":1";
}
/// Keys of the node's own get/put operations (seed records are stored under them).
inline constexpr std::size_t kKeys = 2;
inline dht::Key fuzz_key(std::size_t i) {
  return dht::key_of("grove-fuzz-" + std::to_string(i));
}

}  // namespace grove::fuzz::dht_fuzz
