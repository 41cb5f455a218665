#include "optim/codecs.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace grove::optim {
namespace detail {
// Defined in codecs.cpp (not in the header): TopKCodec::encode with a choice of selection kernel,
// so the tests can compare the SIMD and portable selections.
CodecError topk_encode(const TopKCodec& c, std::span<float> e, std::span<std::uint8_t> out,
                       Impl impl);
}  // namespace detail
namespace {

using Bytes = std::vector<std::uint8_t>;
using Floats = std::vector<float>;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

bool same_bits(const Floats& a, const Floats& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (bits(a[i]) != bits(b[i])) return false;
  }
  return true;
}

Floats normal(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  Floats v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Student-t with 1.5 degrees of freedom: heavy tails, occasional huge values.
Floats heavy(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> d(1.5f);
  Floats v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Random bit patterns that are finite floats (every exponent, subnormals included).
Floats random_finite_bits(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Floats v(n);
  for (auto& x : v) {
    std::uint32_t u;
    do u = rng();
    while ((u & 0x7f800000u) == 0x7f800000u);
    x = std::bit_cast<float>(u);
  }
  return v;
}

std::vector<std::vector<float>> datasets() {
  std::vector<std::vector<float>> d;
  d.push_back(normal(1000, 1));
  d.push_back(heavy(1003, 2));
  d.push_back(Floats(777, 0.0f));
  d.push_back(normal(517, 3, 1e-30f));  // tiny values (subnormal range for half and float)
  d.push_back(normal(33, 4, 1e-3f));
  d.push_back(Floats{});
  d.push_back(Floats{1.0f});
  return d;
}

// --- fp16 ------------------------------------------------------------------------------------

TEST(Fp16, SpecialValues) {
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e9f), 0x7bff);      // saturates
  EXPECT_EQ(float_to_half(-1e9f), 0xfbff);     // saturates
  EXPECT_EQ(float_to_half(65520.0f), 0x7bff);  // would round to Inf: saturates
  EXPECT_EQ(float_to_half(kInf), 0x7c00);
  EXPECT_EQ(float_to_half(-kInf), 0xfc00);
  EXPECT_EQ(float_to_half(kNaN) & 0x7e00, 0x7e00);
  // Subnormals: smallest 2^-24, largest (1023)·2^-24, smallest normal 2^-14.
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);  // below half the min subnormal
  // Ties to even: 2^-25 is exactly half of the smallest subnormal -> 0; 3·2^-25 -> 2 (even).
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to 1 (even); 1 + 3·2^-11 -> 1 + 2^-9.
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);

  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
  EXPECT_EQ(half_to_float(0x7c00), kInf);
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    ASSERT_EQ(float_to_half(f), h) << h;
  }
}

TEST(Fp16, PortableAndSimdBitIdentical) {
  if (!simd_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  std::vector<Floats> inputs = datasets();
  inputs.push_back(random_finite_bits(100003, 7));
  Floats ties;  // exact half-way points between adjacent halves, normal and subnormal
  for (std::uint32_t h = 0; h < 0x7bff; h += 7) {
    const float a = half_to_float(static_cast<std::uint16_t>(h));
    const float b = half_to_float(static_cast<std::uint16_t>(h + 1));
    ties.push_back(0.5f * (a + b));
    ties.push_back(-0.5f * (a + b));
  }
  inputs.push_back(ties);
  for (const auto& x : inputs) {
    Bytes a(fp16_encoded_size(x.size())), b(a.size());
    ASSERT_EQ(fp16_encode(x, a, Impl::portable), CodecError::ok);
    ASSERT_EQ(fp16_encode(x, b, Impl::best), CodecError::ok);
    ASSERT_EQ(a, b);
    Floats da(x.size()), db(x.size());
    ASSERT_EQ(fp16_decode(a, da, Impl::portable), CodecError::ok);
    ASSERT_EQ(fp16_decode(a, db, Impl::best), CodecError::ok);
    ASSERT_TRUE(same_bits(da, db));
  }
}

TEST(Fp16, RoundTripErrorBound) {
  for (const auto& x : datasets()) {
    for (Impl impl : {Impl::portable, Impl::best}) {
      Bytes enc(fp16_encoded_size(x.size()));
      ASSERT_EQ(fp16_encode(x, enc, impl), CodecError::ok);
      Floats y(x.size());
      ASSERT_EQ(fp16_decode(enc, y, impl), CodecError::ok);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float ax = std::fabs(x[i]);
        const float err = std::fabs(y[i] - x[i]);
        if (ax > 65504.0f) {
          EXPECT_EQ(std::fabs(y[i]), 65504.0f);
        } else if (ax >= std::ldexp(1.0f, -14)) {
          EXPECT_LE(err, std::ldexp(ax, -11)) << x[i];
        } else {
          EXPECT_LE(err, std::ldexp(1.0f, -25)) << x[i];
        }
      }
    }
  }
}

TEST(Fp16, RejectsNonFiniteAndSizeMismatch) {
  for (Impl impl : {Impl::portable, Impl::best}) {
    for (std::size_t pos : {0u, 5u, 16u, 39u}) {
      for (float bad : {kInf, -kInf, kNaN}) {
        Floats x = normal(40, 9);
        x[pos] = bad;
        Bytes enc(fp16_encoded_size(x.size()));
        EXPECT_EQ(fp16_encode(x, enc, impl), CodecError::not_finite);
      }
    }
    Floats x = normal(40, 9);
    Bytes enc(fp16_encoded_size(x.size()) + 1);
    EXPECT_EQ(fp16_encode(x, enc, impl), CodecError::size_mismatch);
    enc.resize(fp16_encoded_size(x.size()));
    ASSERT_EQ(fp16_encode(x, enc, impl), CodecError::ok);
    Floats y(39);
    EXPECT_EQ(fp16_decode(enc, y, impl), CodecError::size_mismatch);
    y.resize(40);
    for (std::size_t pos : {0u, 17u, 39u}) {
      Bytes bad = enc;
      bad[2 * pos] = 0x00;
      bad[2 * pos + 1] = 0x7c;  // +Inf
      EXPECT_EQ(fp16_decode(bad, y, impl), CodecError::not_finite);
      bad[2 * pos + 1] = 0xfe;  // NaN
      EXPECT_EQ(fp16_decode(bad, y, impl), CodecError::not_finite);
    }
  }
}

// --- bf16 ------------------------------------------------------------------------------------

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(float_to_bf16(FLT_MAX), 0x7f7f);  // saturates instead of rounding to Inf
  EXPECT_EQ(float_to_bf16(-FLT_MAX), 0xff7f);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00010000u)), 0x0001);  // subnormal kept
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00008000u)), 0x0000);  // tie to even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // tie to even
  EXPECT_EQ(float_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(bf16_to_float(0x7f7f), std::bit_cast<float>(0x7f7f0000u));
}

TEST(Bf16, RoundTripErrorBoundAndSimdIdentical) {
  std::vector<Floats> inputs = datasets();
  inputs.push_back(random_finite_bits(100003, 11));
  for (const auto& x : inputs) {
    Bytes a(bf16_encoded_size(x.size())), b(a.size());
    ASSERT_EQ(bf16_encode(x, a, Impl::portable), CodecError::ok);
    ASSERT_EQ(bf16_encode(x, b, Impl::best), CodecError::ok);
    ASSERT_EQ(a, b);
    Floats y(x.size()), z(x.size());
    ASSERT_EQ(bf16_decode(a, y, Impl::portable), CodecError::ok);
    ASSERT_EQ(bf16_decode(a, z, Impl::best), CodecError::ok);
    ASSERT_TRUE(same_bits(y, z));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float ax = std::fabs(x[i]);
      const float err = std::fabs(y[i] - x[i]);
      if (ax >= std::bit_cast<float>(0x7f7f8000u)) {
        EXPECT_EQ(bits(std::fabs(y[i])), 0x7f7f0000u);  // saturated
      } else if (ax >= FLT_MIN) {
        EXPECT_LE(err, std::ldexp(ax, -8)) << x[i];
      } else {
        EXPECT_LE(err, std::ldexp(1.0f, -134)) << x[i];
      }
    }
  }
}

TEST(Bf16, RejectsNonFiniteAndSizeMismatch) {
  for (Impl impl : {Impl::portable, Impl::best}) {
    for (std::size_t pos : {0u, 15u, 16u, 40u}) {
      for (float bad : {kInf, -kInf, kNaN}) {
        Floats x = normal(41, 9);
        x[pos] = bad;
        Bytes enc(bf16_encoded_size(x.size()));
        EXPECT_EQ(bf16_encode(x, enc, impl), CodecError::not_finite);
      }
    }
    Floats x = normal(41, 9);
    Bytes enc(bf16_encoded_size(x.size()) - 1);
    EXPECT_EQ(bf16_encode(x, enc, impl), CodecError::size_mismatch);
    enc.resize(bf16_encoded_size(x.size()));
    ASSERT_EQ(bf16_encode(x, enc, impl), CodecError::ok);
    Floats y(42);
    EXPECT_EQ(bf16_decode(enc, y, impl), CodecError::size_mismatch);
    y.resize(41);
    for (std::size_t pos : {0u, 20u, 40u}) {
      Bytes bad = enc;
      bad[2 * pos] = 0x80;
      bad[2 * pos + 1] = 0xff;  // -Inf
      EXPECT_EQ(bf16_decode(bad, y, impl), CodecError::not_finite);
    }
  }
}

// --- E3M0 ------------------------------------------------------------------------------------

// Reference scale: lower median of the non-zero magnitudes, by full sort.
float ref_scale(const float* x, std::size_t len) {
  Floats a;
  for (std::size_t i = 0; i < len; ++i) {
    if (x[i] != 0.0f) a.push_back(std::fabs(x[i]));
  }
  if (a.empty()) return 0.0f;
  std::sort(a.begin(), a.end());
  return a[(a.size() - 1) / 2];
}

TEST(E3M0, ExactSizes) {
  EXPECT_EQ(e3m0_encoded_size(0), 0u);
  EXPECT_EQ(e3m0_encoded_size(1), 4u + 1u);
  EXPECT_EQ(e3m0_encoded_size(256), 4u + 128u);
  EXPECT_EQ(e3m0_encoded_size(257), 8u + 129u);
  EXPECT_EQ(e3m0_encoded_size(1000, {.block = 64}), 16u * 4u + 500u);
  EXPECT_EQ(e3m0_encoded_size(10, {.block = 3}), 0u);  // odd block: invalid
}

TEST(E3M0, MatchesSpecAndErrorBound) {
  for (std::size_t block : {256u, 64u, 2u}) {
    const E3M0Params p{.block = block};
    for (const auto& x : datasets()) {
      Bytes enc(e3m0_encoded_size(x.size(), p));
      ASSERT_EQ(e3m0_encode(x, enc, p), CodecError::ok);
      Floats y(x.size());
      ASSERT_EQ(e3m0_decode(enc, y, p), CodecError::ok);
      const std::size_t nb = (x.size() + block - 1) / block;
      for (std::size_t b = 0; b < nb; ++b) {
        const std::size_t base = b * block, len = std::min(block, x.size() - base);
        float s;
        std::memcpy(&s, enc.data() + 4 * b, 4);
        ASSERT_EQ(s, ref_scale(x.data() + base, len));
        for (std::size_t i = base; i < base + len; ++i) {
          const unsigned code = (enc[4 * nb + i / 2] >> (4 * (i % 2))) & 15u;
          const float ax = std::fabs(x[i]);
          const double r = static_cast<double>(ax) / s;
          // Spec: code from round(log2 r) clipped to [-2, 3]; skip values within 1e-6 of a
          // rounding boundary (the implementation compares against float thresholds).
          if (ax == 0.0f || r < 0.125) {
            if (std::fabs(r / 0.125 - 1) > 1e-6) {
              EXPECT_EQ(code, 0u) << x[i];
            }
          } else {
            const double l = std::log2(r);
            if (std::fabs(l - std::floor(l) - 0.5) > 1e-6) {
              const int e = std::clamp(static_cast<int>(std::lround(l)), -2, 3);
              EXPECT_EQ(code, (std::signbit(x[i]) ? 8u : 0u) | static_cast<unsigned>(e + 3));
            }
          }
          // Documented bound (with float slack).
          const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
          const double slack = 1e-6 * (ax + s) + 1e-44;
          if (r >= std::pow(2.0, -2.5) && r <= std::pow(2.0, 3.5)) {
            EXPECT_LE(err, (std::sqrt(2.0) - 1) * ax + slack) << x[i] << " s=" << s;
          }
          EXPECT_LE(err, std::max({(std::sqrt(2.0) - 1) * ax, s / 8.0, ax - 8.0 * s}) + slack);
          EXPECT_EQ(std::signbit(y[i]) && y[i] != 0, std::signbit(x[i]) && y[i] != 0);
        }
      }
    }
  }
}

TEST(E3M0, AllZeroAndOddTail) {
  Floats x(7, 0.0f);
  Bytes enc(e3m0_encoded_size(x.size()));
  ASSERT_EQ(e3m0_encode(x, enc), CodecError::ok);
  for (auto b : enc) EXPECT_EQ(b, 0);
  x = {1.0f, -2.0f, 4.0f, 0.25f, -8.0f};  // median of {1,2,4,0.25,8} = 2
  enc.assign(e3m0_encoded_size(x.size()), 0xff);
  ASSERT_EQ(e3m0_encode(x, enc), CodecError::ok);
  Floats y(x.size());
  ASSERT_EQ(e3m0_decode(enc, y), CodecError::ok);
  EXPECT_EQ(y, (Floats{1.0f, -2.0f, 4.0f, 0.5f, -8.0f}));  // 0.25/2 = 2^-3 -> clipped to 2^-2
  EXPECT_EQ(enc.back() >> 4, 0);                           // padding nibble
}

TEST(E3M0, Rejections) {
  Floats x = normal(300, 5);
  Bytes enc(e3m0_encoded_size(x.size()));
  for (float bad : {kInf, kNaN}) {
    Floats z = x;
    z[299] = bad;
    EXPECT_EQ(e3m0_encode(z, enc), CodecError::not_finite);
  }
  Bytes small(enc.size() - 1);
  EXPECT_EQ(e3m0_encode(x, small), CodecError::size_mismatch);
  ASSERT_EQ(e3m0_encode(x, enc), CodecError::ok);
  Floats y(301);
  EXPECT_EQ(e3m0_decode(enc, y), CodecError::size_mismatch);
  y.resize(300);
  ASSERT_EQ(e3m0_decode(enc, y), CodecError::ok);
  EXPECT_EQ(e3m0_encode(x, enc, {.block = 0}), CodecError::malformed);
  // Bad scale (negative, NaN, Inf).
  for (float s : {-1.0f, kNaN, kInf}) {
    Bytes bad = enc;
    std::memcpy(bad.data() + 4, &s, 4);
    EXPECT_EQ(e3m0_decode(bad, y), CodecError::malformed);
  }
  // Unused codes 7, 8, 15 in either nibble.
  for (std::uint8_t b : {0x07, 0x80, 0xf1, 0x1f}) {
    Bytes bad = enc;
    bad[8 + 77] = b;
    EXPECT_EQ(e3m0_decode(bad, y), CodecError::malformed) << int(b);
  }
  // Non-zero padding nibble with an odd count.
  Floats odd = normal(301, 6);
  Bytes enc_odd(e3m0_encoded_size(odd.size()));
  ASSERT_EQ(e3m0_encode(odd, enc_odd), CodecError::ok);
  enc_odd.back() |= 0x10;
  EXPECT_EQ(e3m0_decode(enc_odd, odd), CodecError::malformed);
}

TEST(E3M0, HugeScaleClampsToFinite) {
  Floats x = {FLT_MAX, FLT_MAX / 16, FLT_MAX / 16, FLT_MAX / 16};  // median = FLT_MAX/16
  Bytes enc(e3m0_encoded_size(x.size()));
  ASSERT_EQ(e3m0_encode(x, enc), CodecError::ok);
  Floats y(x.size());
  ASSERT_EQ(e3m0_decode(enc, y), CodecError::ok);
  EXPECT_EQ(y[0], FLT_MAX / 2);                             // 16 -> clipped to 2^3
  Floats z = {FLT_MAX, FLT_MAX, FLT_MAX / 4, FLT_MAX / 4};  // median FLT_MAX/4: 4 = 2^2
  ASSERT_EQ(e3m0_encode(z, enc), CodecError::ok);
  ASSERT_EQ(e3m0_decode(enc, y), CodecError::ok);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

// Inputs for the E3M0 and top-k SIMD-vs-portable tests: the common datasets plus data that
// stresses the selections (ties, zeros, every exponent, scales that jump between blocks).
std::vector<Floats> selection_datasets() {
  std::vector<Floats> d = datasets();
  d.push_back(random_finite_bits(20011, 61));
  Floats ties(5003);
  std::mt19937 rng(62);
  for (auto& v : ties) v = static_cast<float>(static_cast<int>(rng() % 5) - 2);
  d.push_back(ties);
  Floats sparse = normal(4099, 63);
  for (std::size_t i = 0; i < sparse.size(); ++i) {
    if (rng() % 4 != 0) sparse[i] = (i % 2) ? 0.0f : -0.0f;
  }
  d.push_back(sparse);
  Floats jumps = normal(64 * 256 + 77, 64);  // the scale changes by up to 2^±20 per block
  for (std::size_t i = 0; i < jumps.size(); ++i) {
    jumps[i] = std::ldexp(jumps[i], static_cast<int>((i / 256 * 7919) % 41) - 20);
  }
  d.push_back(jumps);
  Floats near(3001);  // nearly equal magnitudes: neighbouring bit patterns
  for (auto& v : near) {
    v = std::bit_cast<float>(static_cast<std::uint32_t>(0x3f800000u + rng() % 4)) *
        ((rng() % 2) ? 1 : -1);
  }
  d.push_back(near);
  d.push_back(normal(10007, 65, 1e-41f));  // subnormal
  Floats few = normal(9, 66);
  d.push_back(few);
  return d;
}

TEST(E3M0, PortableAndSimdBitIdentical) {
  if (!simd_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  for (std::size_t block : {256u, 2u, 6u, 64u, 66u, 130u, 1000u, 4096u}) {
    const E3M0Params p{.block = block};
    for (const auto& x : selection_datasets()) {
      SCOPED_TRACE(testing::Message() << "block " << block << " n " << x.size());
      Bytes a(e3m0_encoded_size(x.size(), p)), b(a.size());
      ASSERT_EQ(e3m0_encode(x, a, p, Impl::portable), CodecError::ok);
      ASSERT_EQ(e3m0_encode(x, b, p, Impl::best), CodecError::ok);
      ASSERT_EQ(a, b);
      const std::size_t nb = (x.size() + block - 1) / block;
      for (std::size_t i = 0; i < nb; ++i) {
        float s;
        std::memcpy(&s, a.data() + 4 * i, 4);
        const std::size_t base = i * block;
        ASSERT_EQ(s, ref_scale(x.data() + base, std::min(block, x.size() - base)));
      }
      Floats da(x.size()), db(x.size());
      ASSERT_EQ(e3m0_decode(a, da, p, Impl::portable), CodecError::ok);
      ASSERT_EQ(e3m0_decode(a, db, p, Impl::best), CodecError::ok);
      ASSERT_TRUE(same_bits(da, db));
      // Corrupted messages: both paths agree on the verdict and, when accepted, the values.
      std::mt19937 rng(static_cast<std::uint32_t>(x.size() + block));
      for (int t = 0; t < 20 && !a.empty(); ++t) {
        Bytes c = a;
        c[rng() % c.size()] = static_cast<std::uint8_t>(rng());
        const CodecError ra = e3m0_decode(c, da, p, Impl::portable);
        ASSERT_EQ(ra, e3m0_decode(c, db, p, Impl::best));
        if (ra == CodecError::ok) {
          ASSERT_TRUE(same_bits(da, db));
        }
      }
      if (!x.empty()) {
        Floats z = x;
        z[z.size() / 2] = kNaN;
        EXPECT_EQ(e3m0_encode(z, a, p, Impl::portable), CodecError::not_finite);
        EXPECT_EQ(e3m0_encode(z, b, p, Impl::best), CodecError::not_finite);
      }
    }
  }
}

// --- top-k -----------------------------------------------------------------------------------

// Reference: indices of the kc largest |x| (ties: lower index), ascending.
std::vector<std::uint32_t> ref_topk(const float* x, std::uint32_t len, std::uint32_t kc) {
  std::vector<std::uint32_t> idx(len);
  for (std::uint32_t i = 0; i < len; ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [x](std::uint32_t a, std::uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  idx.resize(kc);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(TopK, ExactSizes) {
  TopKCodec c;
  EXPECT_EQ(c.encoded_size(0), 0u);
  EXPECT_EQ(c.encoded_size(4096), 64u * 6u);
  EXPECT_EQ(c.encoded_size(4096 * 3 + 10), 3u * 64u * 6u + 10u * 6u);
  EXPECT_EQ(c.encoded_size(4096 + 100), 2u * 64u * 6u);
  TopKCodec q{.chunk = 4096, .k = 64, .two_bit = true};
  EXPECT_EQ(q.encoded_size(4096), 4u + 16u + 128u);
  EXPECT_EQ(q.encoded_size(4096 + 5), 4u + 16u + 128u + 4u + 2u + 10u);
  TopKCodec bad{.chunk = 65537, .k = 1};
  EXPECT_EQ(bad.encoded_size(10), 0u);
  Floats e(10);
  Bytes out;
  EXPECT_EQ(bad.encode(e, out), CodecError::malformed);
}

void check_topk(const TopKCodec& c, const Floats& x0) {
  Floats e = x0;
  Bytes msg(c.encoded_size(e.size()));
  ASSERT_EQ(c.encode(e, msg), CodecError::ok);
  Floats d(e.size(), 123.0f);
  ASSERT_EQ(c.decode(msg, d), CodecError::ok);
  // Selected set matches the reference, sent values decode as promised.
  for (std::size_t base = 0; base < e.size(); base += c.chunk) {
    const auto len = static_cast<std::uint32_t>(std::min<std::size_t>(c.chunk, e.size() - base));
    const std::uint32_t kc = std::min(c.k, len);
    const auto sel = ref_topk(x0.data() + base, len, kc);
    std::vector<bool> chosen(len);
    for (auto i : sel) chosen[i] = true;
    for (std::uint32_t i = 0; i < len; ++i) {
      const float v = x0[base + i], dv = d[base + i];
      if (!chosen[i]) {
        ASSERT_EQ(dv, 0.0f);
        ASSERT_EQ(bits(e[base + i]), bits(v));  // untouched
      } else if (!c.two_bit) {
        ASSERT_EQ(bits(dv), bits(v));
        ASSERT_EQ(e[base + i], 0.0f);
      } else {
        double s = 0;
        for (auto j : sel) s += std::fabs(x0[base + j]);
        s /= kc;
        const double err = std::fabs(static_cast<double>(dv) - v);
        ASSERT_LE(err, std::max(0.5 * s, std::fabs(v) - 1.5 * s) * (1 + 1e-6) + 1e-30);
        if (v != 0.0f && dv != 0.0f) {
          ASSERT_EQ(std::signbit(v), std::signbit(dv));
        }
      }
    }
  }
  // Error-feedback invariant: e_before == e_after + Δ̂.
  for (std::size_t i = 0; i < e.size(); ++i) {
    const float sum = e[i] + d[i];
    if (!c.two_bit) {
      ASSERT_EQ(sum, x0[i]) << i;
    } else {
      // e_after = fl(x0 - d): exact up to half an ulp of e_after.
      const double ulp = std::fabs(std::nextafter(e[i], kInf) - e[i]);
      ASSERT_LE(std::fabs(static_cast<double>(e[i]) + d[i] - x0[i]), 0.5 * ulp) << i;
    }
  }
  // decode_add accumulates with a weight.
  Floats acc(e.size(), 1.0f);
  ASSERT_EQ(c.decode_add(msg, acc, 0.5f), CodecError::ok);
  for (std::size_t i = 0; i < e.size(); ++i) ASSERT_EQ(acc[i], 1.0f + 0.5f * d[i]);
  // Mass kept: what was sent over what the buffer held.
  const double mk = mass_kept(x0.data(), d.data(), e.size());
  EXPECT_GE(mk, 0.0);
  if (!c.two_bit) {
    EXPECT_LE(mk, 1.0 + 1e-12);
  }
}

TEST(TopK, RoundTripAndErrorFeedback) {
  for (bool two_bit : {false, true}) {
    for (auto [chunk, k] : {std::pair<std::uint32_t, std::uint32_t>{4096, 64},
                            {100, 7},
                            {16, 16},
                            {16, 40},
                            {1, 1},
                            {65536, 3}}) {
      const TopKCodec c{.chunk = chunk, .k = k, .two_bit = two_bit};
      SCOPED_TRACE(testing::Message() << "chunk " << chunk << " k " << k << " 2bit " << two_bit);
      check_topk(c, normal(4096 * 2 + 1234, 21));
      check_topk(c, heavy(4096 + 17, 22));
      check_topk(c, Floats(300, 0.0f));
      check_topk(c, normal(333, 23, 1e-38f));
      check_topk(c, Floats{});
      Floats ties(1000, 1.0f);
      for (std::size_t i = 0; i < ties.size(); i += 3) ties[i] = -1.0f;
      check_topk(c, ties);
      Floats few(5000, 0.0f);  // small integers, lots of equal magnitudes
      std::mt19937 rng(5);
      for (auto& v : few) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
      check_topk(c, few);
    }
  }
}

TEST(TopK, RepeatedRoundsKeepTheInvariantAndShrinkTheBuffer) {
  const TopKCodec c;
  Floats e = normal(4096 * 4, 31);
  const double n0 = l2_norm(e.data(), e.size());
  for (int round = 0; round < 5; ++round) {
    Floats before = e;
    Bytes msg(c.encoded_size(e.size()));
    ASSERT_EQ(c.encode(e, msg), CodecError::ok);
    Floats d(e.size());
    ASSERT_EQ(c.decode(msg, d), CodecError::ok);
    for (std::size_t i = 0; i < e.size(); ++i) ASSERT_EQ(e[i] + d[i], before[i]);
    const double mk = mass_kept(before.data(), d.data(), e.size());
    EXPECT_GT(mk, 64.0 / 4096);  // top-k keeps more than a random 1/64 of the mass
  }
  EXPECT_LT(l2_norm(e.data(), e.size()), n0);
}

TEST(TopK, RejectsNonFiniteAndLeavesBufferUntouched) {
  for (bool two_bit : {false, true}) {
    const TopKCodec c{.chunk = 100, .k = 5, .two_bit = two_bit};
    for (float bad : {kInf, -kInf, kNaN}) {
      Floats e = normal(1050, 41);
      e[1049] = bad;
      const Floats before = e;
      Bytes msg(c.encoded_size(e.size()));
      EXPECT_EQ(c.encode(e, msg), CodecError::not_finite);
      EXPECT_TRUE(same_bits(e, before));
    }
    Floats e = normal(1050, 41);
    Bytes msg(c.encoded_size(e.size()) + 1);
    EXPECT_EQ(c.encode(e, msg), CodecError::size_mismatch);
  }
}

TEST(TopK, RejectsMalformedMessages) {
  for (bool two_bit : {false, true}) {
    const TopKCodec c{.chunk = 100, .k = 5, .two_bit = two_bit};
    Floats e = normal(250, 51);  // chunks of 100, 100, 50
    Bytes msg(c.encoded_size(e.size()));
    ASSERT_EQ(c.encode(e, msg), CodecError::ok);
    const std::size_t chunk_bytes = two_bit ? 4 + 2 + 10 : 30;
    const std::size_t idx_off = two_bit ? 6 : 20;  // indices within a chunk message
    Floats out(250, 7.0f);
    const Floats out0 = out;
    auto expect_rejected = [&](const Bytes& m, CodecError want) {
      EXPECT_EQ(c.decode_add(m, out), want);
      EXPECT_EQ(out, out0);  // nothing applied
      Floats d(250);
      EXPECT_EQ(c.decode(m, d), want);
    };
    auto set_idx = [&](Bytes& m, std::size_t chunk, std::size_t j, std::uint16_t v) {
      std::memcpy(m.data() + chunk * chunk_bytes + idx_off + 2 * j, &v, 2);
    };
    auto get_idx = [&](const Bytes& m, std::size_t chunk, std::size_t j) {
      std::uint16_t v;
      std::memcpy(&v, m.data() + chunk * chunk_bytes + idx_off + 2 * j, 2);
      return v;
    };
    {  // out of range in a full chunk and in the short last chunk (len 50)
      Bytes m = msg;
      set_idx(m, 0, 4, 100);
      expect_rejected(m, CodecError::malformed);
      m = msg;
      set_idx(m, 2, 4, 50);
      expect_rejected(m, CodecError::malformed);
      m = msg;
      set_idx(m, 1, 4, 65535);
      expect_rejected(m, CodecError::malformed);
    }
    {  // duplicate and decreasing indices
      Bytes m = msg;
      set_idx(m, 1, 1, get_idx(m, 1, 0));
      expect_rejected(m, CodecError::malformed);
      m = msg;
      const auto a = get_idx(m, 1, 2), b = get_idx(m, 1, 3);
      set_idx(m, 1, 2, b);
      set_idx(m, 1, 3, a);
      expect_rejected(m, CodecError::malformed);
    }
    if (two_bit) {  // bad scale; non-zero padding bits (k=5: 2 code bytes, 3 bits pairs unused)
      for (float s : {-1.0f, kNaN, kInf}) {
        Bytes m = msg;
        std::memcpy(m.data() + chunk_bytes, &s, 4);
        expect_rejected(m, CodecError::malformed);
      }
      Bytes m = msg;
      m[4 + 1] |= 0x04;
      expect_rejected(m, CodecError::malformed);
    } else {  // non-finite value
      Bytes m = msg;
      std::memcpy(m.data() + chunk_bytes + 4, &kNaN, 4);
      expect_rejected(m, CodecError::not_finite);
    }
    Bytes shorter(msg.begin(), msg.end() - 1);
    expect_rejected(shorter, CodecError::size_mismatch);
    // 350 values need 4 chunks. (The message does not carry n: counts that give the same size,
    // e.g. 251, decode against the receiver's n, with indices checked against that n.)
    Floats wrong(350);
    EXPECT_EQ(c.decode(msg, wrong), CodecError::size_mismatch);
  }
}

TEST(TopK, PortableAndSimdBitIdentical) {
  if (!simd_available()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  for (bool two_bit : {false, true}) {
    for (auto [chunk, k] : {std::pair<std::uint32_t, std::uint32_t>{4096, 64},
                            {4096, 1},
                            {4096, 1000},
                            {4097, 64},
                            {100, 7},
                            {100, 99},
                            {9, 2},
                            {7, 3},
                            {16, 40},
                            {65536, 3}}) {
      const TopKCodec c{.chunk = chunk, .k = k, .two_bit = two_bit};
      for (const auto& x : selection_datasets()) {
        SCOPED_TRACE(testing::Message() << "chunk " << chunk << " k " << k << " 2bit " << two_bit
                                        << " n " << x.size());
        Floats ea = x, eb = x;
        Bytes a(c.encoded_size(x.size())), b(a.size());
        ASSERT_EQ(detail::topk_encode(c, ea, a, Impl::portable), CodecError::ok);
        ASSERT_EQ(detail::topk_encode(c, eb, b, Impl::best), CodecError::ok);
        ASSERT_EQ(a, b);
        ASSERT_TRUE(same_bits(ea, eb));
        // The selection matches the reference (kc largest |x|, ties to the lower index).
        std::size_t off = 0;
        for (std::size_t base = 0; base < x.size(); base += chunk) {
          const auto len =
              static_cast<std::uint32_t>(std::min<std::size_t>(chunk, x.size() - base));
          const std::uint32_t kc = std::min(k, len);
          const auto want = ref_topk(x.data() + base, len, kc);
          const std::size_t idx_off = two_bit ? off + 4 + (kc + 3) / 4 : off + 4 * kc;
          for (std::uint32_t j = 0; j < kc; ++j) {
            std::uint16_t i;
            std::memcpy(&i, b.data() + idx_off + 2 * j, 2);
            ASSERT_EQ(i, want[j]) << "chunk at " << base;
          }
          off += two_bit ? 4 + (kc + 3) / 4 + 2 * kc : 6 * kc;
        }
      }
    }
  }
}

TEST(TopK, NonFiniteInALaterChunkLeavesEveryChunkUntouched) {
  for (Impl impl : {Impl::portable, Impl::best}) {
    for (bool two_bit : {false, true}) {
      const TopKCodec c{.chunk = 64, .k = 5, .two_bit = two_bit};
      Floats e = normal(64 * 10 + 3, 71);
      e[64 * 7 + 9] = kNaN;
      const Floats before = e;
      Bytes msg(c.encoded_size(e.size()));
      EXPECT_EQ(detail::topk_encode(c, e, msg, impl), CodecError::not_finite);
      EXPECT_TRUE(same_bits(e, before));
    }
  }
}

// --- metrics ---------------------------------------------------------------------------------

TEST(Metrics, Basics) {
  const Floats a = {3.0f, 4.0f}, b = {0.0f, 0.0f}, c = {3.0f, 0.0f};
  EXPECT_DOUBLE_EQ(l2_norm(a.data(), 2), 5.0);
  EXPECT_DOUBLE_EQ(rms_distance(a.data(), b.data(), 2), std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(rms_distance(a.data(), a.data(), 2), 0.0);
  EXPECT_DOUBLE_EQ(rms_distance(a.data(), b.data(), 0), 0.0);
  EXPECT_DOUBLE_EQ(mass_kept(a.data(), c.data(), 2), 9.0 / 25.0);
  EXPECT_DOUBLE_EQ(mass_kept(b.data(), b.data(), 2), 1.0);
}

TEST(CodecError, Names) {
  EXPECT_STREQ(to_string(CodecError::ok), "ok");
  EXPECT_STREQ(to_string(CodecError::malformed), "malformed");
}

}  // namespace
}  // namespace grove::optim
