// Ring all-reduce of one float32 tensor over a group (DiLoCo's averaged pseudo-gradient),
// bandwidth-optimal and pipelined, that survives members dying or hanging.
//
// The steps (N members in ring order, member i sends to i+1 and receives from i-1):
//  1. The tensor is cut into N segments and each segment into chunks of `chunk_values`.
//  2. Reduce-scatter: member s sends its chunks of segment s to s+1; a member that receives a
//     partial sum adds its own values and passes it on; after N-1 hops the segment's owner,
//     member s-1, holds the full sum and divides by N. Chunks move independently, so every
//     link is busy at once.
//  3. All-gather: the owner encodes the mean once, keeps the decoded bytes as its own result
//     and sends the same bytes round the ring (N-2 forwards). Every member ends with the very
//     same bits: the sum is taken in one fixed order and the mean is encoded exactly once.
// With `residual` (E3M0 DiLoCo: 4-bit partial sums) each member also keeps, for every value, what
// its one encoding of it left out: its own value minus what it sent (hop 1), the partial sum it
// made minus what it sent (later hops), N × (mean − what it sent) (the owner). Every member
// encodes each value exactly once an attempt, so the residuals of the members sum to the sum of
// the inputs minus N × the result: added to the members' next inputs (error feedback), nothing
// any encoding dropped is lost, it only arrives a round later. That is what lets a codec as
// coarse as E3M0 carry partial sums: 2 (N−1)/N × 4 bits a value for each member, against the
// all-gather's (N−1) × 4 bits.
//  4. Each member sends `done` to every other member and finishes when it has the done of
//     every member it has not lost (the usual case: one message delay), or `linger` after
//     completing. A member that has completed never starts a retry itself (it has all it needs);
//     it joins one when an abort from a member still waiting arrives.
// Faults, attempts, done and linger: RingOp (gossip/ring_op.hpp).
#pragma once

#include <algorithm>
#include <cmath>

#include <memory>
#include <set>
#include <span>
#include <string>

#include "gossip/ring_op.hpp"
#include "optim/floats.hpp"

namespace grove::gossip {

struct AllReduceOptions {
  WireCodec codec = WireCodec::fp16;
  std::size_t chunk_values = std::size_t{1} << 18;  ///< multiple of 256 (E3M0 blocks)
  Time heartbeat{1000};
  Time chunk_timeout{10000};
  /// Added to chunk_timeout before the first attempt has heard from its predecessor: members
  /// start the op when each has read the window's records, and a busy node later still (a large
  /// model's node); the group should not split over that skew.
  Time start_grace{0};
  /// After completing: how long to wait for every member's done (or an abort) before taking the
  /// result. Keep it above chunk_timeout: a member stuck on a dead peer aborts within that.
  Time linger{12000};
  Time total_timeout{300000};
  /// Messages made ahead of the link to the successor (Protocol::on_delivered): this member's
  /// own chunks start the reduce-scatter a window at a time, so its segment is never encoded
  /// whole.
  std::size_t window = 32;
  /// Where the result goes when no buffer of the right size is passed in (none: the heap; the
  /// node pages it).
  optim::FloatAllocator alloc;
  /// Keep what this member's encodings left out (take_residual()); required for E3M0.
  bool residual = false;
  /// The mean of the members' tensors (DiLoCo, average_gradients), or their sum (grove.all_sum;
  /// not with `residual`).
  bool mean = true;
};

using AllReduceStats = RingStats;

RingTimers ring_timers(const AllReduceOptions& o);

class RingAllReduce final : public RingOp {
 public:
  /// `ring` lists the members in ring order (every member must use the same order) and contains
  /// `self`. `input` is this member's tensor (same size everywhere). A ring without self, with a
  /// member twice (a group read from records) or bad options give errc::rejected and the reason.
  /// `out` is where the result is written: pass the buffer of an earlier op (take_result()) to
  /// reuse its memory; its contents are ignored. Input and result are read and written a chunk
  /// at a time and each chunk is released once done with (paged arrays never become resident
  /// whole).
  static transport::Result<std::unique_ptr<RingAllReduce>> create(OpId op, NodeId self,
                                                                  std::vector<NodeId> ring,
                                                                  optim::Floats input,
                                                                  AllReduceOptions opts, Time now,
                                                                  optim::Floats out = {});

 private:
  RingAllReduce(OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input,
                AllReduceOptions opts, Time now, optim::Floats out);

 public:
  /// The mean over members() (valid when done).
  const optim::Floats& result() const { return result_; }
  /// Moves the result buffer out (for reading, or for the next op to reuse).
  optim::Floats take_result() { return std::move(result_); }
  const AllReduceOptions& options() const { return opts_; }
  /// With options().residual, when done: what this member's encodings left out, value by value
  /// (its next error buffer). Empty without.
  optim::Floats take_residual() { return std::move(residual_); }
  const optim::Floats& residual() const { return residual_; }
  /// ‖the residual‖ (with options().residual, when done).
  double residual_norm() const { return std::sqrt(residual_sq_); }
  /// The input back, unchanged (with residual: the caller's error buffer, when the op failed).
  optim::Floats take_input() { return std::move(input_); }

 private:
  std::size_t seg_begin(std::size_t s) const { return s * n_ / ring_.size(); }
  std::size_t seg_len(std::size_t s) const { return seg_begin(s + 1) - seg_begin(s); }
  std::size_t seg_chunks(std::size_t s) const {
    return (seg_len(s) + opts_.chunk_values - 1) / opts_.chunk_values;
  }
  std::size_t owner(std::size_t s) const { return (s + ring_.size() - 1) % ring_.size(); }

  void start_data(Time now) override;
  void alone(Time now) override;
  void on_data(const NodeId& from, const Message& m, Time now) override;
  void on_succ_delivered(Time now) override { fill_own(now); }
  /// Sends this member's next own reduce-scatter chunks, up to the window.
  void fill_own(Time now);
  void send_chunk(Phase ph, std::size_t s, std::size_t c, std::span<const float> values, Time now);
  void fail_encode(std::size_t at, std::size_t len);

  optim::Floats input_;
  AllReduceOptions opts_;
  std::size_t n_;
  // Every value is written by the all-gather before it is read.
  optim::Floats result_;
  optim::Floats residual_;  // with opts_.residual: every value written once an attempt
  double residual_sq_ = 0;  // its squared norm over the attempt
  std::vector<std::vector<bool>> reduced_, gathered_;  // per segment, per chunk: seen
  std::size_t final_chunks_ = 0, total_chunks_ = 0;
  std::size_t next_own_ = 0;  // this member's next own chunk to send (reduce-scatter hop 1)
  std::vector<float> scratch_, decoded_;
};

}  // namespace grove::gossip
