// E3M0 4-bit codec (codecs.hpp): per-block median scale (a portable radix select, or the AVX2
// selection of simd_select.hpp), two codes a byte; portable and AVX2 kernels give the same bits.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "optim/simd_select.hpp"

namespace grove::optim {

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

}  // namespace grove::optim
