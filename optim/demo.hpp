// DeMo, decoupled momentum (Peng, Quesnelle, Kingma, arXiv 2411.19870; the rule as the authors'
// code bloc97/DeMo@0e48145 applies it, docs/ALGORITHMS.md "DeMo"): every step each member adds
// its gradient to a momentum δ, sends the largest coefficients of δ's chunked DCT and removes
// what it sent from δ; every member then steps by the sign of the group's mean of what was sent.
//
// Pure math on one tensor at a time, float32, row-major (torch's layout: a Linear's weight is
// [out, in]). Per tensor, with lr the step's learning rate and β the decay:
//   δ ← β·δ + lr·g
//   C ← DCT(δ) per block of h × w values (separable, orthonormal DCT-II)
//   send the k largest |C| per block (ties: the lower index), δ ← δ − IDCT(what was sent)
//   G ← IDCT(per coefficient: the mean of the values sent by the members that sent it)
//   p ← (1 − lr·wd)·p − lr·sign(G)
// Memory: nothing model-sized besides the caller's p, δ and g; scratch is a few block rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "optim/codecs.hpp"

namespace grove::optim {

struct DemoParams {
  float decay = 0.999f;      // β: δ ← β·δ + lr·g; 0 ≤ β < 1
  std::uint32_t topk = 32;   // coefficients sent per block (at most the block's size)
  std::uint32_t chunk = 64;  // a dimension's block side: its largest divisor ≤ chunk (≤ 256)
  float weight_decay = 0;    // decoupled: p ← (1 − lr·wd)·p before the sign step
};
// Empty when valid, else what is wrong (for the configuration's error message).
const char* demo_params_problem(const DemoParams& p);

// The block side of a dimension of s values: its largest divisor ≤ c (the reference's rule, so
// block sides always divide their dimension; a prime above c gets 1: no transform on that axis).
std::size_t demo_chunk(std::size_t s, std::size_t c);

// How a tensor is cut into DCT blocks. A tensor is viewed as rows × cols: one of L values as
// 1 × L (the reference's 1-D case: each chunk of a row is transformed alone), one of two
// dimensions as it is, one of three or more as shape[0] × the rest (grove-node's extension: the
// reference takes one and two dimensions only), a scalar as 1 × 1. Blocks are h × w, in
// row-major block order; within a block, coefficient (a, b) has index a·w + b (a the frequency
// along the rows).
struct DemoBlocks {
  std::size_t rows = 0, cols = 0, h = 1, w = 1;
  std::uint32_t k = 0;  // coefficients sent per block: min(topk, h·w)
  std::size_t count() const { return h && w ? (rows / h) * (cols / w) : 0; }
  std::size_t size() const { return rows * cols; }
};
DemoBlocks demo_blocks(std::span<const std::uint64_t> shape, const DemoParams& p);

// What a member sends for one tensor: per block (in block order) k u16 indices, strictly
// increasing, each < h·w, then k float32 values (all little-endian): 6·k bytes a block.
std::size_t demo_encoded_size(const DemoBlocks& b);
// Checks a member's message for b: size, indices in range and strictly increasing within their
// block, finite values (size_mismatch, malformed, not_finite).
CodecError demo_check(const DemoBlocks& b, std::span<const std::uint8_t> msg);

// The transform and its scratch (the DCT matrices of every block side used so far, a few block
// rows of work space). One per thread.
class Demo {
 public:
  // δ ← β·δ + lr·g, then writes the message (demo_encoded_size(b) bytes) and removes what it
  // sends from δ. Returns not_finite, touching nothing, if g or δ holds NaN or Inf;
  // size_mismatch if a span's size does not fit b.
  CodecError compress(const DemoBlocks& b, std::span<float> delta, std::span<const float> grad,
                      float lr, float decay, std::span<std::uint8_t> out);

  // The group's step from its members' messages (the same order on every member: sums are taken
  // in it): p ← (1 − lr·wd)·p − lr·sign(G). Every message is checked first (demo_check); on an
  // error p is untouched. `g_out`, when not empty (b.size() values), receives G.
  CodecError apply(const DemoBlocks& b, std::span<const std::span<const std::uint8_t>> members,
                   std::span<float> p, float lr, float weight_decay, std::span<float> g_out = {});

  // The orthonormal DCT-II matrix of side n, row-major: M[f·n + t] = s_f·cos(π(2t+1)f / 2n),
  // s_0 = √(1/n), s_f = √(2/n) (computed in double, rounded once).
  std::span<const float> basis(std::size_t n);

 private:
  struct Basis {
    std::vector<float> m, mt;  // M and its transpose
  };
  const Basis& get(std::size_t n);
  // Forward: c[a, col] for the slab's columns [c0, c0 + nc) (h rows of `ld` values).
  void forward(const DemoBlocks& b, const float* slab, std::size_t ld, std::size_t nc, float* c);
  // Inverse: g[i, col] from coefficients in `a` (h × nc), written to g (h × nc).
  void inverse(const DemoBlocks& b, const float* a, std::size_t nc, float* g);

  std::map<std::size_t, Basis> bases_;
  std::vector<float> t1_, c_, a_, g_;
  std::vector<std::uint32_t> cnt_, order_;
};

}  // namespace grove::optim
