// Helpers for the round engine's tests in a simulated swarm (sim::Swarm).
#pragma once

#include <gtest/gtest.h>

#include <map>

#include "gossip/round.hpp"
#include "sim/swarm.hpp"

namespace grove::gossip::testing {

using sim::Swarm;
using ms = std::chrono::milliseconds;

// Builds a swarm of `n` nodes (node 0 bootstraps) and waits until every node has its state.
inline void grow(Swarm& s, std::size_t n, sim::NodeSpec spec = {}) {
  s.bootstrap(spec);
  for (std::size_t i = 1; i < n; ++i) s.join(0, spec);
  ASSERT_TRUE(s.run_until(
      [&] {
        for (std::size_t i = 0; i < s.size(); ++i)
          if (!s.engine(i).has_state()) return false;
        return true;
      },
      ms(60'000)));
}

// Every member that completed DiLoCo round r reports the same slow-weights hash for it.
inline void expect_identical_per_round(Swarm& s, std::size_t min_rounds_checked) {
  std::map<std::uint64_t, std::map<Digest, int>> hashes;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!s.alive(i)) continue;
    for (const auto& r : s.reports(i))
      if (r.kind == RoundReport::Kind::round && r.mode == OuterMode::diloco && !r.local_only)
        ++hashes[r.round][r.weights_hash];
  }
  std::size_t checked = 0;
  for (const auto& [round, h] : hashes) {
    EXPECT_EQ(h.size(), 1u) << "round " << round << " ended with " << h.size() << " different φ";
    checked += h.size() == 1;
  }
  EXPECT_GE(checked, min_rounds_checked);
  for (std::size_t i = 0; i < s.size(); ++i)
    if (s.alive(i)) {
      EXPECT_EQ(s.engine(i).mismatches(), 0u) << "node " << i;
    }
}

}  // namespace grove::gossip::testing
