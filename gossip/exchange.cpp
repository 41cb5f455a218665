#include "gossip/exchange.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace grove::gossip {

namespace {
// The L2 norm (in double: finite exactly when every value is), a fragment at a time.
double norm(const optim::Floats& v) {
  double sq = 0;
  optim::by_fragments(v.size(),
                      [&](std::size_t lo, std::size_t hi) {
                        const double n = optim::l2_norm(v.data() + lo, hi - lo);
                        sq += n * n;
                      },
                      {&v});
  return std::sqrt(sq);
}
}  // namespace

transport::Result<std::unique_ptr<GroupExchange>> GroupExchange::create(
    OpId op, NodeId self, std::vector<NodeId> group, std::vector<std::vector<float>> tensors,
    ExchangeOptions opts, Time now) {
  std::vector<optim::Floats> f;
  for (auto& t : tensors) f.emplace_back(std::move(t));
  return create(op, self, std::move(group), std::move(f), std::move(opts), now);
}

transport::Result<std::unique_ptr<GroupExchange>> GroupExchange::create(
    OpId op, NodeId self, std::vector<NodeId> group, std::vector<optim::Floats> tensors,
    ExchangeOptions opts, Time now) {
  using transport::errc;
  if (auto ok = check_group(group, self, "the exchange group"); !ok) return ok.failure();
  if (opts.chunk_values == 0 || opts.chunk_values % 256 != 0)
    return {errc::rejected, "exchange chunk_values must be a positive multiple of 256"};
  if (tensors.empty()) return {errc::rejected, "an exchange needs at least one tensor"};
  return std::unique_ptr<GroupExchange>(
      new GroupExchange(op, self, std::move(group), std::move(tensors), std::move(opts), now));
}

GroupExchange::GroupExchange(OpId op, NodeId self, std::vector<NodeId> group,
                             std::vector<optim::Floats> tensors, ExchangeOptions opts, Time now)
    : op_(op), self_(self), own_(std::move(tensors)), opts_(std::move(opts)), started_(now) {
  for (const auto& id : group)  // (checked by create())
    if (id != self_) peers_.emplace(id, Incoming{});
  // One pass per tensor before the first byte goes out: the norm (computed in double, so it is
  // finite exactly when every value is) doubles as the finiteness check.
  for (const auto& t : own_) own_norm_.push_back(norm(t));
  for (auto& [id, in] : peers_) {
    in.last_heard = now;
    in.last_sent = now;
  }
  for (const double nrm : own_norm_)
    if (!std::isfinite(nrm)) {
      spdlog::warn("exchange: local tensor is not finite; local-only round");
      for (auto& [id, in] : peers_) in.state = Incoming::failed, in.why = "local tensor not finite";
      finished_ = true;
      mean_ = std::move(own_);
      return;
    }
  for (auto& [id, in] : peers_) {
    in.out.last_left = now;
    fill(id, in, now);
  }
  maybe_finish();
}

void GroupExchange::fill(const NodeId& to, Incoming& in, Time now) {
  auto& s = in.out;
  while (!s.done && s.in_flight < opts_.window) {
    auto& tensor = own_[s.tensor];
    const std::size_t n = tensor.size();
    const std::size_t chunks = (n + opts_.chunk_values - 1) / opts_.chunk_values;
    if (!s.begun) {
      send(to, encode_message(tensor_header(MsgKind::tensor_begin, s.tensor, chunks, n), 0), now);
      s.begun = true;
      s.chunk = 0;
      s.hasher.emplace();
    } else if (s.chunk < chunks) {
      const std::size_t off = s.chunk * opts_.chunk_values;
      const std::size_t len = std::min(opts_.chunk_values, n - off);
      std::span<std::uint8_t> payload;
      Bytes b = encode_message(tensor_header(MsgKind::chunk, s.tensor, s.chunk, len),
                               encoded_size(opts_.codec, len), &payload);
      // (Every value is finite: the norm said so.)
      encode_values(opts_.codec, std::span<const float>(tensor).subspan(off, len), payload);
      tensor.release(off, off + len);
      s.hasher->update(payload);
      send(to, std::move(b), now);
      ++s.chunk;
    } else {
      Header e = tensor_header(MsgKind::tensor_end, s.tensor, chunks, n);
      e.digest = s.hasher->final();
      s.hasher.reset();
      send(to, encode_message(e, 0), now);
      s.begun = false;
      s.done = ++s.tensor == own_.size();
    }
  }
}

void GroupExchange::stop_sending(Incoming& in) {
  in.out.done = true;
  in.out.hasher.reset();
}

void GroupExchange::on_delivered(const NodeId& to, Time now) {
  auto it = peers_.find(to);
  if (finished_ || it == peers_.end()) return;
  auto& s = it->second.out;
  if (s.in_flight > 0) --s.in_flight;
  s.last_left = now;
  fill(to, it->second, now);
  maybe_finish();
}

Header GroupExchange::tensor_header(MsgKind kind, std::size_t tensor, std::size_t chunk,
                                    std::size_t count) const {
  Header h;
  h.kind = kind;
  h.op = op_;
  h.phase = Phase::tensor;
  h.index = static_cast<std::uint32_t>(tensor);
  h.chunk = static_cast<std::uint32_t>(chunk);
  h.count = count;
  h.codec = opts_.codec;
  return h;
}

void GroupExchange::send(const NodeId& to, Bytes b, Time now) {
  bytes_sent_ += b.size();
  auto& in = peers_[to];
  in.last_sent = now;
  ++in.out.in_flight;
  out_.push_back({to, std::move(b)});
}

void GroupExchange::drop(const NodeId& peer, Incoming& in, std::string why) {
  if (in.state != Incoming::receiving) return;
  spdlog::warn("exchange: dropping partner {}: {}", dht::short_hex(peer), why);
  in.state = Incoming::failed;
  in.why = std::move(why);
  in.staged.clear();
  in.staged.shrink_to_fit();
  stop_sending(in);
  maybe_finish();
}

void GroupExchange::on_message(const NodeId& from, const Message& m, Time now) {
  auto it = peers_.find(from);
  if (finished_ || it == peers_.end() || m.h.op != op_) return;
  Incoming& in = it->second;
  if (in.state != Incoming::receiving) return;
  in.last_heard = now;
  bytes_received_ += m.payload.size();
  switch (m.h.kind) {
    case MsgKind::heartbeat:
      return;
    case MsgKind::tensor_begin: {
      if (in.begun || m.h.index != in.tensor || m.h.index >= own_.size())
        return drop(from, in, "tensor_begin out of order");
      const std::size_t n = own_[in.tensor].size();
      if (m.h.count != n || m.h.codec != opts_.codec ||
          m.h.chunk != (n + opts_.chunk_values - 1) / opts_.chunk_values)
        return drop(from, in, "tensor size, chunking or codec differs from ours");
      in.begun = true;
      in.next = 0;
      in.chunks = m.h.chunk;
      in.digest = m.h.digest;
      in.hasher.emplace();
      if (in.staged.empty()) in.staged.resize(own_.size());
      in.staged[in.tensor] = optim::Floats::zeros(n, opts_.alloc);
      return;
    }
    case MsgKind::chunk:
      return on_chunk(from, in, m);
    case MsgKind::tensor_end:
      if (!in.begun || m.h.index != in.tensor || in.next != in.chunks)
        return drop(from, in, "tensor_end out of order");
      in.digest = m.h.digest;
      return check_complete(from, in);
    default:
      return drop(from, in, std::string("unexpected ") + to_string(m.h.kind));
  }
}

void GroupExchange::on_chunk(const NodeId& from, Incoming& in, const Message& m) {
  if (!in.begun || m.h.phase != Phase::tensor || m.h.index != in.tensor || m.h.chunk != in.next ||
      in.next >= in.chunks)
    return drop(from, in, "chunk out of order");
  const std::size_t n = own_[in.tensor].size();
  const std::size_t off = in.next * opts_.chunk_values;
  const std::size_t len = std::min(opts_.chunk_values, n - off);
  if (m.h.count != len || m.h.codec != opts_.codec ||
      m.payload.size() != encoded_size(opts_.codec, len))
    return drop(from, in, "chunk size or codec mismatch");
  auto& staged = in.staged[in.tensor];
  if (decode_values(opts_.codec, m.payload, std::span<float>(staged).subspan(off, len)) !=
      optim::CodecError::ok)
    return drop(from, in, "chunk undecodable or not finite");
  staged.release(off, off + len);
  in.hasher->update(m.payload);
  ++in.next;
}

void GroupExchange::check_complete(const NodeId& from, Incoming& in) {
  if (in.hasher->final() != in.digest) return drop(from, in, "tensor digest mismatch");
  const auto& got = in.staged[in.tensor];
  const double mine =
      opts_.bound_by_first ? std::max(own_norm_[in.tensor], own_norm_[0]) : own_norm_[in.tensor];
  const double theirs = norm(got);
  if (!(theirs <= opts_.max_norm_ratio * mine + 1e-6))
    return drop(from, in,
                "tensor norm " + std::to_string(theirs) + " beyond the bound (ours " +
                    std::to_string(mine) + ")");
  in.begun = false;
  in.hasher.reset();
  if (++in.tensor < own_.size()) return;
  in.state = Incoming::complete;
  maybe_finish();
}

void GroupExchange::maybe_finish() {
  if (finished_) return;
  for (const auto& [id, in] : peers_)
    if (in.state == Incoming::receiving || (in.state == Incoming::complete && !in.out.done)) return;
  finished_ = true;
  // Mean over ours and the completed partners', summed in member-id order (deterministic), in
  // place in our own tensors (no longer needed once finished).
  mean_ = std::move(own_);
  std::vector<const Incoming*> done;
  for (const auto& [id, in] : peers_)
    if (in.state == Incoming::complete) done.push_back(&in);
  if (!done.empty()) {
    const float count = static_cast<float>(done.size() + 1);
    for (std::size_t t = 0; t < mean_.size(); ++t) {
      float* dst = mean_[t].data();
      std::vector<const optim::Floats*> arrays{&mean_[t]};
      for (const Incoming* in : done) arrays.push_back(&in->staged[t]);
      // A fragment at a time: the sum in partner order, then the division (as a whole pass did).
      for (std::size_t lo = 0; lo < mean_[t].size(); lo += optim::kFragment) {
        const std::size_t hi = std::min(mean_[t].size(), lo + optim::kFragment);
        for (const Incoming* in : done) {
          const float* src = in->staged[t].data();
          for (std::size_t i = lo; i < hi; ++i) dst[i] += src[i];
        }
        for (std::size_t i = lo; i < hi; ++i) dst[i] /= count;
        for (const auto* a : arrays) a->release(lo, hi);
      }
    }
  }
  for (auto& [id, in] : peers_) {
    in.staged.clear();
    in.staged.shrink_to_fit();
  }
}

void GroupExchange::on_peer_failed(const NodeId& peer, Time) {
  auto it = peers_.find(peer);
  if (finished_ || it == peers_.end()) return;
  if (it->second.state == Incoming::complete) {  // its tensors are in: it just misses ours
    stop_sending(it->second);
    return maybe_finish();
  }
  drop(peer, it->second, "unreachable");
}

void GroupExchange::on_timer(Time now) {
  if (finished_) return;
  if (now - started_ >= opts_.total_timeout) {
    for (auto& [id, in] : peers_)
      if (in.state == Incoming::receiving) drop(id, in, "exchange timed out");
    return;
  }
  for (auto& [id, in] : peers_) {
    if (finished_) return;
    if (in.state == Incoming::receiving && now - in.last_heard >= opts_.chunk_timeout) {
      drop(id, in, "silent past the chunk timeout");
      continue;
    }
    if (!in.out.done && in.out.in_flight > 0 && now - in.out.last_left >= opts_.chunk_timeout) {
      if (in.state == Incoming::receiving) {
        drop(id, in, "took none of our messages for the chunk timeout");
        continue;
      }
      spdlog::warn(
          "exchange: {} took none of our messages for the chunk timeout; its tensors "
          "count, ours reach it only in part",
          dht::short_hex(id));
      stop_sending(in);
      maybe_finish();
      if (finished_) return;
      continue;
    }
    if (now - in.last_sent >= opts_.heartbeat) {
      Header h;
      h.kind = MsgKind::heartbeat;
      h.op = op_;
      send(id, encode_message(h, 0), now);
    }
  }
}

std::optional<Time> GroupExchange::next_deadline() const {
  if (finished_) return std::nullopt;
  Time t = started_ + opts_.total_timeout;
  for (const auto& [id, in] : peers_) {
    t = std::min(t, in.last_sent + opts_.heartbeat);
    if (in.state == Incoming::receiving) t = std::min(t, in.last_heard + opts_.chunk_timeout);
    if (!in.out.done && in.out.in_flight > 0)
      t = std::min(t, in.out.last_left + opts_.chunk_timeout);
  }
  return t;
}

std::vector<Outgoing> GroupExchange::take_outgoing() {
  return std::exchange(out_, {});
}

std::vector<NodeId> GroupExchange::completed() const {
  std::vector<NodeId> r;
  for (const auto& [id, in] : peers_)
    if (in.state == Incoming::complete) r.push_back(id);
  return r;
}

std::map<NodeId, std::string> GroupExchange::failures() const {
  std::map<NodeId, std::string> r;
  for (const auto& [id, in] : peers_)
    if (in.state == Incoming::failed) r[id] = in.why;
  return r;
}

}  // namespace grove::gossip
