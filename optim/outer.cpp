#include "optim/outer.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace grove::optim {

namespace {

// Runs fn(begin, end) over [0, n) split into `threads` contiguous slices (0 = one per hardware
// thread, at most 8), each on its own thread, the first on the caller's. Small buffers run inline:
// a thread start costs tens of microseconds. The steps are element-wise, so the result does not
// depend on the split.
template <class Fn>
void parallel_slices(std::size_t n, unsigned threads, Fn&& fn) {
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  constexpr std::size_t kMinPerThread = std::size_t{1} << 18;
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, n / kMinPerThread));
  if (threads <= 1) {
    fn(std::size_t{0}, n);
    return;
  }
  const std::size_t per = (n / threads + 15) / 16 * 16;  // 64-byte aligned slice starts
  std::vector<std::jthread> pool;
  pool.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) {
    const std::size_t b = std::min(n, t * per), e = std::min(n, b + per);
    pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(std::size_t{0}, std::min(n, per));
}

}  // namespace

// The kernels take __restrict pointers as parameters (GCC honours restrict there, not on locals
// inside a lambda) so that every loop vectorises without run-time alias checks; callers guarantee
// that each output buffer is distinct from the inputs.
namespace {

void diloco_kernel(float* __restrict p, float* __restrict b, const float* __restrict d, float mu,
                   float lr, std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) {
    // Same operation order as torch: buf.mul_(μ).add_(g); g = g.add(buf, alpha=μ);
    // p.add_(g, alpha=-lr).
    const float nb = b[i] * mu + d[i];
    b[i] = nb;
    const float g = d[i] + mu * nb;
    p[i] = p[i] + (-lr) * g;
  }
}

void noloco_kernel(float* __restrict p, float* __restrict mm, const float* __restrict d,
                   const float* __restrict pm, float a, float be, float ga, std::size_t lo,
                   std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) {
    const float nm = a * mm[i] - be * d[i] - ga * (p[i] - pm[i]);
    mm[i] = nm;
    p[i] = p[i] + nm;
  }
}

void proposal_kernel(const float* __restrict p, const float* __restrict mm,
                     const float* __restrict t, float* __restrict out_p, float* __restrict out_m,
                     float a, float be, std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) {
    const float d = p[i] - t[i];
    const float nm = a * mm[i] - be * d;
    out_m[i] = nm;
    out_p[i] = p[i] + (a * nm - be * d);
  }
}

void noloco_theta_kernel(float* __restrict p, float* __restrict mm, const float* __restrict t,
                         float a, float be, std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) {
    const float nm = a * mm[i] + be * (t[i] - p[i]);
    mm[i] = nm;
    p[i] = p[i] + nm;
  }
}

void axpby_kernel(float* __restrict x, const float* __restrict y, float a, float b, std::size_t lo,
                  std::size_t hi) {  // x = a·x + b·y
  for (std::size_t i = lo; i < hi; ++i) x[i] = a * x[i] + b * y[i];
}

void sub_kernel(const float* __restrict p, const float* __restrict t, float* __restrict d,
                std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) d[i] = p[i] - t[i];
}

void scaled_sub_kernel(const float* __restrict p, const float* __restrict t, float* __restrict d,
                       float scale, std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i) d[i] = (p[i] - t[i]) * scale;
}

// Σ (p − t)² over [lo, hi) in double, eight independent partial sums (one add chain would be
// latency-bound, as in l2_norm).
double sq_dist_kernel(const float* __restrict p, const float* __restrict t, std::size_t lo,
                      std::size_t hi) {
  double acc[8] = {};
  std::size_t i = lo;
  for (; i + 8 <= hi; i += 8)
    for (std::size_t k = 0; k < 8; ++k) {
      const double d = static_cast<double>(p[i + k]) - t[i + k];
      acc[k] += d * d;
    }
  double s = 0.0;
  for (; i < hi; ++i) {
    const double d = static_cast<double>(p[i]) - t[i];
    s += d * d;
  }
  for (const double a : acc) s += a;
  return s;
}

void mix_kernel(float* __restrict t, float* __restrict p, const float* __restrict q, float alpha,
                std::size_t lo, std::size_t hi) {
  const float b = 1.0f - alpha;
  for (std::size_t i = lo; i < hi; ++i) {
    t[i] = alpha * t[i] + b * q[i];
    p[i] = q[i];
  }
}

// The outer warm-up's share of round r ≤ warmup, (r − 1)/warmup: 0 for round 1; a step size x
// ramps from 1 to x by it, a momentum from 0.
float warmup_share(std::uint64_t round, std::uint32_t warmup) {
  return static_cast<float>(round == 0 ? 0 : round - 1) / static_cast<float>(warmup);
}
float from_one(float x, float s) {
  return 1.0f + (x - 1.0f) * s;
}

}  // namespace

DiLoCoConfig DiLoCoConfig::at_round(std::uint64_t round) const {
  if (warmup == 0 || round > warmup) return {lr, momentum, 0};
  const float s = warmup_share(round, warmup);
  return {from_one(lr, s), momentum * s, 0};
}

NoLoCoConfig NoLoCoConfig::at_round(std::uint64_t round) const {
  NoLoCoConfig c = *this;
  c.warmup = 0;
  if (warmup == 0 || round > warmup) return c;
  const float s = warmup_share(round, warmup);
  c.alpha = alpha * s;
  c.beta = from_one(beta, s);
  c.gamma = from_one(gamma, s);
  return c;
}

void diloco_step(std::span<float> phi, std::span<float> buf, std::span<const float> delta_mean,
                 const DiLoCoConfig& cfg, unsigned threads) {
  assert(phi.size() == buf.size() && phi.size() == delta_mean.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    diloco_kernel(phi.data(), buf.data(), delta_mean.data(), cfg.momentum, cfg.lr, lo, hi);
  });
}

void noloco_step(std::span<float> phi, std::span<float> m, std::span<const float> delta_mean,
                 std::span<const float> phi_mean, const NoLoCoConfig& cfg, unsigned threads) {
  assert(phi.size() == m.size() && phi.size() == delta_mean.size() &&
         phi.size() == phi_mean.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    noloco_kernel(phi.data(), m.data(), delta_mean.data(), phi_mean.data(), cfg.alpha, cfg.beta,
                  cfg.gamma, lo, hi);
  });
}

void noloco_proposal(std::span<const float> phi, std::span<const float> m,
                     std::span<const float> theta, std::span<float> p, std::span<float> m_next,
                     const NoLoCoConfig& cfg, unsigned threads) {
  assert(phi.size() == m.size() && phi.size() == theta.size() && phi.size() == p.size() &&
         phi.size() == m_next.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    proposal_kernel(phi.data(), m.data(), theta.data(), p.data(), m_next.data(), cfg.alpha,
                    cfg.beta, lo, hi);
  });
}

void noloco_step_theta(std::span<float> phi, std::span<float> m, std::span<const float> theta_mean,
                       const NoLoCoConfig& cfg, unsigned threads) {
  assert(phi.size() == m.size() && phi.size() == theta_mean.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    noloco_theta_kernel(phi.data(), m.data(), theta_mean.data(), cfg.alpha, cfg.beta, lo, hi);
  });
}

void error_feedback_accumulate(std::span<float> e, std::span<const float> delta, float decay,
                               unsigned threads) {
  assert(e.size() == delta.size());
  parallel_slices(e.size(), threads, [&](std::size_t lo, std::size_t hi) {
    axpby_kernel(e.data(), delta.data(), decay, 1.0f, lo, hi);
  });
}

void apply_mean_update(std::span<float> phi, std::span<const float> mean_update, float lr,
                       unsigned threads) {
  assert(phi.size() == mean_update.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    axpby_kernel(phi.data(), mean_update.data(), 1.0f, -lr, lo, hi);
  });
}

void pseudo_gradient(std::span<const float> phi, std::span<const float> theta,
                     std::span<float> delta, unsigned threads, float scale) {
  assert(phi.size() == theta.size() && phi.size() == delta.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    if (scale == 1.0f)
      sub_kernel(phi.data(), theta.data(), delta.data(), lo, hi);
    else
      scaled_sub_kernel(phi.data(), theta.data(), delta.data(), scale, lo, hi);
  });
}

double pseudo_gradient_sq_norm(std::span<const float> phi, std::span<const float> theta,
                               unsigned threads) {
  assert(phi.size() == theta.size());
  std::mutex mu;
  std::vector<std::pair<std::size_t, double>> parts;  // (slice start, its sum)
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    const double s = sq_dist_kernel(phi.data(), theta.data(), lo, hi);
    const std::lock_guard lock(mu);
    parts.emplace_back(lo, s);
  });
  std::sort(parts.begin(), parts.end());  // the same sum whatever order the slices ended in
  double sum = 0.0;
  for (const auto& [lo, s] : parts) sum += s;
  return sum;
}

void overlap_mix(std::span<float> theta_local, std::span<float> phi, std::span<const float> phi_new,
                 float alpha, unsigned threads) {
  assert(theta_local.size() == phi.size() && phi.size() == phi_new.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    mix_kernel(theta_local.data(), phi.data(), phi_new.data(), alpha, lo, hi);
  });
}

bool all_finite(std::span<const float> x) {
  // On the bit patterns: a value is NaN or Inf exactly when its exponent bits are all ones.
  // Integer ops reassociate freely, so this vectorises (a float sum would be one serial chain).
  constexpr std::uint32_t kExp = 0x7f800000u;
  for (std::size_t b = 0; b < x.size(); b += 4096) {  // blocks: stop early on a bad value
    const std::size_t e = std::min(x.size(), b + 4096);
    std::uint32_t bad = 0;
    for (std::size_t i = b; i < e; ++i) {
      std::uint32_t u;
      std::memcpy(&u, &x[i], 4);
      bad |= static_cast<std::uint32_t>((u & kExp) == kExp);
    }
    if (bad) return false;
  }
  return true;
}

}  // namespace grove::optim
