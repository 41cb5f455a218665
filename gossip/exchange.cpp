#include "gossip/exchange.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace grove::gossip {

namespace {
// The mean of ours and the partners' values [lo, hi) into dst (ours itself, or apart from it):
// ours, then each partner's in the order given (member id), then the division. The one order of
// the streamed trio mean and the pass at the end, so that both give the same bits.
void mean_into(float* dst, const float* ours, const std::vector<const optim::Floats*>& partners,
               std::size_t lo, std::size_t hi) {
  if (dst != ours)
    for (std::size_t i = lo; i < hi; ++i) dst[i] = ours[i];
  for (const auto* p : partners) {
    const float* src = p->data();
    for (std::size_t i = lo; i < hi; ++i) dst[i] += src[i];
  }
  const float count = static_cast<float>(partners.size() + 1);
  for (std::size_t i = lo; i < hi; ++i) dst[i] /= count;
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
  fold_ = peers_.size() == 1;
  if (fold_) scratch_.resize(opts_.chunk_values);
  folding_ = peers_.size() > 1;
  if (folding_) folded_.resize(own_.size());
  // No pass over our tensors before the first byte (at the size of a model whose state is in
  // the node's pages, a pass reads gigabytes from the disk, longer than a partner waits for
  // us): each chunk is checked (finite) and adds to our norm as the first partner's stream
  // encodes it.
  own_sq_.assign(own_.size(), 0.0);
  own_checked_.assign(own_.size(), 0);
  for (auto& [id, in] : peers_) {
    in.last_heard = now;
    in.last_sent = now;
  }
  for (auto& [id, in] : peers_) {
    if (finished_) break;
    in.out.last_left = now;
    fill(id, in, now);
  }
  maybe_finish();
}

std::size_t GroupExchange::chunks_of(std::size_t tensor) const {
  return (own_[tensor].size() + opts_.chunk_values - 1) / opts_.chunk_values;
}

std::size_t GroupExchange::received(const Incoming& in) const {
  if (in.state == Incoming::complete) return position(own_.size(), 0);
  // (Between tensors `next` still counts the last one's chunks: none of `tensor` is in yet.)
  return position(in.tensor, in.begun ? in.next : 0);
}

void GroupExchange::fold_more() {
  if (!folding_) return;
  std::size_t upto = position(own_.size(), 0);
  for (const auto& [id, in] : peers_) {
    if (in.state == Incoming::failed) {  // the mean is taken at the end over the others
      folding_ = false;
      folded_.clear();
      folded_.shrink_to_fit();
      return;
    }
    upto = std::min(upto, received(in));
  }
  while (fold_tensor_ < own_.size() && position(fold_tensor_, fold_chunk_) < upto) {
    const auto& mine = own_[fold_tensor_];
    const std::size_t off = fold_chunk_ * opts_.chunk_values;
    const std::size_t end = std::min(mine.size(), off + opts_.chunk_values);
    auto& dst = folded_[fold_tensor_];
    if (dst.size() != mine.size()) dst = optim::Floats::zeros(mine.size(), opts_.alloc);
    std::vector<const optim::Floats*> theirs;
    for (const auto& [id, in] : peers_) theirs.push_back(&in.staged[fold_tensor_]);
    mean_into(dst.data(), mine.data(), theirs, off, end);
    dst.release(off, end);
    for (const auto* t : theirs) t->release(off, end);
    // (Ours is read again only by a stream that has not encoded this chunk yet.)
    mine.release(off, end);
    if (++fold_chunk_ == chunks_of(fold_tensor_)) {
      ++fold_tensor_;
      fold_chunk_ = 0;
    }
  }
}

std::size_t GroupExchange::position(std::size_t tensor, std::size_t chunk) const {
  std::size_t p = chunk;
  for (std::size_t t = 0; t < tensor && t < own_.size(); ++t) p += chunks_of(t);
  return p;
}

bool GroupExchange::check_own(std::size_t tensor, std::size_t chunk) {
  if (chunk < own_checked_[tensor]) return true;  // (another partner's stream got there first)
  const auto& t = own_[tensor];
  const std::size_t off = chunk * opts_.chunk_values;
  const std::size_t len = std::min(opts_.chunk_values, t.size() - off);
  // (In double: finite exactly when every value is.)
  const double n = optim::l2_norm(t.data() + off, len);
  if (!std::isfinite(n)) return false;
  own_sq_[tensor] += n * n;
  own_checked_[tensor] = chunk + 1;
  return true;
}

std::optional<double> GroupExchange::own_norm(std::size_t tensor) {
  // Usually every chunk is in by the time a partner's tensor is (ours went out as theirs came
  // in); otherwise the rest is read now.
  const std::size_t chunks = chunks_of(tensor);
  while (own_checked_[tensor] < chunks) {
    const std::size_t c = own_checked_[tensor];
    const bool ok = check_own(tensor, c);
    const std::size_t off = c * opts_.chunk_values;
    own_[tensor].release(off, std::min(own_[tensor].size(), off + opts_.chunk_values));
    if (!ok) return std::nullopt;
  }
  return std::sqrt(own_sq_[tensor]);
}

void GroupExchange::abort_local(Time now) {
  spdlog::warn("exchange: local tensor is not finite; local-only round");
  Header h;
  h.kind = MsgKind::abort;
  h.op = op_;
  for (auto& [id, in] : peers_) {
    // Partners have part of our tensor: tell them to drop it now rather than wait for us.
    if (!in.out.done) send(id, encode_message(h, 0), now);
    in.state = Incoming::failed;
    in.why = "local tensor not finite";
    in.staged.clear();
    in.staged.shrink_to_fit();
    stop_sending(in);
  }
  finished_ = true;
  folded_.clear();
  folded_.shrink_to_fit();
  mean_ = std::move(own_);
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
      if (!check_own(s.tensor, s.chunk)) return abort_local(now);
      std::span<std::uint8_t> payload;
      Bytes b = encode_message(tensor_header(MsgKind::chunk, s.tensor, s.chunk, len),
                               encoded_size(opts_.codec, len), &payload);
      // (Every value is finite: check_own() said so.)
      encode_values(opts_.codec, std::span<const float>(tensor).subspan(off, len), payload);
      // In a pair our chunk is read again when the partner's arrives: it stays in memory if
      // that is near (released then), and leaves now if the partner's stream is far behind.
      const std::size_t here = position(s.tensor, s.chunk);
      const std::size_t got = position(in.tensor, in.next);
      if (!fold_ || in.state != Incoming::receiving || got > here || here - got > kFoldLead)
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
  in.heard = true;
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
      in.sq = 0;
      if (in.staged.empty()) in.staged.resize(own_.size());
      in.staged[in.tensor] = optim::Floats::zeros(n, opts_.alloc);
      return;
    }
    case MsgKind::chunk:
      return on_chunk(from, in, m);
    case MsgKind::abort:
      return drop(from, in, "it stopped the exchange (its tensor is not finite)");
    case MsgKind::tensor_end:
      if (!in.begun || m.h.index != in.tensor || in.next != in.chunks)
        return drop(from, in, "tensor_end out of order");
      in.digest = m.h.digest;
      return check_complete(from, in, now);
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
  const std::span<float> into =
      fold_ ? std::span<float>(scratch_).first(len) : std::span<float>(staged).subspan(off, len);
  if (decode_values(opts_.codec, m.payload, into) != optim::CodecError::ok)
    return drop(from, in, "chunk undecodable or not finite");
  const double nrm = optim::l2_norm(into.data(), len);  // (while the chunk is hot)
  in.sq += nrm * nrm;
  if (fold_) {
    // The mean as maybe_finish() would make it: ours plus theirs, then the division.
    auto& mine = own_[in.tensor];
    const float* a = mine.data() + off;
    float* dst = staged.data() + off;
    for (std::size_t i = 0; i < len; ++i) dst[i] = (a[i] + into[i]) / 2.0f;
    // Our chunk leaves memory once our stream has encoded it too, or when our stream is far
    // behind (it reads the chunk again then).
    const auto& s = in.out;
    const std::size_t here = position(in.tensor, in.next);
    const std::size_t sent = s.done ? here + 1 : position(s.tensor, s.chunk);
    if (sent > here || here - sent > kFoldLead) mine.release(off, off + len);
  }
  staged.release(off, off + len);
  in.hasher->update(m.payload);
  ++in.next;
  fold_more();
}

void GroupExchange::check_complete(const NodeId& from, Incoming& in, Time now) {
  if (in.hasher->final() != in.digest) return drop(from, in, "tensor digest mismatch");
  const auto norm_t = own_norm(in.tensor);
  const auto norm_0 = opts_.bound_by_first ? own_norm(0) : norm_t;
  if (!norm_t || !norm_0) return abort_local(now);
  const double mine = std::max(*norm_t, *norm_0);
  const double theirs = std::sqrt(in.sq);
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
  fold_more();  // (a failure since the last chunk ends the folding)
  if (folding_ && fold_tensor_ == own_.size()) {
    // Every partner completed and every chunk is folded: no pass over the model at the end.
    mean_ = std::move(folded_);
    mean_streamed_ = true;
    own_.clear();
    for (auto& [id, in] : peers_) {
      in.staged.clear();
      in.staged.shrink_to_fit();
    }
    return;
  }
  folded_.clear();
  folded_.shrink_to_fit();
  if (fold_) {
    // A pair: the partner's staged tensors are the mean already (on_chunk), or ours stand alone.
    auto& in = peers_.begin()->second;
    if (in.state == Incoming::complete) {
      mean_ = std::move(in.staged);
      mean_streamed_ = true;
      own_.clear();
    } else {
      mean_ = std::move(own_);
    }
    in.staged.clear();
    in.staged.shrink_to_fit();
    return;
  }
  // Mean over ours and the completed partners', summed in member-id order (deterministic), in
  // place in our own tensors (no longer needed once finished).
  mean_ = std::move(own_);
  std::vector<const Incoming*> done;
  for (const auto& [id, in] : peers_)
    if (in.state == Incoming::complete) done.push_back(&in);
  if (!done.empty()) {
    for (std::size_t t = 0; t < mean_.size(); ++t) {
      std::vector<const optim::Floats*> theirs;
      for (const Incoming* in : done) theirs.push_back(&in->staged[t]);
      // A fragment at a time (as a whole pass did), in place in ours.
      for (std::size_t lo = 0; lo < mean_[t].size(); lo += optim::kFragment) {
        const std::size_t hi = std::min(mean_[t].size(), lo + optim::kFragment);
        mean_into(mean_[t].data(), mean_[t].data(), theirs, lo, hi);
        mean_[t].release(lo, hi);
        for (const auto* a : theirs) a->release(lo, hi);
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
    if (in.state == Incoming::receiving && now - in.last_heard >= silence(in)) {
      drop(id, in,
           in.heard ? "silent past the chunk timeout"
                    : "silent past the chunk timeout and the start grace");
      continue;
    }
    if (!in.out.done && in.out.in_flight > 0 && now - in.out.last_left >= silence(in)) {
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
    if (in.state == Incoming::receiving) t = std::min(t, in.last_heard + silence(in));
    if (!in.out.done && in.out.in_flight > 0) t = std::min(t, in.out.last_left + silence(in));
  }
  return t;
}

Time GroupExchange::silence(const Incoming& in) const {
  return opts_.chunk_timeout + (in.heard ? Time(0) : opts_.start_grace);
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
