#include "optim/codecs.hpp"

#include <algorithm>
#include <array>
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
    // clang 14 lacks __builtin_cpu_supports("f16c"): read CPUID.1:ECX bits 29 (F16C) and 23
    // (POPCNT, used by the selection kernels) directly. avx2 support (checked by the builtin)
    // implies the OS saves the ymm state.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return __builtin_cpu_supports("avx2") && (ecx & (1u << 29)) != 0 && (ecx & (1u << 23)) != 0;
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

// The SIMD kernel when it exists and `impl` allows it, else the portable one.
template <class F>
F* pick_kernel(Impl impl, F* simd, F* portable) {
  return simd && use_simd(impl) ? simd : portable;
}

// Runs the kernel pick_kernel chooses. Kernels return false when a value is not finite.
template <class In, class Out>
CodecError run_kernel(Impl impl, bool (*simd)(In, std::size_t, Out),
                      bool (*portable)(In, std::size_t, Out), In in, std::size_t n, Out out) {
  return pick_kernel(impl, simd, portable)(in, n, out) ? CodecError::ok : CodecError::not_finite;
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

namespace {

// --- SIMD selection helpers ------------------------------------------------------------------
//
// Exact order statistics of small int32 arrays (non-negative float bit patterns, which order
// like the floats, and -1 as padding). The AVX2 selector narrows a value interval [lo, hi) that
// holds the wanted element by counting, with vector compares, how many elements lie below a few
// pivots per pass: first around the previous call's answer (neighbouring blocks and chunks have
// similar statistics), then interpolated within the interval (quartiles when a pass does not
// halve the candidates). The array is compacted to the interval once that holds a quarter of the
// elements, and at most 16 candidates are ranked directly. The result is the exact element of
// the requested rank, so it agrees with any other exact selection (the portable radix select and
// nth_element); the guesses only affect speed.

#if GROVE_CODECS_X86

#define GROVE_SIMD_TARGET __attribute__((target("avx2,f16c,popcnt")))

// For each 8-bit lane mask, the indices of the set lanes packed as nibbles (lowest first): the
// vpermd control that moves the selected lanes to the front.
constexpr auto kCompressLut = [] {
  std::array<std::uint32_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    std::uint32_t v = 0;
    unsigned j = 0;
    for (unsigned b = 0; b < 8; ++b) {
      if ((m >> b) & 1u) v |= b << (4 * j++);
    }
    t[m] = v;
  }
  return t;
}();

GROVE_SIMD_TARGET inline __m256i compress_perm(unsigned mask) {
  // vpermd reads only the low 3 bits of each lane: no mask needed after the shift.
  return _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(kCompressLut[mask])),
                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
}

GROVE_SIMD_TARGET inline std::int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

GROVE_SIMD_TARGET inline __m256i load8(const std::int32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
GROVE_SIMD_TARGET inline void store8(std::int32_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// Moves the elements of the nv vectors at a that lie in [lo, hi] to the front, in place, and
// returns their count. Requires INT32_MIN < lo.
GROVE_SIMD_TARGET std::size_t compact_range(std::int32_t* a, std::size_t nv, std::int32_t lo,
                                            std::int32_t hi) {
  const __m256i lo1 = _mm256_set1_epi32(lo - 1), hiv = _mm256_set1_epi32(hi);
  std::size_t j = 0;
  for (std::size_t i = 0; i < nv; ++i) {
    const __m256i v = load8(a + 8 * i);
    const __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(v, hiv), _mm256_cmpgt_epi32(v, lo1));
    const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(in)));
    // Writes a[j, j+8) with j <= 8i: only lanes already loaded are overwritten.
    store8(a + j, _mm256_permutevar8x32_epi32(v, compress_perm(mask)));
    j += static_cast<std::size_t>(_mm_popcnt_u32(mask));
  }
  return j;
}

// Fills a[m, round_up(m, 8)) with INT32_MAX, which no pivot counts and no range keeps.
inline void pad_vectors(std::int32_t* a, std::size_t m) {
  for (std::size_t i = m; i % 8 != 0; ++i) a[i] = INT32_MAX;
}

// Numbers of elements < p[k] (k < K) in the nv vectors at a; with kMinMax, also the minimum
// and maximum of the first `full` vectors.
template <int K, bool kMinMax>
GROVE_SIMD_TARGET inline void count_below(const std::int32_t* a, std::size_t nv, std::size_t full,
                                          const std::int64_t (&p)[K], std::size_t (&c)[K],
                                          __m256i& vmn, __m256i& vmx) {
  static_assert(K == 3 || K == 5);
  const __m256i p0 = _mm256_set1_epi32(static_cast<std::int32_t>(p[0]));
  const __m256i p1 = _mm256_set1_epi32(static_cast<std::int32_t>(p[1]));
  const __m256i p2 = _mm256_set1_epi32(static_cast<std::int32_t>(p[2]));
  const __m256i p3 = _mm256_set1_epi32(static_cast<std::int32_t>(p[K == 5 ? 3 : 2]));
  const __m256i p4 = _mm256_set1_epi32(static_cast<std::int32_t>(p[K == 5 ? 4 : 2]));
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0;
  __m256i mn = vmn, mx = vmx;
  for (std::size_t i = 0; i < nv; ++i) {
    const __m256i v = load8(a + 8 * i);
    if constexpr (kMinMax) {
      if (i < full) {
        mn = _mm256_min_epi32(mn, v);
        mx = _mm256_max_epi32(mx, v);
      }
    }
    c0 = _mm256_sub_epi32(c0, _mm256_cmpgt_epi32(p0, v));
    c1 = _mm256_sub_epi32(c1, _mm256_cmpgt_epi32(p1, v));
    c2 = _mm256_sub_epi32(c2, _mm256_cmpgt_epi32(p2, v));
    if constexpr (K == 5) {
      c3 = _mm256_sub_epi32(c3, _mm256_cmpgt_epi32(p3, v));
      c4 = _mm256_sub_epi32(c4, _mm256_cmpgt_epi32(p4, v));
    }
  }
  vmn = mn;
  vmx = mx;
  c[0] = static_cast<std::size_t>(hsum_epi32(c0));
  c[1] = static_cast<std::size_t>(hsum_epi32(c1));
  c[2] = static_cast<std::size_t>(hsum_epi32(c2));
  if constexpr (K == 5) {
    c[3] = static_cast<std::size_t>(hsum_epi32(c3));
    c[4] = static_cast<std::size_t>(hsum_epi32(c4));
  }
}

// A guess for the next selection (speed only): where the last answer was and how far answers
// move from one call to the next (both in bit-pattern units).
struct SelectHint {
  std::int32_t center = 0;
  std::int64_t spread = 1 << 20;
};

// The element of rank r (0-based, ascending) of a[0, m), 1 <= m, r < m. Values must lie in
// (INT32_MIN, INT32_MAX). `a` has room for round_up(m, 8) values and is reordered.
GROVE_SIMD_TARGET std::int32_t select_kth_simd(std::int32_t* a, std::size_t m, std::size_t r,
                                               SelectHint& hint) {
  std::size_t nv = (m + 7) / 8;
  const std::size_t full = m / 8;
  pad_vectors(a, m);
  // The answer lies in [lo, hi); cl = #elements < lo, ch = #elements < hi, cl <= r < ch.
  std::int64_t lo, hi;
  std::size_t cl = 0, ch = m;
  auto narrow = [&](std::int64_t p, std::size_t c) {
    if (c <= r && p > lo) {
      lo = p;
      cl = c;
    } else if (c > r && p < hi) {
      hi = p;
      ch = c;
    }
  };
  {  // First pass: min, max and counts below 5 pivots around the hint.
    constexpr int K = 5;
    std::int64_t piv[K];
    for (int k = 0; k < K; ++k) {
      piv[k] = std::clamp<std::int64_t>(hint.center + (k - K / 2) * hint.spread, INT32_MIN + 1,
                                        INT32_MAX - 1);
    }
    std::size_t cnt[K];
    __m256i vmn = _mm256_set1_epi32(INT32_MAX), vmx = _mm256_set1_epi32(INT32_MIN);
    // The padded tail (INT32_MAX) counts below no pivot and is left out of min and max.
    count_below<K, true>(a, nv, full, piv, cnt, vmn, vmx);
    alignas(32) std::int32_t t[16];
    store8(t, vmn);
    store8(t + 8, vmx);
    std::int32_t mn = INT32_MAX, mx = INT32_MIN;
    for (int i = 0; i < 8; ++i) {
      mn = std::min(mn, t[i]);
      mx = std::max(mx, t[8 + i]);
    }
    for (std::size_t i = 8 * full; i < m; ++i) {
      mn = std::min(mn, a[i]);
      mx = std::max(mx, a[i]);
    }
    lo = mn;
    hi = std::int64_t{mx} + 1;
    for (int k = 0; k < K; ++k) narrow(piv[k], cnt[k]);
  }
  std::int32_t ans;
  bool bisect = false;
  for (;;) {
    if (hi - lo == 1) {
      ans = static_cast<std::int32_t>(lo);
      break;
    }
    const std::size_t w = ch - cl;
    if (w <= 16 || 4 * w <= m) {
      compact_range(a, nv, static_cast<std::int32_t>(lo), static_cast<std::int32_t>(hi - 1));
      m = w;
      r -= cl;
      cl = 0;
      ch = m;
      nv = (m + 7) / 8;
      pad_vectors(a, m);
      if (m <= 16) {  // rank each candidate against the (at most 2) vectors
        const __m256i v0 = load8(a);
        const __m256i v1 = nv > 1 ? load8(a + 8) : _mm256_set1_epi32(INT32_MAX);
        ans = a[0];
        for (std::size_t i = 0; i < m; ++i) {
          const __m256i b = _mm256_set1_epi32(a[i]);
          const unsigned lt0 = static_cast<unsigned>(
              _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(b, v0))));
          const unsigned lt1 = static_cast<unsigned>(
              _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(b, v1))));
          const unsigned eq0 = static_cast<unsigned>(
              _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(b, v0))));
          const unsigned eq1 = static_cast<unsigned>(
              _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(b, v1))));
          const std::size_t less = static_cast<std::size_t>(_mm_popcnt_u32(lt0 | (lt1 << 8)));
          const std::size_t eq = static_cast<std::size_t>(_mm_popcnt_u32(eq0 | (eq1 << 8)));
          if (less <= r && r < less + eq) {
            ans = a[i];
            break;
          }
        }
        break;
      }
    }
    // Three pivots per pass: the interpolated position and one gap-estimate either side, or
    // quartiles when interpolation stopped halving the candidates.
    constexpr int K = 3;
    std::int64_t piv[K];
    if (bisect) {
      for (int k = 0; k < K; ++k) piv[k] = lo + (hi - lo) * (k + 1) / 4;
    } else {
      const double span = static_cast<double>(hi - lo) / static_cast<double>(ch - cl);
      const auto p = lo + static_cast<std::int64_t>(span * (static_cast<double>(r - cl) + 0.5));
      const auto g = static_cast<std::int64_t>(span) + 1;
      piv[0] = p - g;
      piv[1] = p;
      piv[2] = p + g;
    }
    for (int k = 0; k < K; ++k) piv[k] = std::clamp(piv[k], lo + 1, hi - 1);
    std::size_t cnt[K];
    __m256i unused0, unused1;
    count_below<K, false>(a, nv, 0, piv, cnt, unused0, unused1);
    for (int k = 0; k < K; ++k) narrow(piv[k], cnt[k]);
    bisect = 2 * (ch - cl) > w;
  }
  const std::int64_t moved = std::abs(std::int64_t{ans} - hint.center);
  hint.spread = std::max<std::int64_t>((3 * hint.spread + moved) / 4, 1);
  hint.center = ans;
  return ans;
}

#endif  // GROVE_CODECS_X86

}  // namespace

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

// Codes for x[0, len) into c[0, ceil(len/2)) (an odd len leaves the last high nibble 0).
inline void e3m0_codes_portable(const float* x, std::size_t len, const E3M0Thresholds& th,
                                std::uint8_t* c) {
  const std::size_t pairs = len / 2;
  for (std::size_t i = 0; i < pairs; ++i) {
    c[i] = static_cast<std::uint8_t>(e3m0_code(x[2 * i], th) | (e3m0_code(x[2 * i + 1], th) << 4));
  }
  if (len % 2) c[pairs] = e3m0_code(x[len - 1], th);
}

// The decoded value of each code: lut[f] = s·2^(f-3) clamped to FLT_MAX, lut[8+f] = -lut[f],
// 0 for code 0 and the unused codes 7, 8, 15. (Multiplying by a power of two rounds exactly like
// ldexp.)
inline void e3m0_lut(float s, float lut[16]) {
  constexpr float kPow2[7] = {0.0f, 0.25f, 0.5f, 1.0f, 2.0f, 4.0f, 8.0f};
  lut[0] = lut[7] = lut[8] = lut[15] = 0.0f;
  for (int f = 1; f <= 6; ++f) {
    const float v = std::min(s * kPow2[f], FLT_MAX);
    lut[f] = v;
    lut[8 + f] = -v;
  }
}

constexpr std::uint32_t kE3M0Invalid = (1u << 7) | (1u << 8) | (1u << 15);

// Decodes c[0, ceil(len/2)) into o[0, len); returns a word whose bit 0 is set on a bad code or a
// non-zero padding nibble.
inline std::uint32_t e3m0_decode_portable_run(const std::uint8_t* c, std::size_t len,
                                              const float lut[16], float* o) {
  std::uint32_t bad = 0;
  const std::size_t pairs = len / 2;
  for (std::size_t i = 0; i < pairs; ++i) {
    const unsigned lo = c[i] & 15u, hi = c[i] >> 4;
    bad |= (kE3M0Invalid >> lo) | (kE3M0Invalid >> hi);
    o[2 * i] = lut[lo];
    o[2 * i + 1] = lut[hi];
  }
  if (len % 2) {
    const unsigned lo = c[pairs] & 15u, hi = c[pairs] >> 4;
    bad |= (kE3M0Invalid >> lo) | (hi != 0);
    o[len - 1] = lut[lo];
  }
  return bad;
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

// Kernels: encode n values into out (scales then codes) / decode; false on a non-finite input
// (encode) or a malformed message (decode).
bool e3m0_encode_portable(const float* in, std::size_t n, std::size_t block, std::uint8_t* out) {
  const std::size_t nb = (n + block - 1) / block;
  std::uint8_t* codes = out + 4 * nb;
  std::vector<std::uint32_t> scratch(std::min(block, n));
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t base = b * block;
    const std::size_t len = std::min(block, n - base);
    const float* x = in + base;
    float s;
    if (!e3m0_scale(x, len, scratch.data(), s)) return false;
    store_f32(out + 4 * b, s);
    e3m0_codes_portable(x, len, e3m0_thresholds(s), codes + base / 2);
  }
  return true;
}

bool e3m0_decode_portable(const std::uint8_t* in, std::size_t n, std::size_t block, float* out) {
  const std::size_t nb = (n + block - 1) / block;
  const std::uint8_t* codes = in + 4 * nb;
  std::uint32_t bad = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const float s = load_f32(in + 4 * b);
    if (!(s >= 0.0f && s <= FLT_MAX)) return false;
    float lut[16];
    e3m0_lut(s, lut);
    const std::size_t base = b * block;
    bad |= e3m0_decode_portable_run(codes + base / 2, std::min(block, n - base), lut, out + base);
  }
  return (bad & 1u) == 0;
}

#if GROVE_CODECS_X86

// Codes of the 8 values v (float bits) against the thresholds' bit patterns: a >= t is
// a_bits > t_bits - 1 for non-negative floats.
struct E3M0SimdThresholds {
  __m256i t[5];  // t_j bits - 1, j = 1..5
  __m256i nz;    // max(t_0 bits, 1) - 1: a >= t_0 and a > 0
};

GROVE_SIMD_TARGET inline __m256i e3m0_code8(__m256i v, const E3M0SimdThresholds& th) {
  const __m256i a = _mm256_and_si256(v, _mm256_set1_epi32(0x7fffffff));
  __m256i f = _mm256_set1_epi32(1);
  for (const __m256i& t : th.t) f = _mm256_sub_epi32(f, _mm256_cmpgt_epi32(a, t));
  const __m256i sign = _mm256_and_si256(_mm256_srai_epi32(v, 28), _mm256_set1_epi32(8));
  return _mm256_and_si256(_mm256_or_si256(f, sign), _mm256_cmpgt_epi32(a, th.nz));
}

GROVE_SIMD_TARGET bool e3m0_encode_simd(const float* in, std::size_t n, std::size_t block,
                                        std::uint8_t* out) {
  const std::size_t nb = (n + block - 1) / block;
  std::uint8_t* codes = out + 4 * nb;
  std::vector<std::int32_t> scratch((std::min(block, n) + 7) / 8 * 8);
  std::int32_t* a = scratch.data();
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i fmax = _mm256_set1_epi32(0x7f7fffff);
  SelectHint hint;  // neighbouring blocks have similar scales
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t base = b * block;
    const std::size_t len = std::min(block, n - base);
    const float* x = in + base;
    // |x| bit patterns into scratch; count zeros; flag non-finite values.
    __m256i bad = _mm256_setzero_si256(), zeros = _mm256_setzero_si256();
    std::size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const __m256i v =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), absmask);
      store8(a + i, v);
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(v, fmax));
      zeros = _mm256_sub_epi32(zeros, _mm256_cmpeq_epi32(v, _mm256_setzero_si256()));
    }
    std::size_t z = static_cast<std::size_t>(hsum_epi32(zeros));
    bool tail_bad = false;
    for (; i < len; ++i) {
      const std::uint32_t u = bits_of(x[i]) & 0x7fffffffu;
      tail_bad |= u > 0x7f7fffffu;
      z += (u == 0);
      a[i] = static_cast<std::int32_t>(u);
    }
    if (tail_bad || !_mm256_testz_si256(bad, bad)) return false;
    // Lower median of the non-zero magnitudes = rank z + (m-1)/2 among all |x| (zeros first).
    const std::size_t m = len - z;
    float s = 0.0f;
    if (m != 0) {
      s = float_of(static_cast<std::uint32_t>(select_kth_simd(a, len, z + (m - 1) / 2, hint)));
    }
    store_f32(out + 4 * b, s);
    const E3M0Thresholds th = e3m0_thresholds(s);
    E3M0SimdThresholds tv;
    for (int j = 0; j < 5; ++j) {
      tv.t[j] = _mm256_set1_epi32(static_cast<std::int32_t>(bits_of(th.t[j + 1])) - 1);
    }
    tv.nz = _mm256_set1_epi32(static_cast<std::int32_t>(std::max(bits_of(th.t[0]), 1u)) - 1);
    std::uint8_t* c = codes + base / 2;
    // 64 values per step: 8 vectors of 32-bit codes -> bytes -> nibble pairs.
    const __m256i fix = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1,
                                         8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    const __m256i lowbyte = _mm256_set1_epi16(0x00ff);
    i = 0;
    for (; i + 64 <= len; i += 64) {
      __m256i k[8];
      for (int j = 0; j < 8; ++j) {
        k[j] = e3m0_code8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * j)), tv);
      }
      // Per 128-bit lane, packs keep each vector's 4 values of that lane together, so adjacent
      // bytes stay adjacent elements (2i, 2i+1).
      const __m256i q0 =
          _mm256_packus_epi16(_mm256_packus_epi32(k[0], k[1]), _mm256_packus_epi32(k[2], k[3]));
      const __m256i q1 =
          _mm256_packus_epi16(_mm256_packus_epi32(k[4], k[5]), _mm256_packus_epi32(k[6], k[7]));
      // u16 lo | hi << 8 -> low byte lo | hi << 4.
      const __m256i m0 = _mm256_and_si256(_mm256_or_si256(q0, _mm256_srli_epi16(q0, 4)), lowbyte);
      const __m256i m1 = _mm256_and_si256(_mm256_or_si256(q1, _mm256_srli_epi16(q1, 4)), lowbyte);
      // Bytes hold pair pairs (0,1),(4,5),..,(28,29) in lane 0 and (2,3),..,(30,31) in lane 1.
      __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(m0, m1), 0xd8);
      p = _mm256_shuffle_epi8(p, fix);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + i / 2), p);
    }
    e3m0_codes_portable(x + i, len - i, th, c + i / 2);
  }
  return true;
}

GROVE_SIMD_TARGET bool e3m0_decode_simd(const std::uint8_t* in, std::size_t n, std::size_t block,
                                        float* out) {
  const std::size_t nb = (n + block - 1) / block;
  const std::uint8_t* codes = in + 4 * nb;
  const __m128i nib = _mm_set1_epi8(0x0f);
  const __m128i invalid = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, 0, 0, 0, 0, -1);
  const __m256i signbit = _mm256_set1_epi32(INT32_MIN);
  __m128i badv = _mm_setzero_si128();
  std::uint32_t bad = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const float s = load_f32(in + 4 * b);
    if (!(s >= 0.0f && s <= FLT_MAX)) return false;
    float lut[16];
    e3m0_lut(s, lut);
    const __m256 lutv = _mm256_loadu_ps(lut);  // codes 0-7; bit 3 is the sign
    const std::size_t base = b * block;
    const std::size_t len = std::min(block, n - base);
    const std::uint8_t* c = codes + base / 2;
    float* o = out + base;
    std::size_t i = 0;
    for (; i + 32 <= len; i += 32) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i / 2));
      const __m128i lo = _mm_and_si128(v, nib);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
      badv = _mm_or_si128(
          badv, _mm_or_si128(_mm_shuffle_epi8(invalid, lo), _mm_shuffle_epi8(invalid, hi)));
      const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
      const __m128i parts[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
      for (int j = 0; j < 4; ++j) {
        const __m256i k = _mm256_cvtepu8_epi32(parts[j]);
        const __m256 mag = _mm256_permutevar8x32_ps(lutv, k);
        const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(k, 28), signbit);
        _mm256_storeu_ps(o + i + 8 * j, _mm256_xor_ps(mag, _mm256_castsi256_ps(sign)));
      }
    }
    bad |= e3m0_decode_portable_run(c + i / 2, len - i, lut, o + i);
  }
  return (bad & 1u) == 0 && _mm_testz_si128(badv, badv);
}

#else
constexpr bool (*e3m0_encode_simd)(const float*, std::size_t, std::size_t, std::uint8_t*) = nullptr;
constexpr bool (*e3m0_decode_simd)(const std::uint8_t*, std::size_t, std::size_t, float*) = nullptr;
#endif  // GROVE_CODECS_X86

}  // namespace

std::size_t e3m0_encoded_size(std::size_t n, E3M0Params p) {
  if (!e3m0_params_ok(p)) return 0;
  return 4 * e3m0_blocks(n, p) + (n + 1) / 2;
}

CodecError e3m0_encode(std::span<const float> in, std::span<std::uint8_t> out, E3M0Params p,
                       Impl impl) {
  if (!e3m0_params_ok(p)) return CodecError::malformed;
  if (out.size() != e3m0_encoded_size(in.size(), p)) return CodecError::size_mismatch;
  const auto kernel = pick_kernel(impl, e3m0_encode_simd, e3m0_encode_portable);
  return kernel(in.data(), in.size(), p.block, out.data()) ? CodecError::ok
                                                           : CodecError::not_finite;
}

CodecError e3m0_decode(std::span<const std::uint8_t> in, std::span<float> out, E3M0Params p,
                       Impl impl) {
  if (!e3m0_params_ok(p)) return CodecError::malformed;
  if (in.size() != e3m0_encoded_size(out.size(), p)) return CodecError::size_mismatch;
  const auto kernel = pick_kernel(impl, e3m0_decode_simd, e3m0_decode_portable);
  return kernel(in.data(), out.size(), p.block, out.data()) ? CodecError::ok
                                                            : CodecError::malformed;
}

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

// --- metrics ---------------------------------------------------------------------------------

double l2_norm(const float* x, std::size_t n) {
  // Eight independent partial sums (one dependent add chain made this latency-bound: ~4 cycles
  // per value); in double, so the result is finite exactly when every value is.
  double acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  double s = 0.0;
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  for (const double a : acc) s += a;
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
