// Chunked top-k codec with error feedback (codecs.hpp, TopKCodec): per-chunk selection (portable,
// or AVX2 through simd_select.hpp; both pick the same set), fp32 or 2-bit values with u16
// indices, validation, decode and decode_add.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <vector>

#include "optim/simd_select.hpp"

namespace grove::optim {

// --- top-k -----------------------------------------------------------------------------------

namespace {

inline std::size_t topk_chunk_bytes(std::size_t kc, bool two_bit) {
  return two_bit ? 4 + (kc + 3) / 4 + 2 * kc : 6 * kc;
}

inline float q2_level(float s, bool big) {
  return std::min(big ? s * 1.5f : s * 0.5f, FLT_MAX);
}

// Scratch for one encode call, sized for one chunk.
struct TopKScratch {
  std::vector<std::uint32_t> buf;   // selected indices
  std::vector<std::uint64_t> keys;  // portable selection
  std::vector<std::int32_t> gm;     // SIMD: group maxima
  std::vector<std::int32_t> cv;     // SIMD: candidate |x| bits
  std::vector<std::int32_t> sel;    // SIMD: copy of cv for selection
  std::vector<std::uint32_t> ci;    // SIMD: candidate indices
#if GROVE_CODECS_X86
  SelectHint hint_q, hint_t;  // SIMD: the previous chunks' bound and threshold
#endif
};

// All len indices (kc >= len). Returns false if x holds a non-finite value.
bool select_all(const float* x, std::uint32_t len, std::uint32_t* buf) {
  bool bad = false;
  for (std::uint32_t i = 0; i < len; ++i) {
    bad |= not_finite_bits(bits_of(x[i]));
    buf[i] = i;
  }
  return !bad;
}

// Selects the kc largest |x| of x[0, len) (ties: lower index) into s.buf, sorted by index.
// Returns false if x holds a non-finite value.
bool select_topk_portable(const float* x, std::uint32_t len, std::uint32_t kc, TopKScratch& s) {
  std::uint32_t* buf = s.buf.data();
  if (kc >= len) return select_all(x, len, buf);
  std::uint64_t* keys = s.keys.data();
  bool bad = false;
  // key = |x| bits above the complemented index: a larger key is a better candidate (larger
  // magnitude, then lower index), so selection needs no indirection.
  auto key = [](std::uint32_t a, std::uint32_t i) {
    return (std::uint64_t{a} << 32) | (0xffffffffu - i);
  };
  const std::uint32_t cap = std::min(len, 2 * kc);
  std::uint32_t m = 0;
  std::uint32_t i = 0;
  // Fill: the first cap values are all candidates.
  for (; i < cap; ++i) {
    const std::uint32_t a = bits_of(x[i]) & 0x7fffffffu;
    bad |= a > 0x7f7fffffu;
    keys[m++] = key(a, i);
  }
  auto compact = [&] {
    std::nth_element(keys, keys + (kc - 1), keys + m, std::greater<>());
    m = kc;
    return static_cast<std::uint32_t>(keys[kc - 1] >> 32);
  };
  std::uint32_t thr = compact();  // a later value must have |x| > thr to enter (ties lose)
  for (; i < len; ++i) {
    const std::uint32_t a = bits_of(x[i]) & 0x7fffffffu;
    bad |= a > 0x7f7fffffu;
    if (a > thr) {
      keys[m++] = key(a, i);
      if (m == cap) thr = compact();
    }
  }
  if (bad) return false;
  if (m > kc) compact();
  for (std::uint32_t j = 0; j < kc; ++j) {
    buf[j] = 0xffffffffu - static_cast<std::uint32_t>(keys[j] & 0xffffffffu);
  }
  std::sort(buf, buf + kc);
  return true;
}

#if GROVE_CODECS_X86

// The SIMD selection, in three steps:
//  1. Cut the chunk into G groups (lane j of a run of consecutive vectors) and take each group's
//     maximum |x|. The kc-th largest group maximum Q is a lower bound on the kc-th largest |x|:
//     kc distinct groups hold an element >= Q. With about 2·kc groups, few values pass it.
//  2. Compact the values with |x| >= Q (and their indices), in index order.
//  3. T = the kc-th largest candidate; send every candidate > T and the lowest-index ones == T.
// Group maxima double as the finiteness check (a NaN or Inf pattern is the largest |x| bits).
// |x| bits of vector v of the chunk; the tail vector comes padded from `tail`.
GROVE_SIMD_TARGET inline __m256i topk_abs8(const float* x, std::size_t v, std::size_t full,
                                           const std::int32_t* tail) {
  if (v == full) return load8(tail);
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * v)),
                          _mm256_set1_epi32(0x7fffffff));
}

GROVE_SIMD_TARGET bool select_topk_simd(const float* x, std::uint32_t len, std::uint32_t kc,
                                        TopKScratch& s) {
  std::uint32_t* buf = s.buf.data();
  if (kc >= len) return select_all(x, len, buf);
  const std::size_t full = len / 8;       // whole vectors
  const std::size_t nvt = (len + 7) / 8;  // vectors, the tail padded with -1
  const std::size_t per = std::max<std::size_t>(1, 8 * nvt / (2 * std::size_t{kc}));
  const std::size_t ng = (nvt + per - 1) / per;  // group-maximum vectors: 8·ng >= kc groups
  alignas(32) std::int32_t tail[8];
  for (int j = 0; j < 8; ++j) {
    const std::size_t i = 8 * full + static_cast<std::size_t>(j);
    tail[j] = i < len ? static_cast<std::int32_t>(bits_of(x[i]) & 0x7fffffffu) : -1;
  }
  std::int32_t* gm = s.gm.data();
  __m256i bad = _mm256_setzero_si256();
  for (std::size_t g = 0; g < ng; ++g) {
    const std::size_t v0 = g * per, v1 = std::min(v0 + per, nvt);
    __m256i mx = _mm256_set1_epi32(-1), mx2 = _mm256_set1_epi32(-1);
    std::size_t v = v0;
    for (; v + 2 <= v1; v += 2) {
      mx = _mm256_max_epi32(mx, topk_abs8(x, v, full, tail));
      mx2 = _mm256_max_epi32(mx2, topk_abs8(x, v + 1, full, tail));
    }
    for (; v < v1; ++v) mx = _mm256_max_epi32(mx, topk_abs8(x, v, full, tail));
    mx = _mm256_max_epi32(mx, mx2);
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(mx, _mm256_set1_epi32(0x7f7fffff)));
    store8(gm + 8 * g, mx);
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  const std::size_t ngroups = 8 * ng;
  const std::int32_t q = select_kth_simd(gm, ngroups, ngroups - kc, s.hint_q);
  // Candidates |x| >= q, in index order (q >= -1, so the -1 padding never passes in a tail that
  // is handled separately).
  std::int32_t* cv = s.cv.data();
  std::uint32_t* ci = s.ci.data();
  const __m256i q1 = _mm256_set1_epi32(q - 1);
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  std::size_t nc = 0;
  for (std::size_t v = 0; v < full; ++v) {
    const __m256i a = topk_abs8(x, v, full, tail);
    const unsigned mask =
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, q1))));
    const __m256i perm = compress_perm(mask);
    store8(cv + nc, _mm256_permutevar8x32_epi32(a, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ci + nc),
                        _mm256_permutevar8x32_epi32(idx, perm));
    nc += static_cast<std::size_t>(_mm_popcnt_u32(mask));
    idx = _mm256_add_epi32(idx, eight);
  }
  for (std::size_t i = 8 * full; i < len; ++i) {
    const std::int32_t a = tail[i - 8 * full];
    cv[nc] = a;
    ci[nc] = static_cast<std::uint32_t>(i);
    nc += (a >= q);
  }
  // nc >= kc: T = the candidate of rank nc - kc (ascending).
  std::int32_t* sel = s.sel.data();
  std::memcpy(sel, cv, nc * sizeof(std::int32_t));
  const std::int32_t t = select_kth_simd(sel, nc, nc - kc, s.hint_t);
  std::size_t above = 0;
  for (std::size_t j = 0; j < nc; ++j) above += (cv[j] > t);
  std::size_t ties = kc - above;  // the lowest-index candidates equal to T that are sent
  std::size_t k = 0;
  for (std::size_t j = 0; j < nc; ++j) {
    const bool eq = cv[j] == t;
    const bool take = cv[j] > t || (eq && ties != 0);
    buf[k] = ci[j];
    k += take;
    ties -= (take && eq);
  }
  return true;
}

#else
constexpr bool (*select_topk_simd)(const float*, std::uint32_t, std::uint32_t,
                                   TopKScratch&) = nullptr;
#endif  // GROVE_CODECS_X86

// Checks one message against n values: indices, scales, padding, finiteness.
CodecError topk_validate(const TopKCodec& c, const std::uint8_t* in, std::size_t n) {
  std::size_t off = 0;
  for (std::size_t base = 0; base < n; base += c.chunk) {
    const std::uint32_t len = static_cast<std::uint32_t>(std::min<std::size_t>(c.chunk, n - base));
    const std::uint32_t kc = std::min(c.k, len);
    const std::uint8_t* idx;
    if (c.two_bit) {
      const float s = load_f32(in + off);
      if (!(s >= 0.0f && s <= FLT_MAX)) return CodecError::malformed;
      const std::uint8_t* codes = in + off + 4;
      const std::size_t nbytes = (kc + 3) / 4;
      if (kc % 4) {
        const unsigned used = 2 * (kc % 4);
        if (codes[nbytes - 1] >> used) return CodecError::malformed;
      }
      idx = codes + nbytes;
    } else {
      bool bad = false;
      for (std::uint32_t j = 0; j < kc; ++j) {
        bad |= not_finite_bits(bits_of(load_f32(in + off + 4 * j)));
      }
      if (bad) return CodecError::not_finite;
      idx = in + off + 4 * kc;
    }
    std::int32_t prev = -1;
    bool bad = false;
    for (std::uint32_t j = 0; j < kc; ++j) {
      const std::int32_t i = load_u16(idx + 2 * j);
      bad |= (i <= prev) | (static_cast<std::uint32_t>(i) >= len);
      prev = i;
    }
    if (bad) return CodecError::malformed;
    off += topk_chunk_bytes(kc, c.two_bit);
  }
  return CodecError::ok;
}

// Applies one validated chunk message p (kc values) to o: o[i] = v (assign) or o[i] += w·v.
template <bool kAssign>
void topk_apply_chunk(bool two_bit, const std::uint8_t* p, std::uint32_t kc, float* o, float w) {
  if (two_bit) {
    const float s = load_f32(p);
    const float lv[4] = {q2_level(s, false), q2_level(s, true), -q2_level(s, false),
                         -q2_level(s, true)};
    const std::uint8_t* codes = p + 4;
    const std::uint8_t* idx = codes + (kc + 3) / 4;
    for (std::uint32_t j = 0; j < kc; ++j) {
      const float v = lv[(codes[j / 4] >> (2 * (j % 4))) & 3u];
      const std::uint16_t i = load_u16(idx + 2 * j);
      if constexpr (kAssign) {
        o[i] = v;
      } else {
        o[i] += w * v;
      }
    }
  } else {
    const std::uint8_t* idx = p + 4 * kc;
    for (std::uint32_t j = 0; j < kc; ++j) {
      const float v = load_f32(p + 4 * j);
      const std::uint16_t i = load_u16(idx + 2 * j);
      if constexpr (kAssign) {
        o[i] = v;
      } else {
        o[i] += w * v;
      }
    }
  }
}

// Applies a validated message: out[i] = v (assign) or out[i] += w·v.
template <bool kAssign>
void topk_apply(const TopKCodec& c, const std::uint8_t* in, float* out, std::size_t n, float w) {
  std::size_t off = 0;
  for (std::size_t base = 0; base < n; base += c.chunk) {
    const std::uint32_t len = static_cast<std::uint32_t>(std::min<std::size_t>(c.chunk, n - base));
    const std::uint32_t kc = std::min(c.k, len);
    topk_apply_chunk<kAssign>(c.two_bit, in + off, kc, out + base, w);
    off += topk_chunk_bytes(kc, c.two_bit);
  }
}

}  // namespace

namespace detail {

// TopKCodec::encode with a choice of selection kernel (the SIMD and portable selections pick the
// same set; tests compare them through this entry point).
CodecError topk_encode(const TopKCodec& c, std::span<float> e, std::span<std::uint8_t> out,
                       Impl impl) {
  if (!c.valid()) return CodecError::malformed;
  const std::size_t n = e.size();
  if (out.size() != c.encoded_size(n)) return CodecError::size_mismatch;
  const auto select = pick_kernel(impl, select_topk_simd, select_topk_portable);
  const bool simd = select != select_topk_portable;
  const std::size_t chunk = c.chunk;
  const std::size_t cap = std::min<std::size_t>(chunk, 2 * std::size_t{c.k});
  TopKScratch s;
  s.buf.resize(std::min<std::size_t>(chunk, c.k) + 8);
  if (simd) {
    const std::size_t nvt = (chunk + 7) / 8;
    s.gm.resize(8 * nvt);
    s.cv.resize(8 * nvt + 8);
    s.sel.resize(8 * nvt + 8);
    s.ci.resize(8 * nvt + 8);
  } else {
    s.keys.resize(cap);
  }
  // Error feedback runs chunk by chunk (e -= Δ̂ with exactly the values a decoder produces, as
  // topk_apply would). So that a non-finite value in a later chunk leaves e untouched, the old
  // values of sent entries are restored from the message (fp32) or from `saved` (2-bit).
  std::vector<float> saved;
  if (c.two_bit) saved.reserve(n / chunk * std::min<std::size_t>(c.k, chunk));
  std::size_t off = 0;
  for (std::size_t base = 0; base < n; base += chunk) {
    const std::uint32_t len = static_cast<std::uint32_t>(std::min(chunk, n - base));
    const std::uint32_t kc = std::min(c.k, len);
    float* x = e.data() + base;
    if (!select(x, len, kc, s)) {
      std::size_t off2 = 0, j = 0;
      for (std::size_t b2 = 0; b2 < base; b2 += chunk) {
        const std::uint32_t kc2 = std::min<std::uint32_t>(c.k, static_cast<std::uint32_t>(chunk));
        const std::uint8_t* m = out.data() + off2;
        const std::uint8_t* idx = m + (c.two_bit ? 4 + (kc2 + 3) / 4 : 4 * kc2);
        for (std::uint32_t q = 0; q < kc2; ++q) {
          e[b2 + load_u16(idx + 2 * q)] = c.two_bit ? saved[j++] : load_f32(m + 4 * q);
        }
        off2 += topk_chunk_bytes(kc2, c.two_bit);
      }
      return CodecError::not_finite;
    }
    const std::uint32_t* buf = s.buf.data();
    std::uint8_t* p = out.data() + off;
    if (c.two_bit) {
      double sum = 0.0;
      for (std::uint32_t j = 0; j < kc; ++j) sum += std::fabs(x[buf[j]]);
      const float sc = static_cast<float>(sum / kc);
      store_f32(p, sc);
      std::uint8_t* codes = p + 4;
      std::uint8_t* idx = codes + (kc + 3) / 4;
      std::memset(codes, 0, (kc + 3) / 4);
      for (std::uint32_t j = 0; j < kc; ++j) {
        const float v = x[buf[j]];
        const unsigned code = (static_cast<unsigned>(std::signbit(v)) << 1) |
                              static_cast<unsigned>(std::fabs(v) >= sc);
        codes[j / 4] = static_cast<std::uint8_t>(codes[j / 4] | (code << (2 * (j % 4))));
        store_u16(idx + 2 * j, static_cast<std::uint16_t>(buf[j]));
      }
    } else {
      for (std::uint32_t j = 0; j < kc; ++j) {
        store_f32(p + 4 * j, x[buf[j]]);
        store_u16(p + 4 * kc + 2 * j, static_cast<std::uint16_t>(buf[j]));
      }
    }
    if (c.two_bit && base + chunk < n) {  // a later chunk may still fail
      for (std::uint32_t j = 0; j < kc; ++j) saved.push_back(x[buf[j]]);
    }
    topk_apply_chunk<false>(c.two_bit, p, kc, x, -1.0f);
    off += topk_chunk_bytes(kc, c.two_bit);
  }
  return CodecError::ok;
}

}  // namespace detail

std::size_t TopKCodec::encoded_size(std::size_t n) const {
  if (!valid()) return 0;
  const std::size_t full = n / chunk, rem = n % chunk;
  std::size_t size = full * topk_chunk_bytes(std::min<std::size_t>(k, chunk), two_bit);
  if (rem) size += topk_chunk_bytes(std::min<std::size_t>(k, rem), two_bit);
  return size;
}

CodecError TopKCodec::encode(std::span<float> e, std::span<std::uint8_t> out) const {
  return detail::topk_encode(*this, e, out, Impl::best);
}

CodecError TopKCodec::decode(std::span<const std::uint8_t> in, std::span<float> out) const {
  if (!valid()) return CodecError::malformed;
  if (in.size() != encoded_size(out.size())) return CodecError::size_mismatch;
  if (const CodecError r = topk_validate(*this, in.data(), out.size()); r != CodecError::ok) {
    return r;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  topk_apply<true>(*this, in.data(), out.data(), out.size(), 1.0f);
  return CodecError::ok;
}

CodecError TopKCodec::decode_add(std::span<const std::uint8_t> in, std::span<float> out,
                                 float weight) const {
  if (!valid()) return CodecError::malformed;
  if (in.size() != encoded_size(out.size())) return CodecError::size_mismatch;
  if (const CodecError r = topk_validate(*this, in.data(), out.size()); r != CodecError::ok) {
    return r;
  }
  topk_apply<false>(*this, in.data(), out.data(), out.size(), weight);
  return CodecError::ok;
}

}  // namespace grove::optim
