// Outer optimizer steps of DiLoCo, NoLoCo and SparseLoCo on flat float32 buffers, with their
// state explicit (its binary form: optim/state_format.hpp). Pure math: no networking, no
// libtorch. Rules: ../shared/ALGORITHMS.md.
//   Every step takes `threads`: 1 runs on the caller's thread (no allocation); n > 1 splits the
//   buffers into n slices on n threads (0 = one per hardware thread, at most 8) once there are at
//   least 2^18 values per slice. One thread does not reach the memory bandwidth here
//   (bench/optim_bench), so the node passes 0. Results do not depend on the split.
//   φ slow weights, θ fast weights after H inner steps, Δ = φ − θ pseudo-gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "optim/floats.hpp"

namespace grove::optim {

/// DiLoCo: SGD with Nesterov momentum on the averaged pseudo-gradient, exactly as
/// torch.optim.SGD(lr, momentum, nesterov=True, dampening=0, weight_decay=0):
///   b = μ·b + Δ;  φ = φ − lr·(Δ + μ·b).   (b starts at zero, which equals torch's first step.)
/// `warmup` > 0: the step of round r (the round it ends in, counted from 1) uses
/// at_round(r): over the first `warmup` rounds lr ramps linearly from 1 to `lr` and the momentum
/// from 0 to `momentum`, so that the first outer step is plain averaging (φ = mean θ) and
/// momentum builds up only once the pseudo-gradients have settled (a momentum of 0.9 gathered
/// from a cold start's large first pseudo-gradients overshoots: docs/ALGORITHMS.md).
struct DiLoCoConfig {
  float lr = 0.7f;
  float momentum = 0.9f;
  std::uint32_t warmup = 0;
  DiLoCoConfig at_round(std::uint64_t round) const;
};
void diloco_step(std::span<float> phi, std::span<float> buf, std::span<const float> delta_mean,
                 const DiLoCoConfig& cfg, unsigned threads = 1);

/// NoLoCo: modified Nesterov with a consensus term, over a group G (i included):
///   m = α·m − β·mean_G(Δ) − γ·(φ − mean_G(φ));  φ = φ + m.
/// `lookahead` > 0: each inner phase starts from θ = φ + lookahead·m (where the momentum is
/// heading, as Nesterov's look-ahead) instead of θ = φ; the step itself is unchanged.
/// `nesterov` (grove-node's rule): each member takes DiLoCo's Nesterov step on its own
/// pseudo-gradient without applying it (noloco_proposal), m' = α·m − β·Δ, P = φ + α·m' − β·Δ,
/// and the group averages both: φ = mean_G(P), m = mean_G(m') (γ unused: the pull is whole).
/// The step is linear, so this is DiLoCo's step from the group's mean φ, m and Δ; with G the
/// whole swarm it is DiLoCo's step exactly (m = −β·b, α = μ, β = lr), and after a round the
/// group's members hold the same φ and m. The paper's rule instead feeds the consensus error
/// through each member's own momentum, which amplifies it by 1/(1 − α) and drives replicas
/// apart at DiLoCo's momentum (docs/ALGORITHMS.md). Two tensors travel, P and m'.
/// `warmup` > 0: as DiLoCo's (DiLoCoConfig): round r ≤ warmup steps with α·s, β and γ moved
/// from 1 by s, s = (r − 1)/warmup, so the first round is plain averaging (φ = mean_G θ).
struct NoLoCoConfig {
  float alpha = 0.5f;
  float beta = 0.7f;
  float gamma = 0.7f;
  float lookahead = 0.0f;
  bool nesterov = false;
  std::uint32_t warmup = 0;
  bool one_tensor() const { return !nesterov && beta == gamma; }
  NoLoCoConfig at_round(std::uint64_t round) const;
};
/// NoLoCo's two named settings (docs/ALGORITHMS.md): the paper's (pairs; α 0.5, β = γ 0.7, one
/// tensor travels), and grove-node's default, the Nesterov rule with DiLoCo's numbers (α 0.9,
/// β 0.7), a full pull (γ 1) and DiLoCo's 10-round warm-up: 1.8% from DiLoCo's loss at 8 nodes
/// against the paper's 22% (gpt tiny, H = 50).
inline constexpr NoLoCoConfig kNoLoCoPaper{0.5f, 0.7f, 0.7f, 0.0f, false, 0};
inline constexpr NoLoCoConfig kNoLoCoGrove{0.9f, 0.7f, 1.0f, 0.0f, true, 10};
void noloco_step(std::span<float> phi, std::span<float> m, std::span<const float> delta_mean,
                 std::span<const float> phi_mean, const NoLoCoConfig& cfg, unsigned threads = 1);
/// The Nesterov rule's message over some values: m' = α·m − β·(φ − θ) into `m_next` and
/// P = φ + α·m' − β·(φ − θ) into `p` (φ, m, θ unchanged).
void noloco_proposal(std::span<const float> phi, std::span<const float> m,
                     std::span<const float> theta, std::span<float> p, std::span<float> m_next,
                     const NoLoCoConfig& cfg, unsigned threads = 1);
/// The β = γ form, where only θ travels: m = α·m + β·(mean_G(θ) − φ); φ = φ + m.
/// A group of one (no partner) passes its own θ: m = α·m − β·Δ.
void noloco_step_theta(std::span<float> phi, std::span<float> m, std::span<const float> theta_mean,
                       const NoLoCoConfig& cfg, unsigned threads = 1);

/// SparseLoCo, the parts around the top-k codec (optim/codecs): the error buffer takes the new
/// pseudo-gradient, e = β_e·e + Δ; the codec sends a top-k of e and subtracts what it sent;
/// every node applies the mean of what was sent, φ = φ − lr·mean(Δ̂).
struct SparseLoCoConfig {
  float lr = 1.0f;
  float decay = 0.95f;  ///< β_e
  std::size_t chunk = 4096;
  std::size_t topk = 64;
};
void error_feedback_accumulate(std::span<float> e, std::span<const float> delta, float decay,
                               unsigned threads = 1);
void apply_mean_update(std::span<float> phi, std::span<const float> mean_update, float lr,
                       unsigned threads = 1);

/// Δ = φ − θ; with `scale` ≠ 1, Δ = (φ − θ) × scale (a pseudo-gradient clipped to a norm).
void pseudo_gradient(std::span<const float> phi, std::span<const float> theta,
                     std::span<float> delta, unsigned threads = 1, float scale = 1.0f);
/// ‖φ − θ‖² in double (Δ's squared L2 norm without writing Δ); finite exactly when every
/// difference is. Summed per slice, then the slices in order.
double pseudo_gradient_sq_norm(std::span<const float> phi, std::span<const float> theta,
                               unsigned threads = 1);

/// Overlap (Streaming DiLoCo): the round's exchange ran while inner steps went on; when the new
/// slow weights φ' arrive, θ = α·θ_local + (1−α)·φ' and φ := φ'. The next pseudo-gradient is
/// then φ' − θ_next: it is taken against the new slow weights, not against the mixed θ (taking
/// it against the mixed weights makes every later pseudo-gradient shrink towards zero).
void overlap_mix(std::span<float> theta_local, std::span<float> phi, std::span<const float> phi_new,
                 float alpha = 0.5f, unsigned threads = 1);

/// Everything the outer loop carries from round to round.
/// The arrays may live in pages the node hands back between uses (optim/floats.hpp).
struct OuterState {
  std::uint64_t round = 0;
  Floats phi;       ///< slow weights
  Floats momentum;  ///< DiLoCo b / NoLoCo m (empty if unused)
  Floats error;     ///< SparseLoCo error buffer (empty if unused)
  friend bool operator==(const OuterState&, const OuterState&) = default;
};

/// True when every value is finite.
bool all_finite(std::span<const float> x);

}  // namespace grove::optim
