// StepWork: the model-sized work that ends a round, as one job for the driver to run off its
// strand (seconds for a large model): the outer step with what the round's averaging gave (or the
// local step alone), the new φ's hash and the new state's binary form (written piece by piece
// into a blob of the engine's store); or the parsing of a downloaded state. Every pass walks the
// arrays a fragment at a time and releases what it is done with (optim/floats.hpp). run() touches
// nothing but the job's own fields and the store.
#pragma once

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gossip/allgather.hpp"
#include "gossip/mode.hpp"
#include "gossip/protocol.hpp"
#include "gossip/slice.hpp"
#include "gossip/state_blob.hpp"
#include "gossip/wire.hpp"
#include "optim/outer.hpp"

namespace grove::gossip {

/// BLAKE2b-256 of the values' bytes.
Digest weights_hash(std::span<const float> phi);
/// The same a fragment at a time, each released once hashed (paged arrays leave memory).
Digest weights_hash(const optim::Floats& phi);
inline Digest weights_hash(const std::vector<float>& v) {
  return weights_hash(std::span<const float>(v));
}

/// Δ = φ − θ (times `scale`) over `slice`, written at `offset` of `into` (made with `alloc` when
/// too small), a fragment at a time, each released once written.
optim::Floats pseudo_gradient_into(const optim::Floats& phi, const optim::Floats& theta,
                                   std::size_t offset, optim::Floats into,
                                   const optim::FloatAllocator& alloc, unsigned threads,
                                   float scale = 1.0f, Slice slice = {});
/// NoLoCo's Nesterov rule: this member's message over `slice`, its proposal P and its next
/// momentum m' (optim::noloco_proposal), each in a new array made with `alloc`, a fragment at a
/// time (each released once written; φ, m and θ released once read).
std::pair<optim::Floats, optim::Floats> noloco_proposal_into(const optim::Floats& phi,
                                                             const optim::Floats& m,
                                                             const optim::Floats& theta,
                                                             const optim::NoLoCoConfig& cfg,
                                                             const optim::FloatAllocator& alloc,
                                                             unsigned threads, Slice slice = {});
/// ‖φ − θ‖ over `slice` (the pseudo-gradient's L2 norm, Δ not written), a fragment at a time,
/// each released once read; finite exactly when every difference is.
double pseudo_gradient_norm(const optim::Floats& phi, const optim::Floats& theta, unsigned threads,
                            Slice slice = {});
/// ‖values[offset, offset + n)‖, a fragment at a time (the result of an all-reduce).
double norm_of(const optim::Floats& values, std::size_t offset, std::size_t n);
/// Error feedback's accumulation over `slice`, e = decay·e + scale·(φ − θ), a fragment at a time
/// (e made with `alloc`, φ's size, when empty); returns ‖e‖ over the slice (what the member will
/// compress and declare), and ‖scale·(φ − θ)‖ in `fresh` when given.
double accumulate_error(const optim::Floats& phi, const optim::Floats& theta, optim::Floats& e,
                        float decay, float scale, const optim::FloatAllocator& alloc,
                        unsigned threads, Slice slice = {}, double* fresh = nullptr);
/// from[from_lo, from_lo + count) copied to into[into_lo, ...), a fragment at a time (each
/// released once copied).
void copy_values(const optim::Floats& from, std::size_t from_lo, optim::Floats& into,
                 std::size_t into_lo, std::size_t count);
/// from[lo, hi) copied into the first values of a new array of max(size, hi − lo) values made
/// with `alloc`.
optim::Floats copy_range(const optim::Floats& from, std::size_t lo, std::size_t hi,
                         const optim::FloatAllocator& alloc, std::size_t size = 0);

/// DiLoCo-mode rounds whose members each send a compressed message (a ring all-gather,
/// gossip/allgather.hpp) instead of all-reducing Δ in fp16: each member keeps an error buffer e
/// (optim::OuterState::error), e = decay·e + Δ before its message and e −= what it sent after;
/// the group's mean steps φ with DiLoCo's rule. SparseLoCo is this with top-k messages, decay
/// 0.95 and no momentum (φ −= lr·mean: DiLoCo's step with μ = 0); E3M0 DiLoCo with 4-bit
/// messages and plain error feedback (decay 1).
struct CompressedRounds {
  GatherCodec codec;
  float decay = 1.0f;
  std::size_t piece_values = std::size_t{1} << 18;  ///< the all-gather's pieces (feedback's too)

  /// SparseLoCo's messages (defaults as Grove's: the top 64 of each 4096 values, fp32 values,
  /// error decay 0.95); its outer step (lr 1.0, no momentum) is the caller's DiLoCoConfig.
  static CompressedRounds sparseloco(std::uint32_t chunk = 4096, std::uint32_t k = 64,
                                     bool two_bit = false, float decay = 0.95f) {
    CompressedRounds c;
    c.codec.kind = WireCodec::topk;
    c.codec.topk = {chunk, k, two_bit};
    c.decay = decay;
    return c;
  }
  /// E3M0 DiLoCo: 4-bit messages with plain error feedback.
  static CompressedRounds e3m0() {
    CompressedRounds c;
    c.codec.kind = WireCodec::e3m0;
    return c;
  }
};

struct StepWork {
  enum class Kind {
    none,   ///< φ stays (the inner phase was lost)
    local,  ///< no partner: θ against φ alone
    /// NoLoCo with the exchange's means: of θ (β = γ), of Δ and of φ, or (the Nesterov rule)
    /// of the proposals P and of m'
    noloco_mean,
    diloco_ring,  ///< DiLoCo with the all-reduce's mean Δ (or mean φ ‖ mean Δ)
    parse,        ///< a downloaded state: `blob` parsed into `state` (no step)
    replay,       ///< downloaded deltas applied to `state` (gossip/state_delta.hpp)
    save,         ///< no step: the state's snapshot only (`hash` is φ's, given)
    /// before a DiLoCo round (no step): `norm` = ‖φ − θ‖, or, with `compressed`, the error
    /// buffer's accumulation e = decay·e + (φ − θ) and `norm` = ‖e‖; nothing else is made
    prepare,
  } kind = Kind::none;
  optim::OuterState state;  ///< in: φ, momentum, the round after the step; out: the new state
  OuterMode mode = OuterMode::noloco;
  /// prepare, local and diloco_ring in DiLoCo mode: the values the round takes (a streaming
  /// fragment; `ring` then holds that many, mean φ ‖ mean Δ always all of them); the rest of φ,
  /// the momentum and the error buffer stay as they are.
  /// noloco_mean: the values the pair averaged (NoLoCo with fragments): `mean` and `phi_mean`
  /// hold that many, `theta` is ours, whole, and the other values take the local-only step.
  Slice slice;
  /// local: θ; noloco_mean: the mean of θ, of Δ (β ≠ γ) or of P (Nesterov); with a slice, our θ
  optim::Floats theta;
  optim::Floats mean;        ///< noloco_mean with a slice: the mean of θ (or of Δ) over it
  optim::Floats phi_mean;    ///< noloco_mean with β ≠ γ: the mean of φ (over the slice)
  optim::Floats ring;        ///< diloco_ring: the result, kept for the next all-reduce
  bool average_phi = false;  ///< diloco_ring: the result is mean φ ‖ mean Δ
  optim::NoLoCoConfig noloco;
  optim::DiLoCoConfig diloco;
  unsigned threads = 0;
  std::shared_ptr<const StateBlob> blob;  ///< parse: the verified download; out: the new state's
  std::size_t max_values = 0;             ///< parse: optim::deserialize's bound
  optim::FloatAllocator alloc;            ///< parse: where the state's arrays go (none: the heap)
  std::optional<std::size_t> want;        ///< parse: φ's size when known
  std::string error;                      ///< parse, replay: why the state was refused (out)
  /// diloco_ring (mean Δ only): where the round's mean Δ is kept as a delta, in `delta_codec`
  /// (delta_codec'ed), with φ's hash before the step (`delta_from`); nullptr: none is kept.
  std::shared_ptr<BlobStore> delta_store;
  WireCodec delta_codec = WireCodec::fp16;
  Digest delta_from{};
  std::shared_ptr<const StateBlob> delta;  ///< diloco_ring: the delta kept (out; nullptr: none)
  /// diloco_ring (mean Δ only): the most ‖mean Δ‖ may be — the mean of the norms the ring's
  /// members published in their ready records, with the codec's rounding (NaN: not checked).
  /// Above it a member sent more than it declared: the step is not taken (φ, momentum stay,
  /// the round advances, no delta is kept) and `dropped` says why. Every member decides alike:
  /// the mean is bit-identical and the norms come from the same records.
  double max_mean_norm = std::numeric_limits<double>::quiet_NaN();
  std::string dropped;  ///< diloco_ring: why the round's step was not taken (out; empty: taken)
  /// diloco_ring: `ring` is the mean of the members' compressed messages; state.error is this
  /// member's error buffer, which loses what it sent (the feedback) when the step is taken.
  /// local (DiLoCo): with `error_has_delta` (this round's Δ is in the error buffer), the lone
  /// member steps with its whole error buffer, which is then zero.
  std::optional<CompressedRounds> compressed;
  bool error_has_delta = false;
  /// replay: the deltas, oldest first, applied with `diloco`; `hash` is φ's hash before them
  /// (in). On an error `state` is that of the last delta that replayed, unless `damaged`.
  std::vector<std::shared_ptr<const StateBlob>> deltas;
  /// replay (out): a delta's read failed while it was being applied — `state` is changed part
  /// way (`hash` is its hash) and is the state of no round.
  bool damaged = false;
  /// Where the new state's binary form goes (`blob`); nullptr: none is made (the engine serves
  /// no snapshots).
  std::shared_ptr<BlobStore> store;
  Digest hash{};          ///< out: of the new φ
  double norm = 0;        ///< prepare (out)
  double fresh_norm = 0;  ///< prepare with `compressed` (out): ‖Δ‖ of this phase alone
  /// diloco_ring after an E3M0 all-reduce: state.error (over the slice) is already what this
  /// member's encodings left out (gossip/allreduce.hpp), multiplied by `error_scale` once the step
  /// is taken (a residual above its bound: gossip/round.hpp), and emptied when it is not taken
  /// (part of it is other members' values, one of whom sent more than it declared).
  bool error_is_residual = false;
  float error_scale = 1.0f;
  void run();
};

}  // namespace grove::gossip
