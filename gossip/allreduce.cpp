#include "gossip/allreduce.hpp"

#include "transport/crypto.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace grove::gossip {

transport::Result<void> check_group(const std::vector<NodeId>& group, const NodeId& self,
                                    const char* what) {
  if (std::find(group.begin(), group.end(), self) == group.end())
    return {transport::errc::rejected, std::string(what) + " does not contain this node"};
  auto sorted = group;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return {transport::errc::rejected, std::string(what) + " lists a member twice"};
  return {};
}

const char* to_string(OpStatus s) {
  switch (s) {
    case OpStatus::running:
      return "running";
    case OpStatus::done:
      return "done";
    case OpStatus::failed:
      return "failed";
  }
  return "?";
}

namespace {
// The attempt tag: the first 8 bytes of BLAKE2b-256 over the sorted suspect ids (0 for the
// first attempt).
std::uint64_t tag_of(const std::set<NodeId>& suspects) {
  if (suspects.empty()) return 0;
  transport::Blake2b256 h;
  for (const auto& id : suspects) h.update(id);
  const auto d = h.final();
  std::uint64_t t = 0;
  std::memcpy(&t, d.data(), sizeof t);
  return t | 1;  // never 0
}

}  // namespace

transport::Result<std::unique_ptr<RingAllReduce>> RingAllReduce::create(
    OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input, AllReduceOptions opts,
    Time now, optim::Floats out) {
  using transport::errc;
  if (auto ok = check_group(ring, self, "the all-reduce ring"); !ok) return ok.failure();
  if (opts.chunk_values == 0 || opts.chunk_values % 256 != 0)
    return {errc::rejected, "all-reduce chunk_values must be a positive multiple of 256"};
  if (opts.codec == WireCodec::e3m0)
    return {errc::rejected, "the all-reduce sums partial results: E3M0 cannot carry them"};
  return std::unique_ptr<RingAllReduce>(
      new RingAllReduce(op, self, std::move(ring), std::move(input), opts, now, std::move(out)));
}

RingAllReduce::RingAllReduce(OpId op, NodeId self, std::vector<NodeId> ring, optim::Floats input,
                             AllReduceOptions opts, Time now, optim::Floats out)
    : op_(op),
      self_(self),
      original_(std::move(ring)),
      input_(std::move(input)),
      opts_(std::move(opts)),
      n_(input_.size()),
      started_(now),
      result_(std::move(out)) {
  original_sorted_ = original_;  // (checked by create())
  std::sort(original_sorted_.begin(), original_sorted_.end());
  scratch_.resize(opts_.chunk_values);
  // The input is not scanned here: every input value passes through exactly one encode (in this
  // member's own segment, or added to a partial sum), which rejects non-finite values, so a bad
  // input fails the op at its first chunk without delaying the first byte of a good one.
  if (result_.size() != n_) result_ = optim::Floats::zeros(n_, opts_.alloc);
  start_attempt(now);
}

Header RingAllReduce::header(MsgKind k) const {
  Header h;
  h.kind = k;
  h.op = op_;
  h.tag = tag_;
  h.codec = opts_.codec;
  return h;
}

void RingAllReduce::send(const NodeId& to, Bytes b, Time now) {
  stats_.bytes_sent += b.size();
  if (to == succ()) {
    last_sent_succ_ = now;
    ++in_flight_succ_;
  }
  out_.push_back({to, std::move(b)});
}

void RingAllReduce::start_attempt(Time now) {
  ring_.clear();
  for (const auto& id : original_)
    if (!suspects_.count(id)) ring_.push_back(id);
  me_ = static_cast<std::size_t>(std::find(ring_.begin(), ring_.end(), self_) - ring_.begin());
  ring_sorted_ = ring_;
  std::sort(ring_sorted_.begin(), ring_sorted_.end());
  tag_ = tag_of(suspects_);
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
  done_from_.clear();
  lost_.clear();
  settled_ = 0;
  complete_ = false;
  last_heard_pred_ = now;
  last_sent_succ_ = now;
  if (original_.size() > 2 && 2 * N <= original_.size() && N > 1) {
    // Half the group or more is gone. Members whose views of the group differ suspect each
    // other in turn; only a strict majority may end the round, so two halves never both do
    // (each with its own slow weights). A member left in a minority fails and re-syncs.
    return fail("only " + std::to_string(N) + " of the group's " +
                std::to_string(original_.size()) + " members are left (not a majority)");
  }
  if (N == 1) {
    // Alone. Out of a pair, the partner died: the mean of one is ours. Out of three or more,
    // losing every other member says more about our own links than theirs: fail, so that the
    // node re-syncs its state instead of going on with weights nobody else has.
    if (original_.size() > 2) return fail("lost every other member (isolated?)");
    optim::by_fragments(n_,
                        [&](std::size_t lo, std::size_t hi) {
                          std::copy(input_.begin() + lo, input_.begin() + hi, result_.begin() + lo);
                        },
                        {&input_, &result_});
    complete(now);
    return;
  }
  // Reduce-scatter, hop 1: this member starts the chain of its own segment.
  next_own_ = 0;
  in_flight_succ_ = 0;
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

void RingAllReduce::on_delivered(const NodeId& to, Time now) {
  if (finished() || ring_.size() < 2 || to != succ()) return;
  if (in_flight_succ_ > 0) --in_flight_succ_;
  fill_own(now);
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
  if (ph == Phase::all_gather && owner(s) == me_) {
    // The owner keeps exactly what it sends, so every member holds the same bits.
    decode_values(opts_.codec, payload, std::span<float>(result_).subspan(at, values.size()));
    result_.release(at, at + values.size());
  }
  send(succ(), std::move(msg), now);
}

void RingAllReduce::fail_encode(std::size_t at, std::size_t len) {
  if (!optim::all_finite(std::span<const float>(input_).subspan(at, len)))
    return fail("local input is not finite");
  fail("a partial sum is not finite (overflow)");
}

void RingAllReduce::on_message(const NodeId& from, const Message& m, Time now) {
  if (finished() || m.h.op != op_) return;
  if (!has(original_sorted_, from)) return;
  if (m.h.kind == MsgKind::abort) {
    if (std::find(m.h.suspects.begin(), m.h.suspects.end(), self_) != m.h.suspects.end()) {
      fail("excluded from the all-reduce by " + dht::short_hex(from));
      return;
    }
    std::set<NodeId> fresh;
    for (const auto& id : m.h.suspects)
      if (!suspects_.count(id) && has(original_sorted_, id)) fresh.insert(id);
    if (!fresh.empty()) suspect(fresh, now, "abort from a peer");
    return;
  }
  if (m.h.tag != tag_) return;  // another attempt's message
  if (!has(ring_sorted_, from)) return;
  stats_.bytes_received += m.payload.size();
  if (from == pred()) {
    last_heard_pred_ = now;
    heard_pred_ = true;
  }
  switch (m.h.kind) {
    case MsgKind::heartbeat:
      break;
    case MsgKind::done:
      if (from != self_) settle(from);
      done_from_.insert(from);
      maybe_done();
      break;
    case MsgKind::chunk:
      on_chunk(from, m, now);
      break;
    default:
      spdlog::warn("all-reduce: unexpected {} from {}", to_string(m.h.kind), dht::short_hex(from));
      break;
  }
}

void RingAllReduce::on_chunk(const NodeId& from, const Message& m, Time now) {
  const std::size_t N = ring_.size();
  const std::size_t s = m.h.index, c = m.h.chunk;
  const auto bad = [&](const char* why) {
    spdlog::warn("all-reduce: bad chunk from {} ({}); suspecting it", dht::short_hex(from), why);
    suspect({from}, now, "bad chunk");
  };
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

void RingAllReduce::complete(Time now) {
  complete_ = true;
  completed_at_ = now;
  for (const auto& id : ring_)
    if (id != self_) send(id, encode_message(header(MsgKind::done), 0), now);
  maybe_done();
}

void RingAllReduce::maybe_done() {
  if (!complete_ || finished()) return;
  if (settled_ + 1 < ring_.size()) return;  // a member's done (or loss) is still missing
  status_ = OpStatus::done;
}

void RingAllReduce::suspect(const std::set<NodeId>& ids, Time now, const char* why) {
  bool grew = false;
  for (const auto& id : ids)
    if (id != self_ && suspects_.insert(id).second) grew = true;
  if (!grew) return;
  std::string names;
  for (const auto& id : ids) {
    if (!names.empty()) names += ',';
    names += dht::short_hex(id);
  }
  spdlog::warn("all-reduce {}: suspecting {} ({}); retrying among {} members at t={}",
               transport::to_hex(self_).substr(0, 4), names, why,
               original_.size() - suspects_.size(), now.count());
  ++stats_.attempts;
  Header h = header(MsgKind::abort);
  h.suspects.assign(suspects_.begin(), suspects_.end());
  for (const auto& id : original_)
    if (id != self_ && !suspects_.count(id)) out_.push_back({id, encode_message(h, 0)});
  start_attempt(now);
}

void RingAllReduce::on_peer_failed(const NodeId& peer, Time now) {
  if (finished() || peer == self_) return;
  if (!has(ring_sorted_, peer)) return;
  if (complete_) {
    // We have the result. If a member that has not finished needed this peer, it will say so
    // with an abort; otherwise nothing was lost. Stop waiting for the peer's done.
    settle(peer);
    lost_.insert(peer);
    maybe_done();
    return;
  }
  suspect({peer}, now, "unreachable");
}

void RingAllReduce::on_timer(Time now) {
  if (finished()) return;
  if (now - started_ >= opts_.total_timeout) return fail("timed out");
  if (ring_.size() < 2) return;
  if (complete_ && now - completed_at_ >= opts_.linger) {
    status_ = OpStatus::done;
    return;
  }
  if (!complete_ && now - last_heard_pred_ >= silence_bound()) {
    suspect({pred()}, now, "silent past the chunk timeout");
    if (finished()) return;
  }
  if (now - last_sent_succ_ >= opts_.heartbeat)
    send(succ(), encode_message(header(MsgKind::heartbeat), 0), now);
}

std::optional<Time> RingAllReduce::next_deadline() const {
  if (finished()) return std::nullopt;
  Time t = started_ + opts_.total_timeout;
  if (ring_.size() >= 2) {
    t = std::min(t, last_sent_succ_ + opts_.heartbeat);
    if (complete_)
      t = std::min(t, completed_at_ + opts_.linger);
    else
      t = std::min(t, last_heard_pred_ + silence_bound());
  }
  return t;
}

std::vector<Outgoing> RingAllReduce::take_outgoing() {
  return std::exchange(out_, {});
}

void RingAllReduce::fail(std::string why) {
  spdlog::warn("all-reduce failed: {}", why);
  status_ = OpStatus::failed;
  failure_ = std::move(why);
}

}  // namespace grove::gossip
