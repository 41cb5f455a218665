// A group of members running one ring operation (RingAllReduce, RingAllGather) on the simulated
// gossip network, each with a random input: what the ring tests share.
#pragma once

#include <random>
#include <vector>

#include "sim/gossip_network.hpp"

namespace grove::gossip::testing {

inline OpId op_of(int k) {
  OpId op{};
  op[0] = static_cast<std::uint8_t>(k);
  op[1] = static_cast<std::uint8_t>(k >> 8);
  return op;
}

inline std::vector<float> vec(std::span<const float> s) {
  return {s.begin(), s.end()};
}

template <class Op, class Options>
struct RingSwarm {
  sim::GossipNetwork net;
  std::vector<NodeId> ids;
  std::vector<std::vector<float>> inputs;
  OpId op;
  Options opts;

  RingSwarm(std::uint64_t seed, std::size_t members, std::size_t n, Options o,
            sim::GossipLinkModel link = {})
      : net(seed, link), op(op_of(static_cast<int>(seed))), opts(std::move(o)) {
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::normal_distribution<float> d(0.0f, 0.01f);
    for (std::size_t i = 0; i < members; ++i) {
      ids.push_back(net.add_node());
      inputs.emplace_back(n);
      for (auto& x : inputs.back()) x = d(rng);
    }
  }
  RingSwarm& start() {
    for (std::size_t i = 0; i < ids.size(); ++i)
      net.attach(ids[i], Op::create(op, ids[i], ids, inputs[i], opts, net.now()).value());
    return *this;
  }
  Op* at(std::size_t i) { return static_cast<Op*>(net.protocol(ids[i], op)); }
  bool all_finished() {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (net.alive(ids[i]) && at(i) && !at(i)->finished()) return false;
    return true;
  }
  std::size_t index_of(const NodeId& id) const {
    return static_cast<std::size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
  }
};

}  // namespace grove::gossip::testing
