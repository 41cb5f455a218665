// Group exchange for NoLoCo: every member of a small group (a pair, or three for an odd node)
// sends its tensors to every other member and averages what it receives with its own.
//
// The steps, per partner:
//  1. The sender streams each tensor: `tensor_begin` (tensor index, values, chunk count), the
//     chunks of `chunk_values` values in order, each encoded with the configured codec as it is
//     sent, then `tensor_end` with the BLAKE2b-256 of the whole encoding. It keeps at most
//     `window` messages per partner queued ahead of the link (Protocol::on_delivered), so the
//     encoded tensor never exists whole.
//  2. The receiver decodes each chunk into a staging buffer and hashes the bytes as they come
//     (in a pair, the staged chunk is the mean of the partner's and ours at once: the last byte
//     ends the exchange without a pass over the model).
//     At `tensor_end` it compares the digests and checks the tensor (finite values come from the
//     decoder; the norm must stay within `max_norm_ratio` of ours). Once every tensor has passed,
//     the partner counts.
//  3. A partner that fails (a send failure, a lost connection, nothing received for
//     `chunk_timeout`, a malformed message, a digest or norm mismatch) is dropped: nothing of
//     its partial tensors is used. A partner whose tensors are in but that takes none of ours for
//     `chunk_timeout` is left alone (its tensors still count).
//  4. The exchange finishes when every partner has either completed or failed and ours have
//     gone to every partner still taking them; the result per tensor is the mean of ours and the
//     completed partners' (ours alone: a local-only round).
// Members need not agree on the outcome (NoLoCo tolerates a one-sided average); each member's
// result only ever mixes whole, verified tensors. Every pass over a tensor (encoding, decoding,
// the mean) goes a chunk or a fragment at a time and releases what it touched, so tensors in
// the node's pages (optim/floats.hpp) never become resident whole; the norms and the finite
// check ride on the encoding and decoding, so that the first byte leaves at once (a value of
// ours that is not finite stops the exchange: an `abort` to the partners, a local-only round).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "gossip/allreduce.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

struct ExchangeOptions {
  WireCodec codec = WireCodec::fp16;
  std::size_t chunk_values = std::size_t{1} << 18;  ///< multiple of 256
  Time heartbeat{1000};
  Time chunk_timeout{10000};
  /// More time for a partner not heard from yet: it may still be making the tensors it sends
  /// (the round engine gives twice the time its own took, plus a window).
  Time start_grace{0};
  Time total_timeout{300000};
  double max_norm_ratio = 4.0;  ///< a received tensor's L2 norm must be <= this × ours (+ eps)
  /// The bound of every tensor takes the larger of our norm of it and of our first tensor: NoLoCo's
  /// Nesterov rule sends its proposal P (φ's scale) then its momentum m', which is near zero on a
  /// member that was alone or has just joined and must not make it refuse every partner.
  bool bound_by_first = false;
  /// Messages per partner made ahead of the link: enough to keep the driver's streams busy
  /// (gossip::RuntimeOptions::streams_per_peer, 16), and what bounds the encoded bytes in memory
  /// (32 × 512 KiB for fp16 chunks of 2^18 values).
  std::size_t window = 32;
  /// Where partners' decoded tensors are staged (none: the heap; the node pages them).
  optim::FloatAllocator alloc;
};

class GroupExchange final : public Protocol {
 public:
  /// `group` contains `self`; `tensors` are this member's tensors (e.g. θ, or Δ and φ), the
  /// same count and sizes on every member. A group without self, with a member twice, no tensor
  /// or bad options give errc::rejected and the reason.
  static transport::Result<std::unique_ptr<GroupExchange>> create(
      OpId op, NodeId self, std::vector<NodeId> group, std::vector<optim::Floats> tensors,
      ExchangeOptions opts, Time now);
  static transport::Result<std::unique_ptr<GroupExchange>> create(
      OpId op, NodeId self, std::vector<NodeId> group, std::vector<std::vector<float>> tensors,
      ExchangeOptions opts, Time now);

  const OpId& op() const override { return op_; }
  void on_message(const NodeId& from, const Message& m, Time now) override;
  void on_peer_failed(const NodeId& peer, Time now) override;
  void on_delivered(const NodeId& to, Time now) override;
  void on_timer(Time now) override;
  std::optional<Time> next_deadline() const override;
  std::vector<Outgoing> take_outgoing() override;
  bool finished() const override { return finished_; }

  /// Per tensor: the mean of ours and every completed partner's (valid once finished()).
  const std::vector<optim::Floats>& mean() const { return mean_; }
  /// Moves the mean out (for reuse of its buffers once it has been applied).
  std::vector<optim::Floats> take_mean() { return std::move(mean_); }
  /// The mean was made as the chunks arrived (a pair, or a group whose partners all completed):
  /// no pass over the model after the last byte.
  bool mean_streamed() const { return mean_streamed_; }
  /// The partners whose tensors were used.
  std::vector<NodeId> completed() const;
  /// Partners that failed, with the reason.
  std::map<NodeId, std::string> failures() const;
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  const ExchangeOptions& options() const { return opts_; }
  std::uint64_t bytes_received() const { return bytes_received_; }

 private:
  GroupExchange(OpId op, NodeId self, std::vector<NodeId> group, std::vector<optim::Floats> tensors,
                ExchangeOptions opts, Time now);
  struct Incoming {
    std::size_t tensor = 0;  // the tensor being received
    std::size_t next = 0;    // its next chunk
    bool begun = false;      // tensor_begin seen for `tensor`
    bool heard = false;      // a message of the partner came (its start grace is over)
    std::uint64_t chunks = 0;
    Digest digest{};
    std::optional<transport::Blake2b256> hasher;
    double sq = 0;  // the squares of the current tensor's values so far (its norm at the end)
    std::vector<optim::Floats> staged;
    Time last_heard{0};
    Time last_sent{0};
    enum { receiving, complete, failed } state = receiving;
    std::string why;
    // Our tensors to this partner: the next message to make, and the messages not yet left.
    struct Sending {
      std::size_t tensor = 0, chunk = 0;
      bool begun = false, done = false;
      std::optional<transport::Blake2b256> hasher;
      std::size_t in_flight = 0;
      Time last_left{0};
    } out;
  };

  void drop(const NodeId& peer, Incoming& in, std::string why);
  /// How long the partner may stay silent (or take none of our messages): the chunk timeout,
  /// plus the start grace until it is heard from.
  Time silence(const Incoming& in) const;
  std::size_t chunks_of(std::size_t tensor) const;
  /// Chunk `chunk` of tensor `tensor` counted over all our tensors in order.
  std::size_t position(std::size_t tensor, std::size_t chunk) const;
  /// In a pair, how many chunks our stream and the partner's may be apart with our chunks
  /// between them kept in memory for the mean (64 MiB of float32 at the default chunk size).
  static constexpr std::size_t kFoldLead = 64;
  /// Checks chunk `chunk` of our tensor (finite) and adds it to our norm unless a stream to
  /// another partner did; false: not finite.
  bool check_own(std::size_t tensor, std::size_t chunk);
  /// Our tensor's L2 norm, reading the chunks no stream has encoded yet; nullopt: not finite.
  std::optional<double> own_norm(std::size_t tensor);
  /// A value of ours is not finite: tells the partners, fails them all, finishes local-only.
  void abort_local(Time now);
  void on_chunk(const NodeId& from, Incoming& in, const Message& m);
  void check_complete(const NodeId& from, Incoming& in, Time now);
  void maybe_finish();
  /// Makes the next messages of our tensors for `to`, up to the window.
  void fill(const NodeId& to, Incoming& in, Time now);
  void stop_sending(Incoming& in);
  void send(const NodeId& to, Bytes b, Time now);
  /// tensor_begin: chunk = number of chunks, count = values; chunk: its number and values.
  Header tensor_header(MsgKind kind, std::size_t tensor, std::size_t chunk,
                       std::size_t count) const;

  OpId op_;
  NodeId self_;
  std::vector<optim::Floats> own_;
  // Our norms (the bound's reference), summed a chunk at a time as our tensors are encoded:
  // the squares so far, and how many chunks of each tensor they cover (checked finite).
  std::vector<double> own_sq_;
  std::vector<std::size_t> own_checked_;
  ExchangeOptions opts_;
  Time started_;
  std::map<NodeId, Incoming> peers_;
  std::vector<optim::Floats> mean_;
  // A pair (one partner): its chunks are averaged with ours as they arrive, so that its staged
  // tensors are the mean once they pass (no pass over the model after the last byte); `scratch_`
  // holds one decoded chunk.
  bool fold_ = false;
  std::vector<float> scratch_;
  // More partners (a trio): each chunk's mean goes into `folded_` once every partner's copy of
  // it is in (the same sums in the same order as the pass at the end), so that the last byte
  // ends the exchange here too. The partners' staged tensors and ours stay as they came: a
  // partner that fails drops the folded chunks (folding_ false) and the mean is taken at the end
  // over those that completed, as without folding.
  bool folding_ = false;
  std::vector<optim::Floats> folded_;
  std::size_t fold_tensor_ = 0, fold_chunk_ = 0;  // the next chunk to fold
  /// Chunks of ours a partner has sent us so far, counted over all tensors in order.
  std::size_t received(const Incoming& in) const;
  /// Folds every chunk that all partners have sent (a trio's running mean).
  void fold_more();
  bool finished_ = false;
  bool mean_streamed_ = false;
  std::uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  std::vector<Outgoing> out_;
};

}  // namespace grove::gossip
