#include "gossip/allreduce.hpp"

#include "transport/crypto.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace grove::gossip {

RingTimers ring_timers(const AllReduceOptions& o) {
  return {o.heartbeat, o.chunk_timeout, o.start_grace, o.linger, o.total_timeout};
}

transport::Result<std::unique_ptr<RingAllReduce>> RingAllReduce::create(
    OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input, AllReduceOptions opts,
    Time now, optim::Floats out) {
  using transport::errc;
  if (auto ok = check_group(ring, self, "the all-reduce ring"); !ok) return ok.failure();
  if (opts.chunk_values == 0 || opts.chunk_values % 256 != 0)
    return {errc::rejected, "all-reduce chunk_values must be a positive multiple of 256"};
  if (opts.codec == WireCodec::e3m0 && !opts.residual)
    return {errc::rejected,
            "the all-reduce sums partial results: E3M0 carries them only with error feedback "
            "(residual)"};
  if (opts.residual && !opts.mean)
    return {errc::rejected, "the all-reduce keeps residuals of means only"};
  return std::unique_ptr<RingAllReduce>(
      new RingAllReduce(op, self, std::move(ring), std::move(input), opts, now, std::move(out)));
}

RingAllReduce::RingAllReduce(OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input,
                             AllReduceOptions opts, Time now, optim::Floats out)
    : RingOp("all-reduce", op, self, std::move(ring), opts.codec, ring_timers(opts), now),
      input_(std::move(input)),
      opts_(std::move(opts)),
      n_(input_.size()),
      result_(std::move(out)) {
  scratch_.resize(opts_.chunk_values);
  // The input is not scanned here: every input value passes through exactly one encode (in this
  // member's own segment, or added to a partial sum), which rejects non-finite values, so a bad
  // input fails the op at its first chunk without delaying the first byte of a good one.
  if (result_.size() != n_) result_ = optim::Floats::zeros(n_, opts_.alloc);
  if (opts_.residual) {
    residual_ = optim::Floats::zeros(n_, opts_.alloc);
    decoded_.resize(opts_.chunk_values);
  }
  begin(now);
}

void RingAllReduce::alone(Time) {
  // Nothing encoded: the result is the input exactly and nothing is left out.
  residual_sq_ = 0;
  optim::by_fragments(n_,
                      [&](std::size_t lo, std::size_t hi) {
                        std::copy(input_.begin() + lo, input_.begin() + hi, result_.begin() + lo);
                        if (opts_.residual)
                          std::fill(residual_.begin() + lo, residual_.begin() + hi, 0.0f);
                      },
                      {&input_, &result_, &residual_});
}

void RingAllReduce::start_data(Time now) {
  const std::size_t N = ring_.size();
  reduced_.assign(N, {});
  gathered_.assign(N, {});
  total_chunks_ = 0;
  for (std::size_t s = 0; s < N; ++s) {
    reduced_[s].assign(seg_chunks(s), false);
    gathered_[s].assign(seg_chunks(s), false);
    total_chunks_ += seg_chunks(s);
  }
  final_chunks_ = 0;
  residual_sq_ = 0;
  // Reduce-scatter, hop 1: this member starts the chain of its own segment.
  next_own_ = 0;
  fill_own(now);
  if (total_chunks_ == 0) complete(now);  // an empty tensor
}

void RingAllReduce::fill_own(Time now) {
  const std::size_t b = seg_begin(me_);
  while (!finished() && ring_.size() > 1 && next_own_ < seg_chunks(me_) &&
         in_flight_succ_ < opts_.window) {
    const std::size_t off = next_own_++ * opts_.chunk_values;
    const std::size_t len = std::min(opts_.chunk_values, seg_len(me_) - off);
    send_chunk(Phase::reduce_scatter, me_, next_own_ - 1,
               std::span<const float>(input_).subspan(b + off, len), now);
    input_.release(b + off, b + off + len);
  }
}

void RingAllReduce::send_chunk(Phase ph, std::size_t s, std::size_t c,
                               std::span<const float> values, Time now) {
  Header h = header(MsgKind::chunk);
  h.phase = ph;
  h.index = static_cast<std::uint32_t>(s);
  h.chunk = static_cast<std::uint32_t>(c);
  h.count = values.size();
  std::span<std::uint8_t> payload;
  Bytes msg = encode_message(h, encoded_size(opts_.codec, values.size()), &payload);
  const std::size_t at = seg_begin(s) + c * opts_.chunk_values;
  if (encode_values(opts_.codec, values, payload) != optim::CodecError::ok)
    return fail_encode(at, values.size());
  const bool owned = ph == Phase::all_gather && owner(s) == me_;
  if (owned || opts_.residual) {
    // The owner keeps exactly what it sends, so every member holds the same bits.
    const std::span<float> sent = owned ? std::span<float>(result_).subspan(at, values.size())
                                        : std::span<float>(decoded_.data(), values.size());
    decode_values(opts_.codec, payload, sent);
    if (opts_.residual) {
      // What this encoding left out, in units of the members' inputs (the owner sent the mean).
      const float scale = owned ? static_cast<float>(ring_.size()) : 1.0f;
      float* r = residual_.data() + at;
      for (std::size_t i = 0; i < values.size(); ++i) {
        r[i] = scale * (values[i] - sent[i]);
        residual_sq_ += static_cast<double>(r[i]) * r[i];
      }
      residual_.release(at, at + values.size());
    }
    if (owned) result_.release(at, at + values.size());
  }
  send(succ(), std::move(msg), now);
}

void RingAllReduce::fail_encode(std::size_t at, std::size_t len) {
  if (!optim::all_finite(std::span<const float>(input_).subspan(at, len)))
    return fail("local input is not finite");
  fail("a partial sum is not finite (overflow)");
}

void RingAllReduce::on_data(const NodeId& from, const Message& m, Time now) {
  const std::size_t N = ring_.size();
  const std::size_t s = m.h.index, c = m.h.chunk;
  const auto bad = [&](const char* why) { bad_data(from, why, now); };
  if (from != pred()) return bad("not from the ring predecessor");
  if (s >= N || c >= seg_chunks(s)) return bad("segment or chunk out of range");
  const std::size_t off = c * opts_.chunk_values;
  const std::size_t len = std::min(opts_.chunk_values, seg_len(s) - off);
  if (m.h.count != len || m.h.codec != opts_.codec ||
      m.payload.size() != encoded_size(opts_.codec, len))
    return bad("size or codec mismatch");
  const std::size_t at = seg_begin(s) + off;
  if (m.h.phase == Phase::reduce_scatter) {
    if (s == me_ || reduced_[s][c]) return bad("unexpected reduce-scatter chunk");
    const std::span<float> sum(scratch_.data(), len);
    if (decode_values(opts_.codec, m.payload, sum) != optim::CodecError::ok)
      return bad("undecodable or not finite");
    reduced_[s][c] = true;
    const float* in = input_.data() + at;
    for (std::size_t i = 0; i < len; ++i) sum[i] += in[i];
    input_.release(at, at + len);
    if (owner(s) == me_) {
      const float n = static_cast<float>(N);
      if (opts_.mean)
        for (std::size_t i = 0; i < len; ++i) sum[i] /= n;
      send_chunk(Phase::all_gather, s, c, sum, now);
      if (finished()) return;
      if (++final_chunks_ == total_chunks_) complete(now);
    } else {
      send_chunk(Phase::reduce_scatter, s, c, sum, now);
    }
  } else if (m.h.phase == Phase::all_gather) {
    if (owner(s) == me_ || gathered_[s][c]) return bad("unexpected all-gather chunk");
    if (decode_values(opts_.codec, m.payload, std::span<float>(result_).subspan(at, len)) !=
        optim::CodecError::ok)
      return bad("undecodable or not finite");
    result_.release(at, at + len);
    gathered_[s][c] = true;
    if (owner(s) != (me_ + 1) % N) {  // pass the owner's bytes on unchanged
      std::span<std::uint8_t> payload;
      Bytes fwd = encode_message(m.h, m.payload.size(), &payload);
      std::memcpy(payload.data(), m.payload.data(), m.payload.size());
      send(succ(), std::move(fwd), now);
    }
    if (++final_chunks_ == total_chunks_) complete(now);
  } else {
    return bad("wrong phase");
  }
}

}  // namespace grove::gossip
