// Streaming fragments below the round engine: slice_of cuts φ into contiguous, aligned, non-empty
// fragments; a DiLoCo step of one slice (StepWork::slice) changes that part of φ and the
// momentum only, exactly as the whole step would there; its delta (version 2, the slice's values
// only) replays to the very bits and is refused on a state it does not fit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gossip/slice.hpp"
#include "gossip/state_delta.hpp"
#include "gossip/step_work.hpp"
#include "optim/codecs.hpp"

namespace grove::gossip {
namespace {

TEST(Slice, FragmentsCoverPhiInOrderAlignedAndNonEmpty) {
  for (const std::size_t n : {std::size_t{7}, std::size_t{4096}, std::size_t{10'000},
                              std::size_t{124'672}, std::size_t{1} << 30}) {
    for (const std::size_t f : {1, 2, 3, 4, 7, 64}) {
      if (n < f) continue;
      std::size_t at = 0;
      for (std::size_t k = 0; k < f; ++k) {
        const Slice s = slice_of(n, f, k);
        EXPECT_EQ(s.lo, at) << n << " " << f << " " << k;
        EXPECT_GT(s.size(n), 0u) << n << " " << f << " " << k;
        if (n >= f * kSliceAlign && k + 1 < f) {
          EXPECT_EQ(s.end(n) % kSliceAlign, 0u);
        }
        // About equal: within an alignment unit (and a rounding) of n / f.
        const double share = static_cast<double>(n) / static_cast<double>(f);
        const double unit = n >= f * kSliceAlign ? kSliceAlign : 1;
        EXPECT_NEAR(static_cast<double>(s.size(n)), share, 2 * unit + 1);
        at = s.end(n);
      }
      EXPECT_EQ(at, n);
    }
  }
  EXPECT_TRUE(slice_of(100, 1, 0).whole(100));
  EXPECT_TRUE(Slice{}.whole(100));
}

constexpr std::size_t kN = 20'000;

// φ and a momentum of kN values, different at every position (seeded).
optim::OuterState state_of(unsigned seed) {
  optim::OuterState s;
  s.round = 4;
  s.phi = optim::Floats::zeros(kN, {});
  s.momentum = optim::Floats::zeros(kN, {});
  for (std::size_t i = 0; i < kN; ++i) {
    s.phi.data()[i] = std::sin(0.37f * static_cast<float>(i + seed));
    s.momentum.data()[i] = 0.01f * std::cos(0.11f * static_cast<float>(i * seed));
  }
  return s;
}

std::vector<float> fp16_values(unsigned seed, std::size_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.01f);
  std::vector<float> d(n);
  for (auto& v : d) v = optim::half_to_float(optim::float_to_half(g(rng)));
  return d;
}

// (Round 5's step: with an outer warm-up of 10 rounds, lr 0.88 and momentum 0.36; the replay
// takes the same from the delta's round.)
void slice_step_and_replay(const optim::DiLoCoConfig& cfg) {
  const auto s0 = state_of(3);
  const Slice slice = slice_of(kN, 3, 1);
  const std::size_t lo = slice.lo, hi = slice.end(kN), len = hi - lo;
  const auto d = fp16_values(5, len);

  StepWork w;
  w.kind = StepWork::Kind::diloco_ring;
  w.mode = OuterMode::diloco;
  w.state = s0;
  w.state.round = 5;
  w.diloco = cfg;
  w.slice = slice;
  w.ring = d;
  w.delta_store = memory_blob_store();
  w.delta_from = weights_hash(s0.phi);
  w.run();
  ASSERT_TRUE(w.error.empty()) << w.error;
  ASSERT_TRUE(w.dropped.empty()) << w.dropped;

  // The whole step with Δ zero outside the slice would change the momentum there (μ·m): the
  // slice's step leaves it alone. Inside, the same bits as the whole step.
  auto want = s0;
  {
    std::vector<float> phi = want.phi.to_vector(), m = want.momentum.to_vector();
    optim::diloco_step(std::span(phi).subspan(lo, len), std::span(m).subspan(lo, len), d,
                       cfg.at_round(5));
    want.phi = phi;
    want.momentum = m;
  }
  EXPECT_EQ(w.state.phi.to_vector(), want.phi.to_vector());
  EXPECT_EQ(w.state.momentum.to_vector(), want.momentum.to_vector());
  EXPECT_EQ(w.hash, weights_hash(want.phi));

  // The delta holds the slice's values only (fp16: 2 bytes each) and replays to those bits.
  ASSERT_TRUE(w.delta);
  EXPECT_EQ(w.delta->size(), kSliceDeltaHeaderBytes + 2 * len);
  EXPECT_EQ(w.delta->size(), delta_size(WireCodec::fp16, kN, len));
  const auto h = read_delta_header(*w.delta);
  ASSERT_TRUE(h) << h.text();
  EXPECT_EQ(h->lo, lo);
  EXPECT_EQ(h->count, len);
  EXPECT_EQ(h->values, kN);
  auto s = s0;
  Digest hash = weights_hash(s.phi);
  ASSERT_TRUE(replay_delta(*w.delta, s, hash, cfg));
  EXPECT_EQ(s.round, 5u);
  EXPECT_EQ(hash, w.hash);
  EXPECT_EQ(s.phi.to_vector(), want.phi.to_vector());
  EXPECT_EQ(s.momentum.to_vector(), want.momentum.to_vector());

  // On a state of another size it is refused, the state unchanged.
  optim::OuterState small;
  small.round = 4;
  small.phi = std::vector<float>(lo + len / 2, 0.5f);
  small.momentum = std::vector<float>(lo + len / 2, 0.0f);
  Digest hs = weights_hash(small.phi);
  EXPECT_FALSE(replay_delta(*w.delta, small, hs, cfg));
  EXPECT_EQ(small.round, 4u);
}

TEST(Slice, ASlicesStepChangesThatPartOnlyAndItsDeltaReplays) {
  slice_step_and_replay({0.7f, 0.9f});
}

TEST(Slice, AStepInTheOuterWarmUpReplaysWithItsRoundsNumbers) {
  const optim::DiLoCoConfig cfg{0.7f, 0.9f, 10};
  EXPECT_FLOAT_EQ(cfg.at_round(5).lr, 0.88f);
  EXPECT_FLOAT_EQ(cfg.at_round(5).momentum, 0.36f);
  slice_step_and_replay(cfg);
}

// A slice's lone step (no partner, DiLoCo) and its prepare (‖Δ‖ over the slice) read that part.
TEST(Slice, PrepareAndTheLoneStepTakeTheSlice) {
  const optim::DiLoCoConfig cfg{0.7f, 0.9f};
  const auto s0 = state_of(7);
  auto theta = s0.phi.to_vector();
  for (auto& v : theta) v += 0.25f;  // Δ = −0.25 everywhere
  const Slice slice = slice_of(kN, 4, 3);
  const std::size_t lo = slice.lo, hi = slice.end(kN);

  // The same job but for its kind: a prepare, then a lone step.
  const auto job = [&](StepWork::Kind kind) {
    StepWork w;
    w.kind = kind;
    w.mode = OuterMode::diloco;
    w.state = s0;
    w.theta = theta;
    w.diloco = cfg;
    w.slice = slice;
    w.run();
    return w;
  };
  EXPECT_NEAR(job(StepWork::Kind::prepare).norm, 0.25 * std::sqrt(static_cast<double>(hi - lo)),
              1e-3);
  // Alone, the slice keeps its inner phase (φ = θ there), the momentum stays the group's.
  const StepWork w = job(StepWork::Kind::local);
  const auto phi = w.state.phi.to_vector(), phi0 = s0.phi.to_vector();
  EXPECT_EQ(w.state.momentum.to_vector(), s0.momentum.to_vector());
  for (std::size_t i = 0; i < kN; ++i) {
    if (i < lo || i >= hi) {
      ASSERT_EQ(phi[i], phi0[i]) << i;
    } else {
      ASSERT_EQ(phi[i], theta[i]) << i;
    }
  }
}

// NoLoCo alone: φ = θ everywhere, the momentum decays by α (nothing new was added to it).
TEST(Slice, ANoLoCoMemberAloneKeepsItsInnerPhaseAndItsMomentumFades) {
  const auto s0 = state_of(9);
  auto theta = s0.phi.to_vector();
  for (auto& v : theta) v -= 0.125f;
  StepWork w;
  w.kind = StepWork::Kind::local;
  w.mode = OuterMode::noloco;
  w.state = s0;
  w.theta = theta;
  w.noloco = {0.5f, 0.7f, 0.7f, 0.3f};
  w.run();
  ASSERT_TRUE(w.error.empty()) << w.error;
  EXPECT_EQ(w.state.phi.to_vector(), theta);
  const auto m = w.state.momentum.to_vector(), m0 = s0.momentum.to_vector();
  for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(m[i], 0.5f * m0[i]) << i;
}

// A lone member of compressed rounds applies its whole error buffer (what it has not sent yet,
// this phase's Δ included): φ −= e, e = 0; no outer momentum.
TEST(Slice, ALoneMemberOfCompressedRoundsAppliesItsWholeErrorBuffer) {
  const auto s0 = state_of(11);
  StepWork w;
  w.kind = StepWork::Kind::local;
  w.mode = OuterMode::diloco;
  w.state = s0;
  w.state.error = optim::Floats::zeros(kN, {});
  for (std::size_t i = 0; i < kN; ++i) w.state.error.data()[i] = 0.001f * static_cast<float>(i % 7);
  const auto e0 = w.state.error.to_vector();
  w.theta = s0.phi.to_vector();
  w.compressed = CompressedRounds::sparseloco(4096, 64, false, 0.95f);
  w.error_has_delta = true;
  w.diloco = {0.7f, 0.9f};
  w.run();
  ASSERT_TRUE(w.error.empty()) << w.error;
  const auto phi = w.state.phi.to_vector(), phi0 = s0.phi.to_vector();
  for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(phi[i], phi0[i] - e0[i]) << i;
  for (float v : w.state.error.to_vector()) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(w.state.momentum.to_vector(), s0.momentum.to_vector());
}

// NoLoCo with fragments (compressed pairs): the pair's means over the slice, the local-only step
// elsewhere — in both forms (β = γ: θ's mean; β ≠ γ: the means of Δ and of φ), exactly what
// the whole step gives with ours outside the slice.
TEST(Slice, ANoLoCoPairStepsItsFragmentWithTheMeanAndTheRestAlone) {
  const auto s0 = state_of(11);
  auto theta = s0.phi.to_vector();
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (auto& v : theta) v += d(g);
  const Slice slice = slice_of(kN, 4, 1);
  const std::size_t lo = slice.lo, hi = slice.end(kN);
  // The partner's θ and φ, other than ours.
  std::vector<float> theta_j(theta), phi_j = s0.phi.to_vector();
  for (std::size_t i = 0; i < kN; ++i) {
    theta_j[i] += d(g);
    phi_j[i] += 0.5f * d(g);
  }
  for (const float gamma : {0.7f, 0.4f}) {
    const optim::NoLoCoConfig cfg{0.5f, 0.7f, gamma};
    const auto phi0 = s0.phi.to_vector();
    // The pair's means: of θ (β = γ), or of Δ and of φ, over the whole model...
    std::vector<float> mean(kN), phi_mean(kN), own_delta(kN);
    for (std::size_t i = 0; i < kN; ++i) {
      own_delta[i] = phi0[i] - theta[i];
      mean[i] = cfg.one_tensor() ? 0.5f * (theta[i] + theta_j[i])
                                 : 0.5f * (own_delta[i] + (phi_j[i] - theta_j[i]));
      phi_mean[i] = 0.5f * (phi0[i] + phi_j[i]);
    }
    // ...and the expected step: the whole step with ours outside the slice.
    auto want_phi = phi0;
    auto want_m = s0.momentum.to_vector();
    std::vector<float> m_in(mean), p_in(phi_mean);
    for (std::size_t i = 0; i < kN; ++i)
      if (i < lo || i >= hi) {
        m_in[i] = cfg.one_tensor() ? theta[i] : own_delta[i];
        p_in[i] = phi0[i];
      }
    if (cfg.one_tensor())
      optim::noloco_step_theta(want_phi, want_m, m_in, cfg);
    else
      optim::noloco_step(want_phi, want_m, m_in, p_in, cfg);

    StepWork w;
    w.kind = StepWork::Kind::noloco_mean;
    w.mode = OuterMode::noloco;
    w.state = s0;
    w.theta = optim::Floats(theta);
    w.slice = slice;
    w.mean = optim::Floats(std::vector<float>(m_in.begin() + lo, m_in.begin() + hi));
    if (!cfg.one_tensor())
      w.phi_mean = optim::Floats(std::vector<float>(p_in.begin() + lo, p_in.begin() + hi));
    w.noloco = cfg;
    w.run();
    ASSERT_EQ(w.error, "");
    const auto phi = w.state.phi.to_vector(), m = w.state.momentum.to_vector();
    for (std::size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(phi[i], want_phi[i]) << "γ " << gamma << " at " << i;
      ASSERT_EQ(m[i], want_m[i]) << "γ " << gamma << " at " << i;
    }
    // A mean of the wrong size is refused, the state left as it was.
    StepWork bad;
    bad.kind = StepWork::Kind::noloco_mean;
    bad.state = s0;
    bad.theta = optim::Floats(theta);
    bad.slice = slice;
    bad.mean = optim::Floats(std::vector<float>(hi - lo - 1, 0.0f));
    bad.phi_mean = optim::Floats(std::vector<float>(hi - lo - 1, 0.0f));
    bad.noloco = cfg;
    bad.run();
    EXPECT_NE(bad.error, "");
    EXPECT_EQ(bad.state.phi.to_vector(), phi0);
  }
}

}  // namespace
}  // namespace grove::gossip
