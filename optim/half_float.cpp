// fp16 and bf16 codecs (codecs.hpp): round-to-nearest-even conversions, the portable kernels and
// the AVX2/F16C kernels that give the same bits.
#include <algorithm>
#include <cfloat>

#include "optim/codec_util.hpp"

namespace grove::optim {

namespace {

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

}  // namespace grove::optim
