// Helpers for the round engine's tests in a simulated swarm (sim::Swarm).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <span>

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

// Grows `s` to 4 nodes, kills node 2 after 40 s, joins a fifth node 30 s later and runs 90 s
// more: the joiner averaged at least 5 rounds, the survivors ended 20 rounds each, and every
// round that several members ended ended with one φ. Returns the joiner's index.
inline std::size_t kill_and_join(Swarm& s) {
  grow(s, 4, {ms(3000), {}});
  s.run_for(ms(40'000));
  s.kill(2);
  s.run_for(ms(30'000));
  const std::size_t j = s.join(0, {ms(3000), {}});
  s.run_for(ms(90'000));
  std::size_t joiner_averaged = 0;
  for (const auto& r : s.reports(j))
    joiner_averaged += r.kind == RoundReport::Kind::round && !r.local_only;
  EXPECT_GE(joiner_averaged, 5u);
  for (std::size_t i : {0u, 1u, 3u}) EXPECT_GE(s.rounds(i), 20u) << "node " << i;
  expect_identical_per_round(s, 20);
  return j;
}

// A member whose θ lands 1000 away from φ every inner phase from its second on (a fault, or an
// attack by a member running this code), joined to `s` through node 0; returns its index.
inline std::size_t join_outsized_member(Swarm& s) {
  sim::NodeSpec bad{ms(3000), {}};
  bad.after_inner = [](std::size_t phase, std::span<float> theta) {
    if (phase >= 1)
      for (auto& v : theta) v += 1000.0f;
  };
  return s.join(0, bad);
}

// Every member ended at least `rounds` rounds with every value of φ within ±`bound` and no step
// refused; only `outlier`'s pseudo-gradient was scaled down, at least `clipped` times.
inline void expect_only_outlier_clipped(Swarm& s, std::size_t outlier, std::size_t rounds,
                                        float bound, std::size_t clipped) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    EXPECT_GE(s.rounds(i), rounds) << "node " << i;
    float most = 0;
    for (const float v : s.engine(i).state().phi.to_vector()) most = std::max(most, std::abs(v));
    EXPECT_LT(most, bound) << "node " << i;
    std::size_t n = 0;
    for (const auto& r : s.reports(i)) {
      EXPECT_EQ(r.note.find("not taken"), std::string::npos) << r.note;
      n += r.kind == RoundReport::Kind::round &&
           r.note.find("pseudo-gradient scaled down") != std::string::npos;
    }
    if (i == outlier) {
      EXPECT_GE(n, clipped);
    } else {
      EXPECT_EQ(n, 0u) << "node " << i;
    }
  }
}

// How far φ is from the mean of the targets of `nodes`, over how far those are from it.
inline double distance_to_mean_target(Swarm& s, std::size_t node,
                                      const std::vector<std::size_t>& nodes) {
  const auto& phi = s.engine(node).state().phi;
  const auto n = static_cast<double>(nodes.size());
  double d = 0, spread = 0;
  for (std::size_t k = 0; k < phi.size(); ++k) {
    double mean = 0;
    for (std::size_t i : nodes) mean += s.target(i)[k];
    mean /= n;
    d += (phi.data()[k] - mean) * (phi.data()[k] - mean);
    for (std::size_t i : nodes) spread += (s.target(i)[k] - mean) * (s.target(i)[k] - mean) / n;
  }
  return std::sqrt(d / spread);
}

}  // namespace grove::gossip::testing
