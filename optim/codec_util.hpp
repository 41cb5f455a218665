// Internal to optim's codec files (not part of the API; include optim/codecs.hpp instead): the
// x86 SIMD switch, float bit casts, little-endian loads and stores, and the choice between a
// SIMD and a portable kernel.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "optim/codecs.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define GROVE_CODECS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define GROVE_CODECS_X86 0
#endif

static_assert(std::endian::native == std::endian::little, "codecs assume a little-endian host");

#if GROVE_CODECS_X86
// The target of the SIMD kernels that use the selection helpers (optim/simd_select.hpp).
#define GROVE_SIMD_TARGET __attribute__((target("avx2,f16c,popcnt")))
#endif

namespace grove::optim {

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

// The SIMD kernel when it exists and `impl` allows it, else the portable one.
template <class F>
F* pick_kernel(Impl impl, F* simd, F* portable) {
  return simd && use_simd(impl) ? simd : portable;
}

}  // namespace grove::optim
