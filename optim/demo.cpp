// DeMo's per-tensor compression and step (demo.hpp): the blocked DCT, top-k per block, the
// members' mean per coefficient and the sign step.
#include "optim/demo.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

namespace grove::optim {

namespace {

// Blocks processed together: at most ~1M coefficients of scratch whatever the tensor's width.
std::size_t blocks_per_batch(const DemoBlocks& b) {
  return std::max<std::size_t>(1, (std::size_t{1} << 20) / std::max<std::size_t>(1, b.h * b.w));
}

bool all_finite(std::span<const float> v) {
  // A sum of x·0 is NaN iff some x is NaN or Inf: one branch-free pass.
  float acc = 0.0f;
  for (float x : v) acc += x * 0.0f;
  return acc == 0.0f;
}

float sign_of(float g) {
  return g > 0.0f ? 1.0f : g < 0.0f ? -1.0f : 0.0f;
}

}  // namespace

const char* demo_params_problem(const DemoParams& p) {
  if (!(p.decay >= 0.0f && p.decay < 1.0f)) return "the decay must be in [0, 1)";
  if (p.topk < 1) return "topk must be at least 1";
  if (p.chunk < 1 || p.chunk > 256) return "the chunk must be in [1, 256]";
  if (!(p.weight_decay >= 0.0f && std::isfinite(p.weight_decay)))
    return "the weight decay must be finite and not negative";
  return "";
}

std::size_t demo_chunk(std::size_t s, std::size_t c) {
  if (s == 0 || c == 0) return 1;
  for (std::size_t d = std::min(s, c); d > 1; --d)
    if (s % d == 0) return d;
  return 1;
}

DemoBlocks demo_blocks(std::span<const std::uint64_t> shape, const DemoParams& p) {
  DemoBlocks b;
  if (shape.empty()) {
    b.rows = b.cols = 1;
  } else if (shape.size() == 1) {
    b.rows = 1;
    b.cols = shape[0];
  } else {
    b.rows = shape[0];
    b.cols = 1;
    for (std::size_t i = 1; i < shape.size(); ++i) b.cols *= shape[i];
  }
  b.h = demo_chunk(b.rows, p.chunk);
  b.w = demo_chunk(b.cols, p.chunk);
  b.k = static_cast<std::uint32_t>(
      std::min<std::size_t>(std::max<std::uint32_t>(p.topk, 1), b.h * b.w));
  return b;
}

std::size_t demo_encoded_size(const DemoBlocks& b) {
  return b.count() * b.k * 6;
}

CodecError demo_check(const DemoBlocks& b, std::span<const std::uint8_t> msg) {
  if (msg.size() != demo_encoded_size(b)) return CodecError::size_mismatch;
  const std::size_t hw = b.h * b.w, k = b.k;
  const std::uint8_t* p = msg.data();
  for (std::size_t blk = 0; blk < b.count(); ++blk, p += 6 * k) {
    std::uint32_t last = 0;
    for (std::size_t j = 0; j < k; ++j) {
      std::uint16_t idx;
      std::memcpy(&idx, p + 2 * j, 2);
      if (idx >= hw || (j > 0 && idx <= last)) return CodecError::malformed;
      last = idx;
    }
    for (std::size_t j = 0; j < k; ++j) {
      float v;
      std::memcpy(&v, p + 2 * k + 4 * j, 4);
      if (!std::isfinite(v)) return CodecError::not_finite;
    }
  }
  return CodecError::ok;
}

const Demo::Basis& Demo::get(std::size_t n) {
  auto it = bases_.find(n);
  if (it != bases_.end()) return it->second;
  Basis bs;
  bs.m.resize(n * n);
  bs.mt.resize(n * n);
  for (std::size_t f = 0; f < n; ++f) {
    const double s = f == 0 ? std::sqrt(1.0 / double(n)) : std::sqrt(2.0 / double(n));
    for (std::size_t t = 0; t < n; ++t) {
      const double v =
          s * std::cos(std::numbers::pi * double(2 * t + 1) * double(f) / double(2 * n));
      bs.m[f * n + t] = bs.mt[t * n + f] = static_cast<float>(v);
    }
  }
  return bases_.emplace(n, std::move(bs)).first->second;
}

std::span<const float> Demo::basis(std::size_t n) {
  return get(n).m;
}

void Demo::forward(const DemoBlocks& b, const float* slab, std::size_t ld, std::size_t nc,
                   float* c) {
  const std::size_t h = b.h, w = b.w;
  const Basis& bw = get(w);
  const Basis& bh = get(h);
  // Along the rows of each block: t1[i, x·w + f] = Σ_t M_w[f, t]·slab[i, x·w + t].
  t1_.assign(h * nc, 0.0f);
  for (std::size_t i = 0; i < h; ++i) {
    const float* row = slab + i * ld;
    float* t = t1_.data() + i * nc;
    for (std::size_t x = 0; x < nc; x += w) {
      float* dst = t + x;
      for (std::size_t j = 0; j < w; ++j) {
        const float v = row[x + j];
        const float* mt = bw.mt.data() + j * w;
        for (std::size_t f = 0; f < w; ++f) dst[f] += v * mt[f];
      }
    }
  }
  // Along the columns: c[a, col] = Σ_i M_h[a, i]·t1[i, col].
  if (h == 1) {
    std::copy(t1_.begin(), t1_.end(), c);
    return;
  }
  std::fill(c, c + h * nc, 0.0f);
  for (std::size_t a = 0; a < h; ++a) {
    float* dst = c + a * nc;
    for (std::size_t i = 0; i < h; ++i) {
      const float m = bh.m[a * h + i];
      const float* src = t1_.data() + i * nc;
      for (std::size_t col = 0; col < nc; ++col) dst[col] += m * src[col];
    }
  }
}

void Demo::inverse(const DemoBlocks& b, const float* a, std::size_t nc, float* g) {
  const std::size_t h = b.h, w = b.w;
  const Basis& bw = get(w);
  const Basis& bh = get(h);
  // Along the rows: u[f, x·w + t] = Σ_b M_w[b, t]·a[f, x·w + b] (most coefficients are zero).
  float* u = h == 1 ? g : (t1_.assign(h * nc, 0.0f), t1_.data());
  if (h == 1) std::fill(g, g + nc, 0.0f);
  for (std::size_t r = 0; r < h; ++r) {
    const float* src = a + r * nc;
    float* dst = u + r * nc;
    for (std::size_t x = 0; x < nc; x += w) {
      for (std::size_t f = 0; f < w; ++f) {
        const float v = src[x + f];
        if (v == 0.0f) continue;
        const float* m = bw.m.data() + f * w;
        for (std::size_t t = 0; t < w; ++t) dst[x + t] += v * m[t];
      }
    }
  }
  if (h == 1) return;
  // Along the columns: g[i, col] = Σ_r M_h[r, i]·u[r, col].
  std::fill(g, g + h * nc, 0.0f);
  for (std::size_t i = 0; i < h; ++i) {
    float* dst = g + i * nc;
    for (std::size_t r = 0; r < h; ++r) {
      const float m = bh.m[r * h + i];
      const float* src = u + r * nc;
      for (std::size_t col = 0; col < nc; ++col) dst[col] += m * src[col];
    }
  }
}

CodecError Demo::compress(const DemoBlocks& b, std::span<float> delta, std::span<const float> grad,
                          float lr, float decay, std::span<std::uint8_t> out) {
  if (delta.size() != b.size() || grad.size() != b.size() || out.size() != demo_encoded_size(b))
    return CodecError::size_mismatch;
  if (!all_finite(delta) || !all_finite(grad)) return CodecError::not_finite;
  const std::size_t h = b.h, w = b.w, hw = h * w, k = b.k, bx = b.cols / w, by = b.rows / h;
  const std::size_t per = blocks_per_batch(b);
  std::vector<float> cand(hw);
  order_.resize(hw);
  for (std::size_t y = 0; y < by; ++y) {
    float* slab = delta.data() + y * h * b.cols;
    const float* gs = grad.data() + y * h * b.cols;
    for (std::size_t e = 0; e < h * b.cols; ++e) {
      const float t = decay * slab[e];
      slab[e] = t + lr * gs[e];
    }
    for (std::size_t x0 = 0; x0 < bx; x0 += per) {
      const std::size_t nbx = std::min(per, bx - x0), nc = nbx * w;
      c_.resize(h * nc);
      forward(b, slab + x0 * w, b.cols, nc, c_.data());
      a_.assign(h * nc, 0.0f);
      for (std::size_t j = 0; j < nbx; ++j) {
        for (std::size_t r = 0; r < h; ++r)
          for (std::size_t f = 0; f < w; ++f) cand[r * w + f] = c_[r * nc + j * w + f];
        for (std::uint32_t i = 0; i < hw; ++i) order_[i] = i;
        const auto larger = [&](std::uint32_t p, std::uint32_t q) {
          const float ap = std::abs(cand[p]), aq = std::abs(cand[q]);
          return ap > aq || (ap == aq && p < q);
        };
        if (k < hw) std::nth_element(order_.begin(), order_.begin() + k, order_.end(), larger);
        std::sort(order_.begin(), order_.begin() + k);
        std::uint8_t* o = out.data() + ((y * bx + x0 + j) * k) * 6;
        for (std::size_t s = 0; s < k; ++s) {
          const std::uint32_t idx = order_[s];
          const auto i16 = static_cast<std::uint16_t>(idx);
          const float v = cand[idx];
          std::memcpy(o + 2 * s, &i16, 2);
          std::memcpy(o + 2 * k + 4 * s, &v, 4);
          a_[(idx / w) * nc + j * w + idx % w] = v;
        }
      }
      // δ ← δ − IDCT(what was sent), as the reference does (not a zero in the DCT domain).
      g_.resize(h * nc);
      inverse(b, a_.data(), nc, g_.data());
      for (std::size_t i = 0; i < h; ++i) {
        float* d = slab + i * b.cols + x0 * w;
        const float* s = g_.data() + i * nc;
        for (std::size_t col = 0; col < nc; ++col) d[col] -= s[col];
      }
    }
  }
  return CodecError::ok;
}

CodecError Demo::apply(const DemoBlocks& b, std::span<const std::span<const std::uint8_t>> members,
                       std::span<float> p, float lr, float weight_decay, std::span<float> g_out) {
  if (p.size() != b.size() || (!g_out.empty() && g_out.size() != b.size()))
    return CodecError::size_mismatch;
  for (const auto& m : members)
    if (const auto e = demo_check(b, m); e != CodecError::ok) return e;
  const std::size_t h = b.h, w = b.w, k = b.k, bx = b.cols / w, by = b.rows / h;
  const std::size_t per = blocks_per_batch(b);
  const float keep = 1.0f - lr * weight_decay;
  for (std::size_t y = 0; y < by; ++y) {
    for (std::size_t x0 = 0; x0 < bx; x0 += per) {
      const std::size_t nbx = std::min(per, bx - x0), nc = nbx * w;
      a_.assign(h * nc, 0.0f);
      cnt_.assign(h * nc, 0);
      for (const auto& m : members) {
        for (std::size_t j = 0; j < nbx; ++j) {
          const std::uint8_t* in = m.data() + ((y * bx + x0 + j) * k) * 6;
          for (std::size_t s = 0; s < k; ++s) {
            std::uint16_t idx;
            float v;
            std::memcpy(&idx, in + 2 * s, 2);
            std::memcpy(&v, in + 2 * k + 4 * s, 4);
            const std::size_t pos = (idx / w) * nc + j * w + idx % w;
            a_[pos] += v;
            ++cnt_[pos];
          }
        }
      }
      for (std::size_t e = 0; e < h * nc; ++e)
        if (cnt_[e] > 1) a_[e] /= static_cast<float>(cnt_[e]);
      g_.resize(h * nc);
      inverse(b, a_.data(), nc, g_.data());
      for (std::size_t i = 0; i < h; ++i) {
        const std::size_t at = (y * h + i) * b.cols + x0 * w;
        float* d = p.data() + at;
        const float* s = g_.data() + i * nc;
        if (weight_decay != 0.0f)
          for (std::size_t col = 0; col < nc; ++col) d[col] *= keep;
        for (std::size_t col = 0; col < nc; ++col) d[col] += -lr * sign_of(s[col]);
        if (!g_out.empty()) std::copy(s, s + nc, g_out.data() + at);
      }
    }
  }
  return CodecError::ok;
}

}  // namespace grove::optim
