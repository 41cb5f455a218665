// Input layout of the gossip fuzz target (shared with make_seeds):
//   [selector][gossip message]   selector bits 0-1: sender (peer index, 0..2; 3 = a stranger),
//                                bit 2: 0 = the all-reduce core, 1 = the exchange core.
// The cores under test: a RingAllReduce as member 1 of the ring [peer 0, peer 1, peer 2]
// (fp16, 768 values, chunks of 256: one chunk per segment), and a GroupExchange as peer 1 of the
// pair [peer 1, peer 0] (fp32, one tensor of 512 values, chunks of 256).
#pragma once

#include <cstdint>

#include "gossip/wire.hpp"

namespace grove::fuzz::gossip_fuzz {

inline gossip::NodeId peer(int i) {
  gossip::NodeId id{};
  id[0] = static_cast<std::uint8_t>(i + 1);
  return id;
}
inline gossip::OpId op() {
  gossip::OpId o{};
  o[0] = 0x42;
  return o;
}
constexpr std::size_t kRingValues = 768;
constexpr std::size_t kExchangeValues = 512;
constexpr std::size_t kChunk = 256;

}  // namespace grove::fuzz::gossip_fuzz
