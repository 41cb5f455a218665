// Input layout of the gossip fuzz target (shared with make_seeds):
//   [selector][gossip message]   selector bits 0-1: sender (peer index, 0..2; 3 = a stranger),
//                                bit 2: 0 = the all-reduce core, 1 = the exchange core;
//                                bit 4 (bit 2 clear): an all-gather core instead of the
//                                all-reduce, bits 5-6 pick which (gather_codec).
// The cores under test: a RingAllReduce as member 1 of the ring [peer 0, peer 1, peer 2]
// (fp16, 768 values, chunks of 256: one chunk per segment), and a GroupExchange as peer 1 of the
// pair [peer 1, peer 0] (fp32, one tensor of 512 values, chunks of 256); three RingAllGathers as
// member 1 of the same ring (768 values, pieces of 256: top-k 8 of 128 with fp32 values, the
// same with 2-bit values, E3M0).
#pragma once

#include <cstdint>

#include "gossip/allgather.hpp"
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
constexpr int kGathers = 3;
inline gossip::GatherCodec gather_codec(int i) {
  gossip::GatherCodec c;
  c.kind = i == 2 ? gossip::WireCodec::e3m0 : gossip::WireCodec::topk;
  c.topk = {128, 8, i == 1};
  return c;
}

}  // namespace grove::fuzz::gossip_fuzz
