// The AVX2 order-statistic selection of simd_select.hpp (select_kth_simd) and its passes:
// counting below pivots, compacting to the interval that holds the answer.
#include <algorithm>
#include <cstdlib>

#include "optim/simd_select.hpp"

namespace grove::optim {

#if GROVE_CODECS_X86

namespace {

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
}  // namespace

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

}  // namespace grove::optim
