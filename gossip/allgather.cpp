#include "gossip/allgather.hpp"

#include <cstring>

#include <spdlog/spdlog.h>

namespace grove::gossip {

using optim::CodecError;

std::size_t GatherCodec::unit() const {
  switch (kind) {
    case WireCodec::e3m0:
      return optim::E3M0Params{}.block;
    case WireCodec::topk:
      return topk.chunk;
    default:
      return 1;
  }
}

bool GatherCodec::valid() const {
  return kind != WireCodec::topk || topk.valid();
}

std::size_t GatherCodec::encoded_size(std::size_t values) const {
  return kind == WireCodec::topk ? topk.encoded_size(values) : gossip::encoded_size(kind, values);
}

CodecError GatherCodec::encode(std::span<const float> in, std::span<std::uint8_t> out,
                               std::vector<float>& scratch) const {
  if (kind != WireCodec::topk) return encode_values(kind, in, out);
  scratch.assign(in.begin(), in.end());
  return topk.encode(scratch, out);
}

CodecError GatherCodec::decode(std::span<const std::uint8_t> in, std::span<float> out) const {
  return kind == WireCodec::topk ? topk.decode(in, out) : decode_values(kind, in, out);
}

CodecError GatherCodec::feedback(std::span<float> e, std::size_t piece_values) const {
  std::vector<std::uint8_t> bytes;
  std::vector<float> decoded;
  for (std::size_t lo = 0; lo < e.size(); lo += piece_values) {
    const auto piece = e.subspan(lo, std::min(piece_values, e.size() - lo));
    bytes.resize(encoded_size(piece.size()));
    if (kind == WireCodec::topk) {  // the codec subtracts what it sends
      if (const auto r = topk.encode(piece, bytes); r != CodecError::ok) return r;
      continue;
    }
    decoded.resize(piece.size());
    if (const auto r = encode_values(kind, piece, bytes); r != CodecError::ok) return r;
    if (const auto r = decode_values(kind, bytes, decoded); r != CodecError::ok) return r;
    for (std::size_t i = 0; i < piece.size(); ++i) piece[i] -= decoded[i];
  }
  return CodecError::ok;
}

transport::Result<std::unique_ptr<RingAllGather>> RingAllGather::create(
    OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input, AllGatherOptions opts,
    Time now, optim::Floats out) {
  using transport::errc;
  if (auto ok = check_group(ring, self, "the all-gather ring"); !ok) return ok.failure();
  if (!opts.codec.valid()) return {errc::rejected, "the all-gather's top-k parameters are invalid"};
  if (opts.piece_values == 0 || opts.piece_values % opts.codec.unit() != 0)
    return {errc::rejected, "all-gather pieces must be a positive multiple of " +
                                std::to_string(opts.codec.unit()) + " values"};
  if (opts.window == 0) return {errc::rejected, "the all-gather's window must be positive"};
  return std::unique_ptr<RingAllGather>(new RingAllGather(
      op, self, std::move(ring), std::move(input), std::move(opts), now, std::move(out)));
}

RingAllGather::RingAllGather(OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input,
                             AllGatherOptions opts, Time now, optim::Floats out)
    : RingOp("all-gather", op, self, std::move(ring), opts.codec.kind, opts.timers, now),
      input_(std::move(input)),
      opts_(std::move(opts)),
      n_(input_.size()),
      result_(std::move(out)) {
  if (result_.size() != n_) result_ = optim::Floats::zeros(n_, opts_.alloc);
  decoded_.resize(std::min(n_, opts_.piece_values));
  begin(now);
}

void RingAllGather::alone(Time) {
  // The mean of one: our own message as the others would have decoded it.
  if (opts_.concat && result_.size() != n_) result_ = optim::Floats::zeros(n_, opts_.alloc);
  std::vector<std::uint8_t> bytes;
  for (std::size_t p = 0; p < pieces() && !finished(); ++p) {
    const std::size_t lo = p * opts_.piece_values, len = piece_len(p);
    bytes.resize(opts_.codec.encoded_size(len));
    const auto out = std::span<float>(result_).subspan(lo, len);
    if (opts_.codec.encode(own(p), bytes, scratch_) != CodecError::ok ||
        opts_.codec.decode(bytes, out) != CodecError::ok)
      fail("local input is not finite");
    input_.release(lo, lo + len);
    result_.release(lo, lo + len);
  }
}

std::span<const float> RingAllGather::own(std::size_t p) {
  const std::size_t lo = p * opts_.piece_values, len = piece_len(p);
  const auto piece = std::span<float>(input_).subspan(lo, len);
  if (opts_.scale == 1.0f) return piece;
  for (; scaled_ <= p; ++scaled_) {
    const auto q =
        std::span<float>(input_).subspan(scaled_ * opts_.piece_values, piece_len(scaled_));
    for (float& v : q) v *= opts_.scale;
  }
  return piece;
}

optim::Floats RingAllGather::take_input() {
  if (opts_.scale != 1.0f && pieces() > 0) {
    own(pieces() - 1);  // the pieces never read: scaled too
    input_.release();
  }
  return std::move(input_);
}

void RingAllGather::start_data(Time now) {
  if (opts_.concat && result_.size() != ring_.size() * n_)
    result_ = optim::Floats::zeros(ring_.size() * n_, opts_.alloc);
  held_.clear();
  held_bytes_ = 0;
  summed_.assign(pieces(), false);
  summed_count_ = 0;
  next_own_ = 0;
  fill_own(now);
  if (pieces() == 0) complete(now);  // an empty tensor
}

void RingAllGather::fill_own(Time now) {
  while (!finished() && ring_.size() > 1 && next_own_ < pieces() &&
         in_flight_succ_ < opts_.window) {
    const std::size_t p = next_own_++, lo = p * opts_.piece_values, len = piece_len(p);
    Header h = header(MsgKind::chunk);
    h.phase = Phase::all_gather;
    h.index = static_cast<std::uint32_t>(me_);
    h.chunk = static_cast<std::uint32_t>(p);
    h.count = len;
    std::span<std::uint8_t> payload;
    Bytes msg = encode_message(h, opts_.codec.encoded_size(len), &payload);
    const auto r = opts_.codec.encode(own(p), payload, scratch_);
    input_.release(lo, lo + len);
    if (r != CodecError::ok) return fail("local input is not finite");
    std::vector<std::uint8_t> own(payload.begin(), payload.end());
    send(succ(), std::move(msg), now);
    hold(p, me_, std::move(own), now);
  }
}

void RingAllGather::on_data(const NodeId& from, const Message& m, Time now) {
  const std::size_t N = ring_.size();
  const std::size_t o = m.h.index, p = m.h.chunk;
  if (from != pred()) return bad_data(from, "not from the ring predecessor", now);
  if (m.h.phase != Phase::all_gather) return bad_data(from, "wrong phase", now);
  if (o >= N || o == me_ || p >= pieces())
    return bad_data(from, "member or piece out of range", now);
  const std::size_t len = piece_len(p);
  if (m.h.count != len || m.h.codec != opts_.codec.kind ||
      m.payload.size() != opts_.codec.encoded_size(len))
    return bad_data(from, "size or codec mismatch", now);
  if (summed_[p]) return bad_data(from, "a piece already summed", now);
  if (auto it = held_.find(p); it != held_.end() && !it->second.from[o].empty())
    return bad_data(from, "a piece twice", now);
  // Checked before it is passed on: a member that sends garbage is the one suspected.
  if (opts_.codec.decode(m.payload, std::span(decoded_).first(len)) != CodecError::ok)
    return bad_data(from, "undecodable or not finite", now);
  if ((me_ + 1) % N != o) {  // pass the sender's bytes on unchanged
    std::span<std::uint8_t> payload;
    Bytes fwd = encode_message(m.h, m.payload.size(), &payload);
    std::memcpy(payload.data(), m.payload.data(), m.payload.size());
    send(succ(), std::move(fwd), now);
  }
  hold(p, o, {m.payload.begin(), m.payload.end()}, now);
}

void RingAllGather::hold(std::size_t p, std::size_t origin, std::vector<std::uint8_t> bytes,
                         Time now) {
  const std::size_t N = ring_.size();
  Held& h = held_[p];
  if (h.from.empty()) h.from.resize(N);
  held_bytes_ += bytes.size();
  peak_held_ = std::max(peak_held_, held_bytes_);
  h.from[origin] = std::move(bytes);
  if (++h.count < N) return;
  const std::size_t lo = p * opts_.piece_values, len = piece_len(p);
  if (opts_.concat) {  // every member's piece p at its place (checked when received)
    bool ok = true;
    for (std::size_t j = 0; j < N && ok; ++j) {
      const auto out = std::span<float>(result_).subspan(j * n_ + lo, len);
      ok = opts_.codec.decode(h.from[j], out) == CodecError::ok;
      result_.release(j * n_ + lo, j * n_ + lo + len);
    }
    for (const auto& b : h.from) held_bytes_ -= b.size();
    held_.erase(p);
    if (!ok) return fail("our own piece " + std::to_string(p) + " does not decode");
    summed_[p] = true;
    if (++summed_count_ == pieces()) complete(now);
    return;
  }
  // Every member's piece p: their sum in ring order, then the mean (the same bits everywhere).
  const auto out = std::span<float>(result_).subspan(lo, len);
  const auto d = std::span(decoded_).first(len);
  bool ok = true;
  for (std::size_t j = 0; j < N && ok; ++j) {
    if (opts_.codec.decode(h.from[j], j == 0 ? out : d) != CodecError::ok) {
      ok = false;  // (checked when received: only our own encoding could fail here)
      break;
    }
    if (j > 0)
      for (std::size_t i = 0; i < len; ++i) out[i] += d[i];
  }
  for (const auto& b : h.from) held_bytes_ -= b.size();
  if (ok) {
    const float n = static_cast<float>(N);
    for (std::size_t i = 0; i < len; ++i) out[i] /= n;
    ok = optim::all_finite(out);
  }
  result_.release(lo, lo + len);
  held_.erase(p);
  if (!ok) return fail("the sum of piece " + std::to_string(p) + " is not finite (overflow)");
  summed_[p] = true;
  if (++summed_count_ == pieces()) complete(now);
}

}  // namespace grove::gossip
