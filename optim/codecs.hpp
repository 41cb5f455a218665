// Wire codecs for pseudo-gradients and weights: pure math on flat float32 buffers.
//
// No networking, no exceptions for bad input: every encode/decode returns a CodecError (see
// docs/ERRORS.md: a decoder of peer data never throws; the caller turns a non-ok result into its
// own transport error). Wire layouts are little-endian. On any non-ok result the contents of the
// destination buffer are unspecified, except where noted (top-k error buffers and decode_add
// outputs are left untouched on error).
//
// Codecs (see docs in each section for the exact layout and error bound):
//   fp16   2 bytes/value, IEEE binary16, round-to-nearest-even, finite overflow saturates.
//   bf16   2 bytes/value, top 16 bits of binary32, round-to-nearest-even, saturates.
//   E3M0   4 bits/value + one fp32 scale per block (Streaming DiLoCo / Grove, ALGORITHMS.md).
//   TopK   per-chunk top-k with error feedback (SparseLoCo), fp32 or 2-bit values + u16 indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace grove::optim {

enum class CodecError {
  ok,
  size_mismatch,  // a buffer's size does not match the element count (or encoded_size)
  not_finite,     // NaN or Inf in the input to encode, or decoded from the wire
  malformed,      // encoded bytes that no encoder produces (bad code, index, scale, padding),
                  // or invalid codec parameters
};

const char* to_string(CodecError e);

// Which implementation to run. `best` picks SIMD (AVX2/F16C) when the CPU has it; `portable`
// forces the scalar code. Both produce bit-identical results (tested).
enum class Impl { best, portable };

// True when the running CPU supports the SIMD paths (AVX2 + F16C).
bool simd_available();

// ---------------------------------------------------------------------------------------------
// fp16: layout = n little-endian IEEE binary16 values.
// encode: round-to-nearest-even. NaN/Inf input -> not_finite. Finite |x| > 65504 saturates to
//   ±65504 (the largest half). Subnormal halves are produced (no flush to zero).
//   Error bound: for |x| <= 65504, |x̂ - x| <= 2^-11·|x| when |x| >= 2^-14 (normal range), and
//   |x̂ - x| <= 2^-25 below it (half the subnormal spacing).
// decode: exact (every half is a float). A half Inf/NaN code on the wire -> not_finite.
constexpr std::size_t fp16_encoded_size(std::size_t n) {
  return 2 * n;
}
CodecError fp16_encode(std::span<const float> in, std::span<std::uint8_t> out,
                       Impl impl = Impl::best);
CodecError fp16_decode(std::span<const std::uint8_t> in, std::span<float> out,
                       Impl impl = Impl::best);
// Scalar conversions (no checks: Inf/NaN map to half Inf/NaN; finite overflow saturates).
std::uint16_t float_to_half(float x);
float half_to_float(std::uint16_t h);

// ---------------------------------------------------------------------------------------------
// bf16: layout = n little-endian uint16 (the top half of the binary32 pattern after rounding).
// encode: round-to-nearest-even on the dropped 16 bits. NaN/Inf input -> not_finite. Finite values
//   that would round up to Inf saturate to ±3.3895314e38 (0x7f7f). Subnormals are kept.
//   Error bound: |x̂ - x| <= 2^-8·|x| for normal floats; <= 2^-134 for float subnormals.
// decode: exact. A bf16 Inf/NaN pattern on the wire -> not_finite.
constexpr std::size_t bf16_encoded_size(std::size_t n) {
  return 2 * n;
}
CodecError bf16_encode(std::span<const float> in, std::span<std::uint8_t> out,
                       Impl impl = Impl::best);
CodecError bf16_decode(std::span<const std::uint8_t> in, std::span<float> out,
                       Impl impl = Impl::best);
std::uint16_t float_to_bf16(float x);
float bf16_to_float(std::uint16_t h);

// ---------------------------------------------------------------------------------------------
// E3M0 4-bit (ALGORITHMS.md "Overlap and 4-bit values").
// Values are cut into blocks of `block` values (the last may be shorter). Per block:
//   s = median of |x| over the block's non-zero values (the lower median: the element of rank
//       (m-1)/2 in ascending order of the m non-zero magnitudes; s = 0 when there are none),
//   r = |x|/s; r < 0.125 (or x == 0) -> code 0; else e = round(log2 r) clipped to [-2, 3]
//   (rounded in the log domain: the boundaries are s·2^(j+½), compared in float),
//   code = (sign << 3) | (e + 3), x̂ = ±s·2^e (clamped to ±FLT_MAX).
// Layout: [ceil(n/block) scales, float32 LE][ceil(n/2) bytes: element 2i in the low nibble of
//   byte i, element 2i+1 in the high nibble; an odd n leaves the last high nibble 0].
// Error bound per element (s = its block's scale):
//   |x̂ - x| <= (√2 - 1)·|x|           for s·2^-2.5 <= |x| <= s·2^3.5 (the "in range" values),
//   |x̂ - x| <= max((√2-1)|x|, s/8, |x| - 8s) for every x (small values go to 0 or s/4, values
//   above 8s are clipped to 8s); all up to float rounding of the thresholds (~1 ulp).
// decode rejects (malformed): a negative or non-finite scale, codes 7, 8 and 15, a non-zero
//   padding nibble. `block` must be even and >= 2 (else malformed).
struct E3M0Params {
  std::size_t block = 256;
};
std::size_t e3m0_encoded_size(std::size_t n, E3M0Params p = {});
CodecError e3m0_encode(std::span<const float> in, std::span<std::uint8_t> out, E3M0Params p = {},
                       Impl impl = Impl::best);
CodecError e3m0_decode(std::span<const std::uint8_t> in, std::span<float> out, E3M0Params p = {},
                       Impl impl = Impl::best);

// ---------------------------------------------------------------------------------------------
// Chunked top-k with error feedback (SparseLoCo, ALGORITHMS.md).
// The buffer is cut into chunks of `chunk` values (the last may be shorter, L values); each chunk
// sends kc = min(k, L) values: the kc largest |e|, ties broken by the lower index.
// Chunk layout (chunks concatenated in order):
//   fp32 mode  : [kc values float32][kc indices u16, strictly increasing, < L]
//   two_bit    : [scale float32][ceil(kc/4) bytes of 2-bit codes, value j in bits 2(j%4)..+1 of
//                byte j/4, unused bits 0][kc indices u16, strictly increasing, < L]
//   2-bit code = (negative << 1) | big; value = ±(big ? 1.5 : 0.5)·scale (clamped to FLT_MAX),
//   scale = mean |v| over the chunk's selected values. Values are written in index order.
// encode(e, out): writes the message for e and then applies error feedback e -= Δ̂ using exactly
//   the values a decoder will produce, so e_before == e_after + decode(out) holds exactly in fp32
//   mode (sent entries become 0) and to within float rounding of the subtraction (<= 1/2 ulp of
//   e_after) in 2-bit mode. NaN/Inf in e -> not_finite and e is left untouched.
//   2-bit error bound per sent value v (nearest level, sign kept): |v̂ - v| <= max(0.5s,
//   |v| - 1.5s), i.e. <= 0.5s for |v| <= 2s; fp32 mode is exact.
// decode(in, out): out = dense Δ̂ (zeros elsewhere). decode_add(in, out, w): out += w·Δ̂.
//   Rejected (nothing written): size != encoded_size(out.size()) (size_mismatch), an index out of
//   range or not strictly increasing within its chunk, non-zero padding bits, a negative or
//   non-finite scale (malformed), a non-finite fp32 value (not_finite).
// A message does not carry n: the receiver's n fixes the chunking (sizes are checked against it,
// indices against each chunk's length), so two counts with the same encoded size both accept it.
// Parameters: 1 <= chunk <= 65536, k >= 1 (else every call returns malformed / size 0).
struct TopKCodec {
  std::uint32_t chunk = 4096;
  std::uint32_t k = 64;
  bool two_bit = false;

  bool valid() const { return chunk >= 1 && chunk <= 65536 && k >= 1; }
  std::size_t encoded_size(std::size_t n) const;
  CodecError encode(std::span<float> e, std::span<std::uint8_t> out) const;
  CodecError decode(std::span<const std::uint8_t> in, std::span<float> out) const;
  CodecError decode_add(std::span<const std::uint8_t> in, std::span<float> out,
                        float weight = 1.0f) const;
};

// ---------------------------------------------------------------------------------------------
// Metrics (double accumulation).
// ||sent||² / ||e_before||²: the fraction of the error buffer's mass a top-k message carried
// (1 when e_before is all zero).
double mass_kept(const float* e_before, const float* sent, std::size_t n);
// sqrt(mean((a-b)²)); 0 for n == 0.
double rms_distance(const float* a, const float* b, std::size_t n);
double l2_norm(const float* x, std::size_t n);

}  // namespace grove::optim
