#include "optim/outer.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
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

void mix_kernel(float* __restrict t, float* __restrict p, const float* __restrict q, float alpha,
                std::size_t lo, std::size_t hi) {
  const float b = 1.0f - alpha;
  for (std::size_t i = lo; i < hi; ++i) {
    t[i] = alpha * t[i] + b * q[i];
    p[i] = q[i];
  }
}

}  // namespace

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
                     std::span<float> delta, unsigned threads) {
  assert(phi.size() == theta.size() && phi.size() == delta.size());
  parallel_slices(phi.size(), threads, [&](std::size_t lo, std::size_t hi) {
    sub_kernel(phi.data(), theta.data(), delta.data(), lo, hi);
  });
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

// ---- serialisation ----

namespace {
constexpr char kMagic[8] = {'G', 'R', 'V', 'O', 'U', 'T', '0', '2'};
constexpr char kMagicV1[8] = {'G', 'R', 'V', 'O', 'U', 'T', '0', '1'};  // still read
constexpr std::uint64_t kFnvBasis = 1469598103934665603ull, kFnvPrime = 1099511628211ull;

// GRVOUT01's checksum: FNV-1a 64, a byte at a time (about 1 s for 800 MB: one dependent
// multiply per byte).
std::uint64_t fnv1a(std::span<const std::uint8_t> b) {
  std::uint64_t h = kFnvBasis;
  for (std::uint8_t c : b) h = (h ^ c) * kFnvPrime;
  return h;
}

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, 8);
  } else {
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  }
  return v;
}
}  // namespace

std::uint64_t state_checksum(std::span<const std::uint8_t> b) {
  // Four independent lanes over little-endian 64-bit words (word i to lane i mod 4), each step
  // an FNV-style multiply and an xor-shift (so high bits reach the low ones); the tail a byte at
  // a time; then the lanes and the length folded together.
  std::uint64_t h[4] = {kFnvBasis, kFnvBasis ^ 1, kFnvBasis ^ 2, kFnvBasis ^ 3};
  const std::size_t blocks = b.size() / 32;
  const std::uint8_t* p = b.data();
  for (std::size_t i = 0; i < blocks; ++i, p += 32)
    for (int j = 0; j < 4; ++j) {
      h[j] = (h[j] ^ load_le64(p + 8 * j)) * kFnvPrime;
      h[j] ^= h[j] >> 29;
    }
  for (std::size_t i = blocks * 32; i < b.size(); ++i) h[0] = (h[0] ^ b[i]) * kFnvPrime;
  std::uint64_t r = kFnvBasis;
  for (const std::uint64_t v : {h[0], h[1], h[2], h[3], std::uint64_t{b.size()}}) {
    r = (r ^ v) * kFnvPrime;
    r ^= r >> 31;
  }
  return r;
}

namespace {
void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}
void put_floats(std::vector<std::uint8_t>& out, const std::vector<float>& v) {
  put_u64(out, v.size());
  const std::size_t at = out.size();
  out.resize(at + v.size() * 4);  // (reserved by the caller: no reallocation)
  if constexpr (std::endian::native == std::endian::little) {
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * 4);
  } else {
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::uint32_t u;
      std::memcpy(&u, &v[i], 4);
      for (int k = 0; k < 4; ++k) out[at + 4 * i + k] = static_cast<std::uint8_t>(u >> (8 * k));
    }
  }
}
bool get_floats(std::span<const std::uint8_t>& in, std::size_t max, std::vector<float>& v) {
  if (in.size() < 8) return false;
  const std::uint64_t n = get_u64(in.data());
  in = in.subspan(8);
  if (n > max || n > in.size() / 4) return false;
  v.resize(n);
  if constexpr (std::endian::native == std::endian::little) {
    if (n) std::memcpy(v.data(), in.data(), n * 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u = 0;
      for (int k = 0; k < 4; ++k) u |= std::uint32_t{in[4 * i + k]} << (8 * k);
      std::memcpy(&v[i], &u, 4);
    }
  }
  in = in.subspan(n * 4);
  return all_finite(v);
}
}  // namespace

std::vector<std::uint8_t> serialize(const OuterState& s) {
  std::vector<std::uint8_t> out;
  out.reserve(8 + 8 + 3 * 8 + 4 * (s.phi.size() + s.momentum.size() + s.error.size()) + 8);
  out.assign(kMagic, kMagic + 8);
  put_u64(out, s.round);
  put_floats(out, s.phi);
  put_floats(out, s.momentum);
  put_floats(out, s.error);
  put_u64(out, state_checksum(out));
  return out;
}

std::optional<OuterState> deserialize(std::span<const std::uint8_t> bytes, std::size_t max_values) {
  if (bytes.size() < 8 + 8 + 3 * 8 + 8) return std::nullopt;
  const bool v1 = std::memcmp(bytes.data(), kMagicV1, 8) == 0;
  if (!v1 && std::memcmp(bytes.data(), kMagic, 8) != 0) return std::nullopt;
  const auto body = bytes.first(bytes.size() - 8);
  if ((v1 ? fnv1a(body) : state_checksum(body)) != get_u64(bytes.data() + bytes.size() - 8))
    return std::nullopt;
  OuterState s;
  s.round = get_u64(body.data() + 8);
  auto in = body.subspan(16);
  if (!get_floats(in, max_values, s.phi) || !get_floats(in, max_values, s.momentum) ||
      !get_floats(in, max_values, s.error) || !in.empty())
    return std::nullopt;
  if ((!s.momentum.empty() && s.momentum.size() != s.phi.size()) ||
      (!s.error.empty() && s.error.size() != s.phi.size()))
    return std::nullopt;
  return s;
}

}  // namespace grove::optim
