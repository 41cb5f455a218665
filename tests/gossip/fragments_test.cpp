// Streaming fragments in a simulated swarm (RoundOptions::fragments): round r averages and steps
// fragment r mod F of φ only; every round still ends with the same bits on every member, a member
// sends about 1/F of a whole round's bytes, φ reaches the targets' mean as whole-model DiLoCo
// does (each fragment every F rounds), and the swarm goes on through a kill and a joiner, which
// catches up by the fragments' deltas.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "gossip/round.hpp"
#include "gossip/state_delta.hpp"
#include "sim/swarm.hpp"
#include "sim/workload.hpp"
#include "tests/gossip/sim_swarm.hpp"

namespace grove::gossip {
namespace {

using sim::fast_options;
using sim::Swarm;
using testing::expect_identical_per_round;
using testing::ms;

sim::SwarmOptions options(std::size_t fragments, bool sparseloco = false) {
  auto o = fast_options(OuterMode::diloco);
  o.params = 4 * 4096 + 100;  // fragments of 4096 values and more
  o.round.fragments = fragments;
  if (sparseloco) {
    o.round.compressed = CompressedRounds::sparseloco(256, 16);
    o.round.diloco.lr = 1.0f;
    o.round.diloco.momentum = 0.0f;
  }
  return o;
}

struct Outcome {
  double distance = 0, bytes_per_round = 0, alone = 0;
  std::size_t averaged = 0;
};

Outcome run(std::size_t fragments, ms time) {
  Swarm s(61, options(fragments));
  testing::grow(s, 4, {ms(3000), {}});
  s.run_for(time);
  Outcome out;
  double bytes = 0;
  const std::size_t n = s.options().params;
  for (std::size_t i = 0; i < s.size(); ++i)
    for (const auto& r : s.reports(i)) {
      if (r.kind != RoundReport::Kind::round || r.local_only) continue;
      ++out.averaged;
      bytes += static_cast<double>(r.bytes_sent);
      // The round's slice, named in its report: fragment r mod F.
      const Slice want = slice_of(n, fragments, r.round % fragments);
      EXPECT_EQ(r.slice.lo, want.lo) << "round " << r.round;
      EXPECT_EQ(r.slice.end(n), want.end(n)) << "round " << r.round;
    }
  out.bytes_per_round = bytes / static_cast<double>(std::max<std::size_t>(out.averaged, 1));
  out.distance = testing::distance_to_mean_target(s, 0, {0, 1, 2, 3});
  expect_identical_per_round(s, 15);
  std::printf("fragments %zu: %zu rounds averaged, %.0f bytes a member a round, φ at %.3f\n",
              fragments, out.averaged, out.bytes_per_round, out.distance);
  return out;
}

TEST(Fragments, EachRoundTakesItsFragmentWithAQuarterOfTheBytes) {
  const Outcome whole = run(1, ms(120'000));
  const Outcome four = run(4, ms(120'000));
  EXPECT_GT(four.averaged, 40u);
  // A quarter of the values (plus the headers of as many messages).
  EXPECT_LT(four.bytes_per_round, 0.3 * whole.bytes_per_round);
  EXPECT_GT(four.bytes_per_round, 0.2 * whole.bytes_per_round);
  // The same rounds per fragment as whole-model rounds take: as close to the targets' mean.
  EXPECT_LT(whole.distance, 0.05);
  EXPECT_LT(four.distance, 0.1);
}

// Fragments with overlap: the next inner phase trains while a round runs, and the round's new φ
// is mixed into θ on its fragment only (the rest trains on); every round still ends with one φ,
// and φ comes as close to the targets' mean as without overlap.
TEST(Fragments, WithOverlapEachRoundMixesItsFragment) {
  for (const bool overlap : {false, true}) {
    Swarm s(61, options(4));
    sim::NodeSpec spec{ms(3000), {}};
    spec.overlap = overlap;
    testing::grow(s, 4, spec);
    s.run_for(ms(120'000));
    std::size_t averaged = 0;
    for (std::size_t i = 0; i < s.size(); ++i)
      for (const auto& r : s.reports(i))
        averaged += r.kind == RoundReport::Kind::round && !r.local_only;
    const double d = testing::distance_to_mean_target(s, 0, {0, 1, 2, 3});
    std::printf("fragments 4, overlap %d: %zu rounds averaged, φ at %.3f\n", overlap, averaged, d);
    EXPECT_GT(averaged, 40u) << "overlap " << overlap;
    EXPECT_LT(d, 0.1) << "overlap " << overlap;
    expect_identical_per_round(s, 15);
  }
}

// SparseLoCo with fragments: a member killed mid-run, a joiner that takes the state and
// averages with the group; every round one φ.
TEST(Fragments, SparseLoCoFragmentsGoOnThroughAKillAndAJoin) {
  Swarm s(67, options(4, true));
  const std::size_t j = testing::kill_and_join(s);
  EXPECT_LT(testing::distance_to_mean_target(s, 0, {0, 1, 3, j}), 0.9);
}

// A straggler left out of rounds catches up by the group's deltas, each of one fragment (version
// 2: a quarter of a whole delta's bytes), and ends every round it reaches with the group's bits.
TEST(Fragments, AStragglerCatchesUpByFragmentDeltas) {
  Swarm s(16, options(4));
  testing::grow(s, 4, {ms(3000), {}});
  const std::size_t slow = s.join(0, {ms(9000), {}});
  s.run_for(ms(150'000));
  const std::size_t n = s.options().params;
  std::size_t replays = 0;
  for (const auto& r : s.reports(slow)) {
    if (r.kind != RoundReport::Kind::synced ||
        r.note.find("replayed the deltas") == std::string::npos)
      continue;
    ++replays;
    // One or two fragments' deltas (and their headers), against a whole delta's quarter.
    EXPECT_LE(r.bytes_received, 2 * delta_size(WireCodec::fp16, n, n / 4 + kSliceAlign)) << r.note;
  }
  EXPECT_GE(replays, 2u);
  expect_identical_per_round(s, 15);
}

// NoLoCo with fragments (compressed pairs): a pair exchanges and averages one fragment drawn
// from its window — both draw the same, or the exchange of unequal tensors would fail — and the
// rest takes the local-only step: about a quarter of the bytes a round, every fragment drawn,
// φ pulled towards the targets' mean (more slowly: each value is averaged a quarter as often),
// through a kill and a joiner.
TEST(Fragments, NoLoCoPairsAverageAFragmentDrawnFromTheirWindow) {
  const auto run_noloco = [](std::size_t fragments, bool churn) {
    auto o = fast_options(OuterMode::noloco);
    o.params = 4 * 4096 + 100;
    o.round.fragments = fragments;
    Swarm s(73, o);
    testing::grow(s, 4, {ms(3000), {}});
    std::size_t joiner = 0;
    if (churn) {
      s.run_for(ms(40'000));
      s.kill(2);
      s.run_for(ms(20'000));
      joiner = s.join(0, {ms(3000), {}});
      s.run_for(ms(100'000));
    } else {
      s.run_for(ms(160'000));
    }
    Outcome out;
    double bytes = 0;
    std::set<std::size_t> drawn;
    std::size_t joiner_averaged = 0;
    for (std::size_t i = 0; i < s.size(); ++i)
      for (const auto& r : s.reports(i)) {
        if (r.kind != RoundReport::Kind::round || r.local_only) continue;
        ++out.averaged;
        bytes += static_cast<double>(r.bytes_sent);
        drawn.insert(r.fragment);
        EXPECT_TRUE(r.slice.whole(o.params)) << "NoLoCo: all of θ from φ";
        joiner_averaged += churn && i == joiner;
      }
    EXPECT_EQ(drawn.size(), fragments);
    if (churn) {
      EXPECT_GE(joiner_averaged, 5u);
    }
    out.bytes_per_round = bytes / static_cast<double>(std::max<std::size_t>(out.averaged, 1));
    const std::vector<std::size_t> live =
        churn ? std::vector<std::size_t>{0, 1, 3, joiner} : std::vector<std::size_t>{0, 1, 2, 3};
    for (std::size_t i : live)
      out.distance = std::max(out.distance, testing::distance_to_mean_target(s, i, live));
    // A member that never averaged would hold its own target: this far from the mean.
    double d = 0, spread = 0;
    const auto k_live = static_cast<double>(live.size());
    for (std::size_t k = 0; k < o.params; ++k) {
      double mean = 0;
      for (std::size_t i : live) mean += s.target(i)[k] / k_live;
      d += (s.target(live[0])[k] - mean) * (s.target(live[0])[k] - mean);
      for (std::size_t i : live)
        spread += (s.target(i)[k] - mean) * (s.target(i)[k] - mean) / k_live;
    }
    out.alone = std::sqrt(d / spread);
    std::printf(
        "noloco, fragments %zu%s: %zu rounds averaged, %.0f bytes a member a round, "
        "φ at %.3f (farthest member; alone %.3f)\n",
        fragments, churn ? " (a kill, a join)" : "", out.averaged, out.bytes_per_round,
        out.distance, out.alone);
    return out;
  };
  const Outcome whole = run_noloco(1, false);
  const Outcome four = run_noloco(4, false);
  EXPECT_GT(four.averaged, 60u);
  EXPECT_LT(four.bytes_per_round, 0.3 * whole.bytes_per_round);
  EXPECT_GT(four.bytes_per_round, 0.2 * whole.bytes_per_round);
  // Averaging pulls every member towards the mean; a quarter of the values a round, less far.
  EXPECT_LT(whole.distance, 0.7 * whole.alone);
  EXPECT_LT(four.distance, 0.95 * four.alone);
  const Outcome churned = run_noloco(4, true);
  EXPECT_GT(churned.averaged, 40u);
  EXPECT_LT(churned.distance, 0.95 * churned.alone);
}

}  // namespace
}  // namespace grove::gossip
