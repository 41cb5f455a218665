// Ring all-gather of each member's compressed tensor, ending with their mean: how a group
// averages what only its sender may encode — SparseLoCo's top-k of its error buffer, or a 4-bit
// (E3M0) pseudo-gradient. A sum of such messages cannot be re-encoded hop by hop as the ring
// all-reduce does with fp16 partial sums: every member's message travels whole, encoded once by
// its sender, and every member decodes the same bytes.
//
// The steps (N members in ring order, member i sends to i+1 and receives from i-1):
//  1. The tensor is cut into pieces of `piece_values` (a multiple of the codec's chunk or block,
//     so that a piece encodes alone). Each member encodes its own pieces a window at a time
//     (Protocol::on_delivered) and sends them to its successor.
//  2. A member checks each piece it receives (sizes, that it decodes, finite) and passes it on
//     unless its successor sent it: after N−1 hops every member holds every member's piece.
//  3. Once a member holds piece p of every member it sums their decodings in ring order (one
//     fixed order, so that every member gets the very same bits), divides by N, and drops the
//     bytes. A piece waits only for the members whose bytes have not arrived yet: what a member
//     holds is bounded by how far the ring's streams run apart, not by the model.
// Faults, attempts, done and linger: RingOp (gossip/ring_op.hpp). A new attempt (without the
// suspects) starts over with the sums of the pieces: the mean is over the members of the attempt
// that completed.
// Bytes each member sends: (N−1) × its message (plus headers), against 2 (N−1)/N × the tensor in
// the ring all-reduce's codec.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "gossip/ring_op.hpp"
#include "optim/codecs.hpp"
#include "optim/floats.hpp"

namespace grove::gossip {

/// How a member's values travel in an all-gather: fp32, fp16, bf16, e3m0 (a 256-value block), or
/// topk (SparseLoCo: `topk`'s chunk, k and value form).
struct GatherCodec {
  WireCodec kind = WireCodec::fp16;
  optim::TopKCodec topk{};

  /// The values a piece must be a multiple of (the codec's chunk or block; 1 for fp32 and the
  /// halves).
  std::size_t unit() const;
  bool valid() const;
  std::size_t encoded_size(std::size_t values) const;
  /// Encodes `in` (unchanged: top-k encodes a copy in `scratch`).
  optim::CodecError encode(std::span<const float> in, std::span<std::uint8_t> out,
                           std::vector<float>& scratch) const;
  /// Decodes `in` to dense values (top-k: zeros where nothing was sent).
  optim::CodecError decode(std::span<const std::uint8_t> in, std::span<float> out) const;
  /// Error feedback: e −= decode(encode(e)), piece by piece of `piece_values` (what this member
  /// sent, taken from what it keeps).
  optim::CodecError feedback(std::span<float> e, std::size_t piece_values) const;
};

struct AllGatherOptions {
  GatherCodec codec;
  std::size_t piece_values = std::size_t{1} << 18;  ///< a multiple of codec.unit()
  RingTimers timers;
  /// Own pieces encoded ahead of the link to the successor.
  std::size_t window = 32;
  /// This member's tensor is multiplied by this (in place, a piece at a time as it is read:
  /// never a pass over the whole tensor at once) before it is encoded.
  float scale = 1.0f;
  /// Where the result goes when no buffer of the right size is passed in (none: the heap).
  optim::FloatAllocator alloc;
  /// The result is every member's decoded tensor, one after the other in ring order (N × n
  /// values for the N members of the attempt that completed), not their mean: grove.all_gather.
  bool concat = false;
};

class RingAllGather final : public RingOp {
 public:
  /// `ring` lists the members in ring order (the same everywhere) and contains `self`; `input`
  /// is this member's tensor (the same size everywhere), read a piece at a time and never
  /// changed; `out`, when of the right size, is where the mean goes (its contents ignored).
  /// A bad ring or bad options give errc::rejected and the reason.
  static transport::Result<std::unique_ptr<RingAllGather>> create(OpId op, NodeId self,
                                                                  std::vector<NodeId> ring,
                                                                  optim::Floats input,
                                                                  AllGatherOptions opts, Time now,
                                                                  optim::Floats out = {});

  /// The mean of the members' decoded tensors, or with `concat` each of them in ring order
  /// (valid when done).
  const optim::Floats& result() const { return result_; }
  optim::Floats take_result() { return std::move(result_); }
  /// The input back (the caller's error buffer, for its feedback), times options().scale.
  optim::Floats take_input();
  const AllGatherOptions& options() const { return opts_; }
  /// The most piece bytes held at once, waiting for other members' pieces (tests, metrics).
  std::size_t peak_held_bytes() const { return peak_held_; }

 private:
  RingAllGather(OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input,
                AllGatherOptions opts, Time now, optim::Floats out);
  std::size_t pieces() const { return (n_ + opts_.piece_values - 1) / opts_.piece_values; }
  std::size_t piece_len(std::size_t p) const {
    return std::min(opts_.piece_values, n_ - p * opts_.piece_values);
  }

  void start_data(Time now) override;
  void alone(Time now) override;
  void on_data(const NodeId& from, const Message& m, Time now) override;
  void on_succ_delivered(Time now) override { fill_own(now); }
  void fill_own(Time now);
  /// This member's piece p, scaled (options().scale) the first time it is read.
  std::span<const float> own(std::size_t p);
  /// Keeps member `origin`'s bytes of piece p; sums the piece once every member's are in.
  void hold(std::size_t p, std::size_t origin, std::vector<std::uint8_t> bytes, Time now);

  struct Held {
    std::vector<std::vector<std::uint8_t>> from;  // by ring position
    std::size_t count = 0;
  };

  optim::Floats input_;
  AllGatherOptions opts_;
  std::size_t n_;
  optim::Floats result_;
  std::map<std::size_t, Held> held_;  // pieces some member's bytes of which are still missing
  std::vector<bool> summed_;
  std::size_t summed_count_ = 0;
  std::size_t next_own_ = 0;
  std::size_t scaled_ = 0;  // own pieces scaled so far (in order; an attempt again reads them)
  std::size_t held_bytes_ = 0, peak_held_ = 0;
  std::vector<float> scratch_, decoded_;
};

}  // namespace grove::gossip
