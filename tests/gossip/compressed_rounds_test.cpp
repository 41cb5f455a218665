// DiLoCo-mode rounds with compressed messages (RoundOptions::compressed) in a simulated swarm:
// SparseLoCo (top-k of an error buffer, fp32 or 2-bit values, no momentum) and E3M0 DiLoCo end
// every round with the same bits on every member, move φ to where the fp16 all-reduce moves it
// (the mean of the members' targets), send a fraction of its bytes, and go on through a member
// killed mid-run and a joiner.
#include <gtest/gtest.h>

#include <cmath>

#include "gossip/round.hpp"
#include "sim/swarm.hpp"
#include "sim/workload.hpp"
#include "tests/gossip/sim_swarm.hpp"

namespace grove::gossip {
namespace {

using sim::fast_options;
using sim::Swarm;
using sim::SwarmOptions;
using testing::distance_to_mean_target;
using testing::expect_identical_per_round;
using testing::expect_only_outlier_clipped;
using testing::grow;
using testing::join_outsized_member;
using testing::ms;

enum class Kind { dense, sparseloco, sparseloco_2bit, e3m0 };

const char* name(Kind k) {
  switch (k) {
    case Kind::dense:
      return "fp16 all-reduce";
    case Kind::sparseloco:
      return "SparseLoCo";
    case Kind::sparseloco_2bit:
      return "SparseLoCo 2-bit";
    case Kind::e3m0:
      return "E3M0 DiLoCo";
  }
  return "?";
}

SwarmOptions options(Kind k, bool mlp = false) {
  auto o = fast_options(OuterMode::diloco);
  o.params = 4096;
  if (mlp) o.workload = sim::make_tiny_mlp(7);
  if (k == Kind::dense) return o;
  CompressedRounds c;
  if (k == Kind::e3m0) {
    c = CompressedRounds::e3m0();
  } else {
    // 16 of each 256 values (Grove's 64 of 4096, at this φ's size).
    const bool two = k == Kind::sparseloco_2bit;
    c = mlp ? CompressedRounds::sparseloco(64, 8, two) : CompressedRounds::sparseloco(256, 16, two);
    o.round.diloco.lr = 1.0f;
    o.round.diloco.momentum = 0.0f;
  }
  o.round.compressed = c;
  return o;
}

struct Outcome {
  double distance = 0, loss = 0;
  double bytes_per_round = 0;  // sent by a member per averaged round
  std::size_t rounds = 0, averaged = 0;
};

Outcome run(Kind k, std::uint64_t seed, bool mlp = false, ms time = ms(120'000)) {
  Swarm s(seed, options(k, mlp));
  grow(s, 4, {ms(3000), {}});
  s.run_for(time);
  Outcome out;
  double bytes = 0;
  for (std::size_t i = 0; i < s.size(); ++i)
    for (const auto& r : s.reports(i)) {
      if (r.kind != RoundReport::Kind::round) continue;
      ++out.rounds;
      if (r.local_only) continue;
      ++out.averaged;
      bytes += static_cast<double>(r.bytes_sent);
    }
  out.bytes_per_round = bytes / static_cast<double>(std::max<std::size_t>(out.averaged, 1));
  expect_identical_per_round(s, 15);
  if (mlp) {
    out.loss = s.loss(0);
    std::printf(
        "%-17s %zu rounds, %zu averaged, %.0f bytes sent a member a round, held-out loss "
        "%.4f (from %.4f)\n",
        name(k), out.rounds, out.averaged, out.bytes_per_round, out.loss,
        s.options().workload->loss(s.options().workload->initial()));
  } else {
    out.distance = distance_to_mean_target(s, 0, {0, 1, 2, 3});
    std::printf(
        "%-17s %zu rounds, %zu averaged, %.0f bytes sent a member a round, φ at %.3f of "
        "the targets' spread from their mean\n",
        name(k), out.rounds, out.averaged, out.bytes_per_round, out.distance);
  }
  return out;
}

// On the tiny MLP (non-identical data, 808 parameters), 4 members, 50 rounds each.
TEST(CompressedRounds, EveryAlgorithmEndsRoundsBitIdenticalAndLearns) {
  const Outcome dense = run(Kind::dense, 47, true, ms(300'000));
  for (Kind k : {Kind::sparseloco, Kind::sparseloco_2bit, Kind::e3m0}) {
    SCOPED_TRACE(name(k));
    const Outcome c = run(k, 47, true, ms(300'000));
    EXPECT_GE(c.averaged * 10, c.rounds * 9);
    // Measured (47): fp16 all-reduce 0.411, E3M0 0.409 (0.419 when it all-gathered its
    // messages), SparseLoCo 0.699, 2-bit 0.706, from 2.299. (SparseLoCo has no outer momentum:
    // on this problem it learns more slowly per round.)
    EXPECT_LT(c.loss, k == Kind::e3m0 ? dense.loss * 1.05 : 0.8);
    // The bytes a member sends a round, against the fp16 all-reduce's (2 × 3/4 × 2 bytes a
    // value): E3M0 2 × 3/4 × ~0.52 (the all-reduce of 4-bit partial sums; measured 2.98×, 1.7×
    // when it all-gathered), top-k 8 of 64 3 × 6 × 8 / 64, 2-bit 3 × (4 + 2 + 16) / 64.
    const double ratio = dense.bytes_per_round / c.bytes_per_round;
    EXPECT_GT(ratio, k == Kind::e3m0 ? 2.7 : (k == Kind::sparseloco ? 1.25 : 2.4)) << ratio;
  }
}

// On the quadratic toy (each node pulls θ to its own target) the engine's SparseLoCo moves φ
// as a plain model of the rule does (e = 0.95 e + Δ, top-16 of 256 sent and subtracted, φ −=
// mean): 0.66 of the targets' spread from their mean after 20 rounds (the numpy model: 0.664
// for targets of the same law), where it stays — the top-k of each member's own pull leaves a
// bias in the mean that error feedback does not remove.
TEST(CompressedRounds, SparseLoCoMovesPhiAsAModelOfTheRule) {
  const Outcome c = run(Kind::sparseloco, 41);
  EXPECT_GT(c.distance, 0.55);
  EXPECT_LT(c.distance, 0.75);
  const Outcome e = run(Kind::e3m0, 41);
  EXPECT_LT(e.distance, 0.15);
}

// A member killed mid-run and a joiner: the all-gather leaves the dead member out, the joiner
// takes the group's state (without anybody's error buffer) and averages with it.
TEST(CompressedRounds, SparseLoCoGoesOnThroughAKillAndAJoin) {
  Swarm s(43, options(Kind::sparseloco, true));
  testing::kill_and_join(s);
  const auto& w = *s.options().workload;
  EXPECT_LT(s.loss(0), 0.5 * w.loss(w.initial()));
}

// A member whose θ lands 1000 away from φ every phase declares its error buffer's norm; the
// group scales its message down to 1.5× the median of the declared norms (the all-gather scales
// the buffer a piece at a time as it reads it). φ stays near the targets and bit-identical.
TEST(CompressedRounds, AnOutsizedErrorBufferIsScaledDown) {
  for (Kind k : {Kind::sparseloco, Kind::e3m0}) {
    SCOPED_TRACE(name(k));
    Swarm s(49, options(k));
    grow(s, 4, {ms(3000), {}});
    const std::size_t outlier = join_outsized_member(s);
    s.run_for(ms(600'000));
    // (Unscaled, the mean would pass the bound of the declared norms: no step would be taken; a
    // fifth of −1000 would move φ by ~200 a round. Measured after 100 rounds: SparseLoCo's φ
    // within 2.5, E3M0's 2.3; with the bound at 4× the median, 4.9 and 511 — E3M0's honest
    // buffers, and so the bound, grew round after round.)
    expect_only_outlier_clipped(s, outlier, 90, 4.0f, 80);
    expect_identical_per_round(s, 90);
  }
}

}  // namespace
}  // namespace grove::gossip
