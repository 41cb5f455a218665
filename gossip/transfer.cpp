// Transfer (transfer.hpp): one tensor from a sender to a receiver.
#include "gossip/transfer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace grove::gossip {

std::unique_ptr<Transfer> Transfer::send(OpId op, NodeId peer, optim::Floats input,
                                         TransferOptions o, Time now) {
  return std::unique_ptr<Transfer>(new Transfer(true, op, peer, std::move(input), o, now));
}

std::unique_ptr<Transfer> Transfer::receive(OpId op, NodeId peer, optim::Floats out,
                                            TransferOptions o, Time now) {
  return std::unique_ptr<Transfer>(new Transfer(false, op, peer, std::move(out), o, now));
}

Transfer::Transfer(bool sending, OpId op, NodeId peer, optim::Floats values, TransferOptions o,
                   Time now)
    : sending_(sending),
      op_(op),
      peer_(peer),
      values_(std::move(values)),
      o_(o),
      n_(values_.size()),
      end_at_(now + o.total_timeout),
      heard_at_(now),
      said_at_(now) {
  o_.chunk_values = std::max<std::size_t>(1, o_.chunk_values);
  o_.window = std::max<std::size_t>(1, o_.window);
  if (!sending_) post(MsgKind::heartbeat);  // ready
}

void Transfer::post(MsgKind kind, std::uint64_t count, std::uint32_t chunk) {
  Header h;
  h.kind = kind;
  h.op = op_;
  h.phase = Phase::tensor;
  h.count = count;
  h.chunk = chunk;
  out_.push_back({peer_, encode_message(h, 0)});
}

void Transfer::fail(std::string why) {
  if (finished()) return;
  status_ = OpStatus::failed;
  failure_ = std::move(why);
  Header h;
  h.kind = MsgKind::abort;
  h.op = op_;
  out_.push_back({peer_, encode_message(h, 0)});
}

void Transfer::finish() {
  status_ = OpStatus::done;
}

// The sender's next chunks, up to the window (then tensor_end once all have left).
void Transfer::fill(Time now) {
  while (started_ && !finished() && next_ < chunks() && in_flight_ < o_.window) {
    const std::size_t lo = next_ * o_.chunk_values;
    const std::size_t len = std::min(o_.chunk_values, n_ - lo);
    const auto vals = std::span<const float>(values_).subspan(lo, len);
    if (!std::all_of(vals.begin(), vals.end(), [](float v) { return std::isfinite(v); }))
      return fail("the tensor sent holds a value that is not finite (NaN or Inf)");
    Header h;
    h.kind = MsgKind::chunk;
    h.op = op_;
    h.phase = Phase::tensor;
    h.chunk = static_cast<std::uint32_t>(next_);
    h.count = len;
    h.codec = WireCodec::fp32;
    std::span<std::uint8_t> payload;
    auto bytes = encode_message(h, len * sizeof(float), &payload);
    std::memcpy(payload.data(), vals.data(), payload.size());
    digest_.update(payload);
    bytes_ += bytes.size();
    out_.push_back({peer_, std::move(bytes)});
    values_.release(lo, lo + len);
    ++next_;
    ++in_flight_;
    said_at_ = now;
  }
  if (started_ && !finished() && next_ == chunks() && !end_sent_) {
    Header h;
    h.kind = MsgKind::tensor_end;
    h.op = op_;
    h.phase = Phase::tensor;
    h.digest = digest_.final();
    out_.push_back({peer_, encode_message(h, 0)});
    end_sent_ = true;
    said_at_ = now;
  }
}

void Transfer::on_message(const NodeId& from, const Message& m, Time now) {
  if (finished() || from != peer_) return;
  heard_at_ = now;
  if (m.h.kind == MsgKind::abort)
    return fail(sending_ ? "the receiver refused the tensor (another size than it expects, or "
                           "it gave up)"
                         : "the sender gave up");
  if (sending_) {
    if (m.h.kind == MsgKind::heartbeat && !started_) {
      started_ = true;
      Header h;
      h.kind = MsgKind::tensor_begin;
      h.op = op_;
      h.phase = Phase::tensor;
      h.count = n_;
      h.chunk = static_cast<std::uint32_t>(chunks());
      out_.push_back({peer_, encode_message(h, 0)});
      fill(now);
    } else if (m.h.kind == MsgKind::done && end_sent_) {
      finish();
    }
    return;
  }
  switch (m.h.kind) {
    case MsgKind::tensor_begin:
      if (started_) return fail("the sender began twice");
      if (m.h.count != n_)
        return fail("the sender sends " + std::to_string(m.h.count) + " values, this side " +
                    "expects " + std::to_string(n_));
      started_ = true;
      break;
    case MsgKind::chunk: {
      const std::size_t lo = static_cast<std::size_t>(m.h.chunk) * o_.chunk_values;
      if (!started_ || m.h.chunk != got_ || m.h.codec != WireCodec::fp32 || lo >= n_)
        return fail("a chunk out of order or beyond the tensor");
      const std::size_t len = std::min(o_.chunk_values, n_ - lo);
      if (m.h.count != len || m.payload.size() != len * sizeof(float))
        return fail("a chunk of the wrong size (the sides' chunk sizes differ?)");
      auto dst = std::span<float>(values_).subspan(lo, len);
      std::memcpy(dst.data(), m.payload.data(), m.payload.size());
      if (!std::all_of(dst.begin(), dst.end(), [](float v) { return std::isfinite(v); }))
        return fail("the sender's tensor holds a value that is not finite");
      digest_.update(m.payload);
      bytes_ += m.payload.size();
      values_.release(lo, lo + len);
      ++got_;
      break;
    }
    case MsgKind::tensor_end:
      if (!started_ || got_ != chunks()) return fail("the tensor ended early");
      if (m.h.digest != digest_.final()) return fail("the tensor's digest does not match");
      post(MsgKind::done);
      finish();
      break;
    default:
      break;
  }
}

void Transfer::on_peer_failed(const NodeId& peer, Time) {
  if (peer != peer_ || finished()) return;
  status_ = OpStatus::failed;
  failure_ = "the connection to the other side failed";
}

void Transfer::on_delivered(const NodeId& to, Time now) {
  if (to != peer_ || !sending_ || finished()) return;
  heard_at_ = now;  // (the link moves)
  if (in_flight_ > 0) --in_flight_;
  fill(now);
}

void Transfer::on_timer(Time now) {
  if (finished()) return;
  if (now >= end_at_)
    return fail(started_ ? "the transfer did not end by its deadline"
                         : "the other side did not call within the deadline");
  if (started_ && now >= heard_at_ + o_.chunk_timeout)
    return fail("the other side fell silent for " +
                std::to_string(o_.chunk_timeout.count() / 1000) + " s");
  if (!sending_ && now >= said_at_ + o_.heartbeat) {
    post(MsgKind::heartbeat);  // still ready, still here
    said_at_ = now;
  }
}

std::optional<Time> Transfer::next_deadline() const {
  if (finished()) return std::nullopt;
  Time t = end_at_;
  if (started_) t = std::min(t, heard_at_ + o_.chunk_timeout);
  if (!sending_) t = std::min(t, said_at_ + o_.heartbeat);
  return t;
}

}  // namespace grove::gossip
