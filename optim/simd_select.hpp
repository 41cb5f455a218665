// Internal to optim's codec files: exact order statistics of small int32 arrays with AVX2 (the
// E3M0 block scale, the top-k bound and threshold) and the vector helpers their kernels share.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "optim/codec_util.hpp"

namespace grove::optim {

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

// For each 8-bit lane mask, the indices of the set lanes packed as nibbles (lowest first): the
// vpermd control that moves the selected lanes to the front.
inline constexpr auto kCompressLut = [] {
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

// A guess for the next selection (speed only): where the last answer was and how far answers
// move from one call to the next (both in bit-pattern units).
struct SelectHint {
  std::int32_t center = 0;
  std::int64_t spread = 1 << 20;
};

// The element of rank r (0-based, ascending) of a[0, m), 1 <= m, r < m. Values must lie in
// (INT32_MIN, INT32_MAX). `a` has room for round_up(m, 8) values and is reordered.
GROVE_SIMD_TARGET std::int32_t select_kth_simd(std::int32_t* a, std::size_t m, std::size_t r,
                                               SelectHint& hint);

#endif  // GROVE_CODECS_X86

}  // namespace grove::optim
