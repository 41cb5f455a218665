// Streaming fragments in a simulated swarm (RoundOptions::fragments): round r averages and steps
// fragment r mod F of φ only; every round still ends with the same bits on every member, a member
// sends about 1/F of a whole round's bytes, φ reaches the targets' mean as whole-model DiLoCo
// does (each fragment every F rounds), and the swarm goes on through a kill and a joiner, which
// catches up by the fragments' deltas.
#include <gtest/gtest.h>

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
  double distance = 0, bytes_per_round = 0;
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

}  // namespace
}  // namespace grove::gossip
