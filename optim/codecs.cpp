#include "optim/codecs.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define GROVE_CODECS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define GROVE_CODECS_X86 0
#endif

static_assert(std::endian::native == std::endian::little, "codecs assume a little-endian host");

namespace grove::optim {

const char* to_string(CodecError e) {
  switch (e) {
    case CodecError::ok:
      return "ok";
    case CodecError::size_mismatch:
      return "size mismatch";
    case CodecError::not_finite:
      return "not finite";
    case CodecError::malformed:
      return "malformed";
  }
  return "unknown";
}

bool simd_available() {
#if GROVE_CODECS_X86
  static const bool have = [] {
    // clang 14 lacks __builtin_cpu_supports("f16c"): read CPUID.1:ECX bit 29 directly. avx2
    // support (checked by the builtin) implies the OS saves the ymm state.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return __builtin_cpu_supports("avx2") && (ecx & (1u << 29)) != 0;
  }();
  return have;
#else
  return false;
#endif
}

namespace {

inline bool use_simd(Impl impl) {
  return impl == Impl::best && simd_available();
}

inline std::uint32_t bits_of(float x) {
  return std::bit_cast<std::uint32_t>(x);
}
inline float float_of(std::uint32_t u) {
  return std::bit_cast<float>(u);
}

inline void store_u16(std::uint8_t* p, std::uint16_t v) {
  std::memcpy(p, &v, 2);
}
inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void store_f32(std::uint8_t* p, float v) {
  std::memcpy(p, &v, 4);
}
inline float load_f32(const std::uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

inline bool not_finite_bits(std::uint32_t u) {
  return (u & 0x7f800000u) == 0x7f800000u;
}

// --- fp16 ----------------------------------------------------------------------------------

constexpr float kHalfMax = 65504.0f;

// Finite float -> half, round-to-nearest-even (F. Giesen's float_to_half_fast3_rtne). The input
// must already be clamped to [-65504, 65504].
inline std::uint16_t half_from_clamped(float x) {
  std::uint32_t f = bits_of(x);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  f &= 0x7fffffffu;
  std::uint16_t h;
  if (f < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Adding 0.5f aligns the value's bits so that the FPU's RNE does the rounding.
    const float sum = float_of(f) + 0.5f;
    h = static_cast<std::uint16_t>(bits_of(sum) - 0x3f000000u);
  } else {
    const std::uint32_t mant_odd = (f >> 13) & 1u;
    f += 0xc8000fffu;  // rebias exponent (-112 << 23) and add 0xfff rounding bias
    f += mant_odd;
    h = static_cast<std::uint16_t>(f >> 13);
  }
  return static_cast<std::uint16_t>(h | sign);
}

inline float clamp_half(float x) {
  return std::min(std::max(x, -kHalfMax), kHalfMax);
}

}  // namespace

std::uint16_t float_to_half(float x) {
  const std::uint32_t u = bits_of(x);
  if (not_finite_bits(u)) {
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    return static_cast<std::uint16_t>(sign | ((u & 0x7fffffu) ? 0x7e00u : 0x7c00u));
  }
  return half_from_clamped(clamp_half(x));
}

float half_to_float(std::uint16_t h) {
  std::uint32_t o = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t exp = o & 0x0f800000u;
  o += (127u - 15u) << 23;
  if (exp == 0x0f800000u) {
    o += (128u - 16u) << 23;  // Inf/NaN
  } else if (exp == 0) {
    o += 1u << 23;  // subnormal: renormalise
    o = bits_of(float_of(o) - float_of(113u << 23));
  }
  o |= static_cast<std::uint32_t>(h & 0x8000u) << 16;
  return float_of(o);
}

namespace {

bool fp16_encode_portable(const float* x, std::size_t n, std::uint8_t* out) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    bad |= not_finite_bits(bits_of(x[i]));
    store_u16(out + 2 * i, half_from_clamped(clamp_half(x[i])));
  }
  return !bad;
}

bool fp16_decode_portable(const std::uint8_t* in, std::size_t n, float* out) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = load_u16(in + 2 * i);
    bad |= (h & 0x7c00u) == 0x7c00u;
    out[i] = half_to_float(h);
  }
  return !bad;
}

// --- bf16 ----------------------------------------------------------------------------------

inline std::uint16_t bf16_kernel(std::uint32_t u) {
  const std::uint32_t a = u & 0x7fffffffu;
  std::uint32_t r = (a + 0x7fffu + ((a >> 16) & 1u)) >> 16;
  r = std::min(r, 0x7f7fu);
  return static_cast<std::uint16_t>(r | ((u >> 16) & 0x8000u));
}

bool bf16_encode_portable(const float* x, std::size_t n, std::uint8_t* out) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = bits_of(x[i]);
    bad |= not_finite_bits(u);
    store_u16(out + 2 * i, bf16_kernel(u));
  }
  return !bad;
}

bool bf16_decode_portable(const std::uint8_t* in, std::size_t n, float* out) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = load_u16(in + 2 * i);
    bad |= (h & 0x7f80u) == 0x7f80u;
    out[i] = float_of(static_cast<std::uint32_t>(h) << 16);
  }
  return !bad;
}

#if GROVE_CODECS_X86

__attribute__((target("avx2,f16c"))) bool fp16_encode_simd(const float* x, std::size_t n,
                                                           std::uint8_t* out) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 fmax = _mm256_set1_ps(FLT_MAX);
  const __m256 hmax = _mm256_set1_ps(kHalfMax);
  const __m256 hmin = _mm256_set1_ps(-kHalfMax);
  __m256 bad = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 v0 = _mm256_loadu_ps(x + i);
    __m256 v1 = _mm256_loadu_ps(x + i + 8);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v0, absmask), fmax, _CMP_NLE_UQ));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v1, absmask), fmax, _CMP_NLE_UQ));
    v0 = _mm256_min_ps(_mm256_max_ps(v0, hmin), hmax);
    v1 = _mm256_min_ps(_mm256_max_ps(v1, hmin), hmax);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i + 16),
                     _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  const bool ok_tail = fp16_encode_portable(x + i, n - i, out + 2 * i);
  return ok_tail && _mm256_movemask_ps(bad) == 0;
}

__attribute__((target("avx2,f16c"))) bool fp16_decode_simd(const std::uint8_t* in, std::size_t n,
                                                           float* out) {
  const __m128i expmask = _mm_set1_epi16(0x7c00);
  __m128i bad = _mm_setzero_si128();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, expmask), expmask));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  const bool ok_tail = fp16_decode_portable(in + 2 * i, n - i, out + i);
  return ok_tail && _mm_movemask_epi8(bad) == 0;
}

__attribute__((target("avx2"))) inline __m256i bf16_conv8(__m256i v, __m256i& bad) {
  const __m256i a = _mm256_and_si256(v, _mm256_set1_epi32(0x7fffffff));
  bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f7fffff)));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7fff)), lsb), 16);
  r = _mm256_min_epu32(r, _mm256_set1_epi32(0x7f7f));
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(0x8000)));
}

__attribute__((target("avx2"))) bool bf16_encode_simd(const float* x, std::size_t n,
                                                      std::uint8_t* out) {
  __m256i bad = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i r0 = bf16_conv8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), bad);
    const __m256i r1 =
        bf16_conv8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), bad);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), p);
  }
  const bool ok_tail = bf16_encode_portable(x + i, n - i, out + 2 * i);
  return ok_tail && _mm256_testz_si256(bad, bad);
}

__attribute__((target("avx2"))) bool bf16_decode_simd(const std::uint8_t* in, std::size_t n,
                                                      float* out) {
  const __m256i expmask = _mm256_set1_epi16(0x7f80);
  __m256i bad = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, expmask), expmask));
    const __m256i lo = _mm256_unpacklo_epi16(_mm256_setzero_si256(), h);
    const __m256i hi = _mm256_unpackhi_epi16(_mm256_setzero_si256(), h);
    // unpack works per 128-bit lane: lo = elements 0-3 and 8-11, hi = 4-7 and 12-15.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 8),
                        _mm256_permute2x128_si256(lo, hi, 0x31));
  }
  const bool ok_tail = bf16_decode_portable(in + 2 * i, n - i, out + i);
  return ok_tail && _mm256_testz_si256(bad, bad);
}

#else
// No SIMD kernels off x86: run_kernel falls back to the portable ones.
constexpr bool (*fp16_encode_simd)(const float*, std::size_t, std::uint8_t*) = nullptr;
constexpr bool (*fp16_decode_simd)(const std::uint8_t*, std::size_t, float*) = nullptr;
constexpr bool (*bf16_encode_simd)(const float*, std::size_t, std::uint8_t*) = nullptr;
constexpr bool (*bf16_decode_simd)(const std::uint8_t*, std::size_t, float*) = nullptr;
#endif  // GROVE_CODECS_X86

// Runs the SIMD kernel when it exists and `impl` allows it, else the portable one. Kernels
// return false when a value is not finite.
template <class In, class Out>
CodecError run_kernel(Impl impl, bool (*simd)(In, std::size_t, Out),
                      bool (*portable)(In, std::size_t, Out), In in, std::size_t n, Out out) {
  const bool ok = simd && use_simd(impl) ? simd(in, n, out) : portable(in, n, out);
  return ok ? CodecError::ok : CodecError::not_finite;
}

}  // namespace

CodecError fp16_encode(std::span<const float> in, std::span<std::uint8_t> out, Impl impl) {
  if (out.size() != fp16_encoded_size(in.size())) return CodecError::size_mismatch;
  return run_kernel(impl, fp16_encode_simd, fp16_encode_portable, in.data(), in.size(), out.data());
}

CodecError fp16_decode(std::span<const std::uint8_t> in, std::span<float> out, Impl impl) {
  if (in.size() != fp16_encoded_size(out.size())) return CodecError::size_mismatch;
  return run_kernel(impl, fp16_decode_simd, fp16_decode_portable, in.data(), out.size(),
                    out.data());
}

std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if (not_finite_bits(u)) {
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    return static_cast<std::uint16_t>(sign | ((u & 0x7fffffu) ? 0x7fc0u : 0x7f80u));
  }
  return bf16_kernel(u);
}

float bf16_to_float(std::uint16_t h) {
  return float_of(static_cast<std::uint32_t>(h) << 16);
}

CodecError bf16_encode(std::span<const float> in, std::span<std::uint8_t> out, Impl impl) {
  if (out.size() != bf16_encoded_size(in.size())) return CodecError::size_mismatch;
  return run_kernel(impl, bf16_encode_simd, bf16_encode_portable, in.data(), in.size(), out.data());
}

CodecError bf16_decode(std::span<const std::uint8_t> in, std::span<float> out, Impl impl) {
  if (in.size() != bf16_encoded_size(out.size())) return CodecError::size_mismatch;
  return run_kernel(impl, bf16_decode_simd, bf16_decode_portable, in.data(), out.size(),
                    out.data());
}

// --- E3M0 ------------------------------------------------------------------------------------

namespace {

bool e3m0_params_ok(const E3M0Params& p) {
  return p.block >= 2 && p.block % 2 == 0;
}

std::size_t e3m0_blocks(std::size_t n, const E3M0Params& p) {
  return (n + p.block - 1) / p.block;
}

struct E3M0Thresholds {
  float t[6];  // t[0] = s/8 (zero cut), t[j] = s·2^(j-3.5) for j = 1..5
};

inline E3M0Thresholds e3m0_thresholds(float s) {
  // 2^-1.5, 2^-0.5, 2^0.5, 2^1.5, 2^2.5 rounded to float.
  return {{s * 0.125f, s * 0.35355339f, s * 0.70710678f, s * 1.41421356f, s * 2.82842712f,
           s * 5.65685425f}};
}

inline std::uint8_t e3m0_code(float x, const E3M0Thresholds& th) {
  const float a = std::fabs(x);
  const unsigned f =
      1u + (a >= th.t[1]) + (a >= th.t[2]) + (a >= th.t[3]) + (a >= th.t[4]) + (a >= th.t[5]);
  const bool nz = a > 0.0f && a >= th.t[0];
  const unsigned sign = bits_of(x) >> 31;
  return static_cast<std::uint8_t>(nz ? (f | (sign << 3)) : 0u);
}

// The element of rank r (0-based, ascending) of u[0, m): non-negative float bit patterns, which
// order like the floats. Radix select on 8-bit digits, most significant first: O(m), no
// data-dependent branches in the passes. Reorders u.
std::uint32_t select_rank(std::uint32_t* u, std::size_t m, std::size_t r) {
  std::uint16_t hist[256];
  for (int shift : {23, 15, 7, 0}) {
    if (m <= 8) {
      std::nth_element(u, u + r, u + m);
      return u[r];
    }
    std::memset(hist, 0, sizeof hist);
    for (std::size_t i = 0; i < m; ++i) ++hist[(u[i] >> shift) & 0xffu];
    std::size_t below = 0;
    unsigned b = 0;
    while (below + hist[b] <= r) below += hist[b++];
    r -= below;
    std::size_t j = 0;
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint32_t v = u[i];
      u[j] = v;
      j += ((v >> shift) & 0xffu) == b;
    }
    m = j;
  }
  return u[0];  // every remaining value is equal
}

// Returns false if the block holds a non-finite value. `scratch` has room for the block.
inline bool e3m0_scale(const float* x, std::size_t len, std::uint32_t* scratch, float& scale) {
  std::size_t m = 0;
  bool bad = false;
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t a = bits_of(x[i]) & 0x7fffffffu;
    bad |= a > 0x7f7fffffu;
    scratch[m] = a;
    m += (a != 0);
  }
  if (bad) return false;
  scale = m == 0 ? 0.0f : float_of(select_rank(scratch, m, (m - 1) / 2));
  return true;
}

}  // namespace

std::size_t e3m0_encoded_size(std::size_t n, E3M0Params p) {
  if (!e3m0_params_ok(p)) return 0;
  return 4 * e3m0_blocks(n, p) + (n + 1) / 2;
}

CodecError e3m0_encode(std::span<const float> in, std::span<std::uint8_t> out, E3M0Params p,
                       Impl impl) {
  (void)impl;  // one implementation (the scalar loop is branch-free)
  if (!e3m0_params_ok(p)) return CodecError::malformed;
  const std::size_t n = in.size();
  if (out.size() != e3m0_encoded_size(n, p)) return CodecError::size_mismatch;
  const std::size_t nb = e3m0_blocks(n, p);
  std::uint8_t* codes = out.data() + 4 * nb;
  std::vector<std::uint32_t> scratch(std::min(p.block, n));
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t base = b * p.block;
    const std::size_t len = std::min(p.block, n - base);
    const float* x = in.data() + base;
    float s;
    if (!e3m0_scale(x, len, scratch.data(), s)) return CodecError::not_finite;
    store_f32(out.data() + 4 * b, s);
    const E3M0Thresholds th = e3m0_thresholds(s);
    std::uint8_t* c = codes + base / 2;
    const std::size_t pairs = len / 2;
    for (std::size_t i = 0; i < pairs; ++i) {
      c[i] =
          static_cast<std::uint8_t>(e3m0_code(x[2 * i], th) | (e3m0_code(x[2 * i + 1], th) << 4));
    }
    if (len % 2) c[pairs] = e3m0_code(x[len - 1], th);
  }
  return CodecError::ok;
}

CodecError e3m0_decode(std::span<const std::uint8_t> in, std::span<float> out, E3M0Params p,
                       Impl impl) {
  (void)impl;
  if (!e3m0_params_ok(p)) return CodecError::malformed;
  const std::size_t n = out.size();
  if (in.size() != e3m0_encoded_size(n, p)) return CodecError::size_mismatch;
  const std::size_t nb = e3m0_blocks(n, p);
  const std::uint8_t* codes = in.data() + 4 * nb;
  constexpr std::uint32_t kInvalid = (1u << 7) | (1u << 8) | (1u << 15);
  std::uint32_t bad = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const float s = load_f32(in.data() + 4 * b);
    if (!(s >= 0.0f && s <= FLT_MAX)) return CodecError::malformed;
    float lut[16];
    lut[0] = 0.0f;
    for (int f = 1; f <= 6; ++f) {
      const float v = std::min(std::ldexp(s, f - 3), FLT_MAX);
      lut[f] = v;
      lut[8 + f] = -v;
    }
    lut[7] = lut[8] = lut[15] = 0.0f;
    const std::size_t base = b * p.block;
    const std::size_t len = std::min(p.block, n - base);
    const std::uint8_t* c = codes + base / 2;
    float* o = out.data() + base;
    const std::size_t pairs = len / 2;
    for (std::size_t i = 0; i < pairs; ++i) {
      const unsigned lo = c[i] & 15u, hi = c[i] >> 4;
      bad |= (kInvalid >> lo) | (kInvalid >> hi);
      o[2 * i] = lut[lo];
      o[2 * i + 1] = lut[hi];
    }
    if (len % 2) {
      const unsigned lo = c[pairs] & 15u, hi = c[pairs] >> 4;
      bad |= (kInvalid >> lo) | (hi != 0);
      o[len - 1] = lut[lo];
    }
  }
  return (bad & 1u) ? CodecError::malformed : CodecError::ok;
}

// --- top-k -----------------------------------------------------------------------------------

namespace {

inline std::size_t topk_chunk_bytes(std::size_t kc, bool two_bit) {
  return two_bit ? 4 + (kc + 3) / 4 + 2 * kc : 6 * kc;
}

inline float q2_level(float s, bool big) {
  return std::min(big ? s * 1.5f : s * 0.5f, FLT_MAX);
}

// Selects the kc largest |x| of x[0, len) (ties: lower index) into buf (capacity >= min(len,
// 2 kc)), sorted by index. Returns false if x holds a non-finite value.
bool select_topk(const float* x, std::uint32_t len, std::uint32_t kc, std::uint32_t* buf,
                 std::uint64_t* keys) {
  bool bad = false;
  if (kc >= len) {
    for (std::uint32_t i = 0; i < len; ++i) {
      bad |= not_finite_bits(bits_of(x[i]));
      buf[i] = i;
    }
    return !bad;
  }
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

// Applies a validated message: out[i] = v (assign) or out[i] += w·v.
template <bool kAssign>
void topk_apply(const TopKCodec& c, const std::uint8_t* in, float* out, std::size_t n, float w) {
  std::size_t off = 0;
  for (std::size_t base = 0; base < n; base += c.chunk) {
    const std::uint32_t len = static_cast<std::uint32_t>(std::min<std::size_t>(c.chunk, n - base));
    const std::uint32_t kc = std::min(c.k, len);
    float* o = out + base;
    if (c.two_bit) {
      const float s = load_f32(in + off);
      const float lv[4] = {q2_level(s, false), q2_level(s, true), -q2_level(s, false),
                           -q2_level(s, true)};
      const std::uint8_t* codes = in + off + 4;
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
      const std::uint8_t* vals = in + off;
      const std::uint8_t* idx = vals + 4 * kc;
      for (std::uint32_t j = 0; j < kc; ++j) {
        const float v = load_f32(vals + 4 * j);
        const std::uint16_t i = load_u16(idx + 2 * j);
        if constexpr (kAssign) {
          o[i] = v;
        } else {
          o[i] += w * v;
        }
      }
    }
    off += topk_chunk_bytes(kc, c.two_bit);
  }
}

}  // namespace

std::size_t TopKCodec::encoded_size(std::size_t n) const {
  if (!valid()) return 0;
  const std::size_t full = n / chunk, rem = n % chunk;
  std::size_t size = full * topk_chunk_bytes(std::min<std::size_t>(k, chunk), two_bit);
  if (rem) size += topk_chunk_bytes(std::min<std::size_t>(k, rem), two_bit);
  return size;
}

CodecError TopKCodec::encode(std::span<float> e, std::span<std::uint8_t> out) const {
  if (!valid()) return CodecError::malformed;
  const std::size_t n = e.size();
  if (out.size() != encoded_size(n)) return CodecError::size_mismatch;
  const std::size_t cap = std::min<std::size_t>(chunk, 2 * std::size_t{k});
  std::vector<std::uint32_t> buf(cap);
  std::vector<std::uint64_t> keys(cap);
  std::size_t off = 0;
  for (std::size_t base = 0; base < n; base += chunk) {
    const std::uint32_t len = static_cast<std::uint32_t>(std::min<std::size_t>(chunk, n - base));
    const std::uint32_t kc = std::min(k, len);
    const float* x = e.data() + base;
    if (!select_topk(x, len, kc, buf.data(), keys.data())) return CodecError::not_finite;
    std::uint8_t* p = out.data() + off;
    if (two_bit) {
      double sum = 0.0;
      for (std::uint32_t j = 0; j < kc; ++j) sum += std::fabs(x[buf[j]]);
      const float s = static_cast<float>(sum / kc);
      store_f32(p, s);
      std::uint8_t* codes = p + 4;
      std::uint8_t* idx = codes + (kc + 3) / 4;
      std::memset(codes, 0, (kc + 3) / 4);
      for (std::uint32_t j = 0; j < kc; ++j) {
        const float v = x[buf[j]];
        const unsigned code = (static_cast<unsigned>(std::signbit(v)) << 1) |
                              static_cast<unsigned>(std::fabs(v) >= s);
        codes[j / 4] = static_cast<std::uint8_t>(codes[j / 4] | (code << (2 * (j % 4))));
        store_u16(idx + 2 * j, static_cast<std::uint16_t>(buf[j]));
      }
    } else {
      for (std::uint32_t j = 0; j < kc; ++j) {
        store_f32(p + 4 * j, x[buf[j]]);
        store_u16(p + 4 * kc + 2 * j, static_cast<std::uint16_t>(buf[j]));
      }
    }
    off += topk_chunk_bytes(kc, two_bit);
  }
  // Error feedback with exactly the values a decoder produces: e -= Δ̂.
  topk_apply<false>(*this, out.data(), e.data(), n, -1.0f);
  return CodecError::ok;
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

// --- metrics ---------------------------------------------------------------------------------

double l2_norm(const float* x, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

double rms_distance(const float* a, const float* b, std::size_t n) {
  if (n == 0) return 0.0;
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s / static_cast<double>(n));
}

double mass_kept(const float* e_before, const float* sent, std::size_t n) {
  double eb = 0.0, se = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    eb += static_cast<double>(e_before[i]) * e_before[i];
    se += static_cast<double>(sent[i]) * sent[i];
  }
  if (eb == 0.0) return 1.0;
  return se / eb;
}

}  // namespace grove::optim
