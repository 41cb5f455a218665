// Outer steps against PyTorch (Debian's python3-torch through /usr/bin/python3): 20 rounds on
// random tensors, every round compared to 1e-6 relative.
#include "optim/outer.hpp"

#include "optim/codecs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

namespace grove::optim {
namespace {

constexpr int kRounds = 20;
constexpr std::size_t kN = 10007;  // not a multiple of any vector width

struct Case {
  int mode;
  float p0, p1, p2;
};

std::vector<float> randn(std::mt19937& rng, std::size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Runs the reference script and returns rounds × (phi, state).
std::vector<float> reference(const Case& c, const std::vector<float>& phi0,
                             const std::vector<std::vector<float>>& arrays) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("grove-outer-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "in.bin", out = dir / "out.bin";
  {
    std::ofstream f(in, std::ios::binary);
    const std::int32_t hdr[3] = {c.mode, kRounds, static_cast<std::int32_t>(kN)};
    const float ps[3] = {c.p0, c.p1, c.p2};
    f.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    f.write(reinterpret_cast<const char*>(ps), sizeof ps);
    f.write(reinterpret_cast<const char*>(phi0.data()), phi0.size() * 4);
    for (auto& a : arrays) f.write(reinterpret_cast<const char*>(a.data()), a.size() * 4);
  }
  const std::string cmd = "/usr/bin/python3 " GROVE_SOURCE_DIR "/tests/optim/outer_reference.py " +
                          in.string() + " " + out.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "reference failed (needs python3-torch): " << cmd;
  std::vector<float> r(static_cast<std::size_t>(kRounds) * 2 * kN);
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(r.data()), static_cast<std::streamsize>(r.size() * 4));
  EXPECT_EQ(static_cast<std::size_t>(f.gcount()), r.size() * 4);
  fs::remove_all(dir);
  return r;
}

// Relative error of a tensor: max |a - b| / max |b|. (Element-wise relative error is not
// meaningful where an update cancels a weight to near zero: torch's CPU kernels fuse
// p + (-lr)·g into one FMA, we round the product first; both are within an ulp of |p|.)
double max_rel(const float* a, const float* b, std::size_t n) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return worst / std::max(scale, 1e-30);
}

void check(const Case& c) {
  std::mt19937 rng(1234 + c.mode);
  const auto phi0 = randn(rng, kN, 1.0f);
  const int per = c.mode == 4 ? static_cast<int>(c.p2) : (c.mode == 1 || c.mode == 3) ? 2 : 1;
  std::vector<std::vector<float>> arrays;
  for (int r = 0; r < kRounds; ++r)
    for (int k = 0; k < per; ++k)
      arrays.push_back(k == 1 && c.mode == 1 ? [&] {  // phi_mean: near phi
        auto v = randn(rng, kN, 0.05f);
        for (std::size_t i = 0; i < kN; ++i) v[i] += phi0[i];
        return v;
      }()
                                             : randn(rng, kN, 0.02f));
  const auto ref = reference(c, phi0, arrays);
  std::vector<float> phi = phi0, state(kN, 0.0f);
  std::vector<std::vector<float>> errors(static_cast<std::size_t>(per), std::vector<float>(kN));
  const TopKCodec topk{4096, 64, false};
  for (int r = 0; r < kRounds; ++r) {
    const auto& a0 = arrays[r * per];
    switch (c.mode) {
      case 0:
        diloco_step(phi, state, a0, DiLoCoConfig{c.p0, c.p1});
        break;
      case 1:
        noloco_step(phi, state, a0, arrays[r * per + 1], NoLoCoConfig{c.p0, c.p1, c.p2});
        break;
      case 2:
        noloco_step_theta(phi, state, a0, NoLoCoConfig{c.p0, c.p1, c.p1});
        break;
      case 3:
        error_feedback_accumulate(state, a0, c.p1);
        apply_mean_update(phi, arrays[r * per + 1], c.p0);
        break;
      case 4: {  // every replica encodes its top-k; all apply the mean of what was sent
        std::vector<float> mean(kN, 0.0f);
        for (int k = 0; k < per; ++k) {
          auto& e = errors[static_cast<std::size_t>(k)];
          error_feedback_accumulate(e, arrays[r * per + k], c.p1);
          std::vector<std::uint8_t> msg(topk.encoded_size(kN));
          ASSERT_EQ(topk.encode(e, msg), CodecError::ok);
          ASSERT_EQ(topk.decode_add(msg, mean, 1.0f / static_cast<float>(per)), CodecError::ok);
        }
        apply_mean_update(phi, mean, c.p0);
        state = errors[0];
        break;
      }
    }
    const float* rp = ref.data() + static_cast<std::size_t>(r) * 2 * kN;
    EXPECT_LE(max_rel(phi.data(), rp, kN), 1e-6) << "mode " << c.mode << " round " << r << " phi";
    EXPECT_LE(max_rel(state.data(), rp + kN, kN), 1e-6)
        << "mode " << c.mode << " round " << r << " state";
  }
}

TEST(Outer, DiLoCoMatchesTorchSgdNesterov) {
  check({0, 0.7f, 0.9f, 0});
}
TEST(Outer, NoLoCoMatchesFormula) {
  check({1, 0.5f, 0.7f, 0.3f});
}
TEST(Outer, NoLoCoOneTensorMatchesFormula) {
  check({2, 0.5f, 0.7f, 0});
}
TEST(Outer, SparseLoCoPiecesMatchFormula) {
  check({3, 1.0f, 0.95f, 0});
}

TEST(Outer, SparseLoCoFullStepWithTopKMatchesFormula) {
  check({4, 1.0f, 0.95f, 4});  // lr, decay, 4 replicas; chunk 4096, top-64 (Grove's defaults)
}

TEST(Outer, ThreadedStepsAreBitIdenticalToOneThread) {
  std::mt19937 rng(77);
  const std::size_t n = (std::size_t{3} << 18) + 5;  // three slices of >= 2^18, a ragged tail
  const auto phi0 = randn(rng, n, 1.0f), m0 = randn(rng, n, 0.1f), d = randn(rng, n, 0.02f),
             q = randn(rng, n, 1.0f);
  for (int step = 0; step < 7; ++step) {
    std::vector<float> p1 = phi0, m1 = m0, p3 = phi0, m3 = m0, t1(n), t3(n);
    auto run = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& t,
                   unsigned th) {
      switch (step) {
        case 0:
          diloco_step(p, m, d, {}, th);
          break;
        case 1:
          noloco_step(p, m, d, q, {}, th);
          break;
        case 2:
          noloco_step_theta(p, m, q, {}, th);
          break;
        case 3:
          error_feedback_accumulate(m, d, 0.95f, th);
          break;
        case 4:
          apply_mean_update(p, d, 0.7f, th);
          break;
        case 5:
          pseudo_gradient(p, q, t, th);
          break;
        case 6:
          overlap_mix(m, p, q, 0.5f, th);
          break;
      }
    };
    run(p1, m1, t1, 1);
    run(p3, m3, t3, 3);
    EXPECT_EQ(p1, p3) << "step " << step;
    EXPECT_EQ(m1, m3) << "step " << step;
    EXPECT_EQ(t1, t3) << "step " << step;
    EXPECT_TRUE(p1 != phi0 || m1 != m0 || t1 != std::vector<float>(n)) << "step " << step;
  }
}

TEST(Outer, OneTensorFormEqualsTwoTensorFormWhenBetaEqualsGamma) {
  std::mt19937 rng(5);
  const std::size_t n = 1000;
  auto phi_a = randn(rng, n, 1.0f), phi_b = phi_a, theta_mine = randn(rng, n, 1.0f),
       theta_peer = randn(rng, n, 1.0f), phi_peer = randn(rng, n, 1.0f);
  std::vector<float> m_a(n, 0.1f), m_b = m_a, d_mean(n), phi_mean(n), theta_mean(n);
  for (std::size_t i = 0; i < n; ++i) {
    d_mean[i] = 0.5f * ((phi_a[i] - theta_mine[i]) + (phi_peer[i] - theta_peer[i]));
    phi_mean[i] = 0.5f * (phi_a[i] + phi_peer[i]);
    theta_mean[i] = 0.5f * (theta_mine[i] + theta_peer[i]);
  }
  NoLoCoConfig cfg{0.5f, 0.7f, 0.7f};
  noloco_step(phi_a, m_a, d_mean, phi_mean, cfg);
  noloco_step_theta(phi_b, m_b, theta_mean, cfg);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(phi_a[i], phi_b[i], 1e-5f);
    EXPECT_NEAR(m_a[i], m_b[i], 1e-5f);
  }
}

// The outer warm-up: round 1 is plain averaging (φ = mean θ), the numbers ramp linearly and
// reach the configured ones after `warmup` rounds.
TEST(Outer, TheOuterWarmUpStartsFromPlainAveraging) {
  const DiLoCoConfig cfg{0.7f, 0.9f, 4};
  EXPECT_EQ(cfg.at_round(1).lr, 1.0f);
  EXPECT_EQ(cfg.at_round(1).momentum, 0.0f);
  EXPECT_FLOAT_EQ(cfg.at_round(3).lr, 0.85f);
  EXPECT_FLOAT_EQ(cfg.at_round(3).momentum, 0.45f);
  EXPECT_EQ(cfg.at_round(5).lr, 0.7f);
  EXPECT_EQ(cfg.at_round(5).momentum, 0.9f);
  EXPECT_EQ(cfg.at_round(1000).lr, 0.7f);
  EXPECT_EQ((DiLoCoConfig{0.7f, 0.9f}.at_round(1).momentum), 0.9f);
  std::vector<float> phi{1.0f, 2.0f}, b{0.0f, 0.0f}, mean_delta{0.25f, -0.5f};
  diloco_step(phi, b, mean_delta, cfg.at_round(1));
  EXPECT_EQ(phi, (std::vector<float>{0.75f, 2.5f}));
}

// NoLoCo's Nesterov rule: the group's mean of the members' proposals is DiLoCo's step from the
// group's mean φ, m and Δ (m = −lr·b); over the whole swarm, DiLoCo's step exactly.
TEST(Outer, NoLoCosNesterovRuleIsDiLoCosStepOnTheGroupsMeans) {
  std::mt19937 rng(7);
  const std::size_t n = 257;
  const NoLoCoConfig nl{0.9f, 0.7f, 1.0f, 0.0f, true};
  const DiLoCoConfig dl{0.7f, 0.9f};
  EXPECT_FALSE(nl.one_tensor());
  // Two members, different φ, m and θ.
  auto phi_a = randn(rng, n, 1.0f), phi_b = randn(rng, n, 1.0f);
  auto m_a = randn(rng, n, 0.1f), m_b = randn(rng, n, 0.1f);
  auto th_a = randn(rng, n, 1.0f), th_b = randn(rng, n, 1.0f);
  std::vector<float> pa(n), pb(n), ma(n), mb(n);
  noloco_proposal(phi_a, m_a, th_a, pa, ma, nl);
  noloco_proposal(phi_b, m_b, th_b, pb, mb, nl);
  std::vector<float> phi(n), b(n), d(n);
  for (std::size_t i = 0; i < n; ++i) {
    phi[i] = 0.5f * (phi_a[i] + phi_b[i]);
    b[i] = -0.5f * (m_a[i] + m_b[i]) / 0.7f;
    d[i] = 0.5f * ((phi_a[i] - th_a[i]) + (phi_b[i] - th_b[i]));
  }
  diloco_step(phi, b, d, dl);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(0.5f * (pa[i] + pb[i]), phi[i], 1e-5f) << i;
    ASSERT_NEAR(0.5f * (ma[i] + mb[i]), -0.7f * b[i], 1e-5f) << i;
  }
}

// NoLoCo's warm-up ramps α from 0 and β, γ from 1: round 1 is plain averaging, φ = mean θ, with
// either rule.
TEST(Outer, NoLoCosWarmUpStartsFromPlainAveraging) {
  NoLoCoConfig cfg{0.9f, 0.7f, 0.5f, 0.0f, true, 4};
  EXPECT_EQ(cfg.at_round(1).alpha, 0.0f);
  EXPECT_EQ(cfg.at_round(1).beta, 1.0f);
  EXPECT_EQ(cfg.at_round(1).gamma, 1.0f);
  EXPECT_FLOAT_EQ(cfg.at_round(3).alpha, 0.45f);
  EXPECT_FLOAT_EQ(cfg.at_round(3).beta, 0.85f);
  EXPECT_FLOAT_EQ(cfg.at_round(3).gamma, 0.75f);
  EXPECT_EQ(cfg.at_round(5).alpha, 0.9f);
  EXPECT_EQ(cfg.at_round(5).gamma, 0.5f);
  EXPECT_EQ(cfg.at_round(5).warmup, 0u);
  // Two members: φ 1 and 3, θ 0 and 1; mean θ = 0.5 whatever the momentum was.
  std::vector<float> phi{1.0f}, m{0.3f}, d_mean{(1.0f + 2.0f) / 2}, phi_mean{2.0f};
  noloco_step(phi, m, d_mean, phi_mean, NoLoCoConfig{0.5f, 0.7f, 0.7f, 0.0f, false, 4}.at_round(1));
  EXPECT_FLOAT_EQ(phi[0], 0.5f);
  std::vector<float> p1(1), p2(1), m1(1), m2(1);
  noloco_proposal(std::vector<float>{1.0f}, std::vector<float>{0.3f}, std::vector<float>{0.0f}, p1,
                  m1, cfg.at_round(1));
  noloco_proposal(std::vector<float>{3.0f}, std::vector<float>{-0.2f}, std::vector<float>{1.0f}, p2,
                  m2, cfg.at_round(1));
  EXPECT_FLOAT_EQ(0.5f * (p1[0] + p2[0]), 0.5f);
}

TEST(Outer, OverlapMixKeepsTheRightReference) {
  // After mixing, φ is the new slow weights φ' and θ is halfway between θ_local and φ', so the
  // next pseudo-gradient φ' − θ = α·(φ' − θ_local) is non-zero (taking it against the mixed
  // weights instead would give zero).
  std::vector<float> theta{2.0f, 4.0f}, phi{1.0f, 1.0f}, phi_new{1.5f, 2.0f};
  overlap_mix(theta, phi, phi_new, 0.5f);
  EXPECT_EQ(theta, (std::vector<float>{1.75f, 3.0f}));
  EXPECT_EQ(phi, phi_new);
  std::vector<float> delta(2);
  pseudo_gradient(phi, theta, delta);
  EXPECT_EQ(delta, (std::vector<float>{-0.25f, -1.0f}));
}

}  // namespace
}  // namespace grove::optim
