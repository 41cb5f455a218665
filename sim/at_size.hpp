// A swarm at model size (SwarmOptions::stands_for): two nodes pair, then a third joins and syncs
// the whole state, over access lines of a given rate. What it measures: the third node's join
// against the state's bytes at the line rate, the rounds each node averaged, the mean round
// time, and every report note that says a deadline fired. Used by `grove-sim size` and the
// simulator's tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gossip/mode.hpp"
#include "gossip/protocol.hpp"

namespace grove::sim {

struct SizeSetup {
  double params = 8e9;  ///< parameters the state stands for (φ carries 1024 values)
  double mbit = 100;    ///< every node's line (both ways)
  gossip::Time one_way{25};
  gossip::OuterMode mode = gossip::OuterMode::noloco;
  gossip::Time inner{600'000};  ///< the inner phase
  /// The nodes train their next inner phase while the round runs (NodeSpec::overlap).
  bool overlap = false;
  /// The outer step of the first two nodes and the joiner (NodeSpec::step_time; missing: 0):
  /// nodes whose steps differ end a round's exchange together but are ready again apart.
  std::vector<gossip::Time> step_time;
  std::uint64_t seed = 77;
};

struct SizeOutcome {
  bool completed = false;  ///< the joiner synced and ended two rounds, and node 0 two, in time
  double join_s = 0;       ///< from its start to its synced state
  double bound_s = 0;      ///< the state's bytes (8 per parameter) at the line rate
  double round_s = 0;      ///< mean time between the first node's rounds, once two nodes pair
  std::vector<int> averaged, rounds;  ///< per node, once two nodes pair
  std::vector<std::string> fired;     ///< report notes that say a deadline fired
  std::size_t joiner = 2;
  double wall_s = 0;
};

SizeOutcome run_at_size(const SizeSetup& s);

}  // namespace grove::sim
