#include "gossip/ring_op.hpp"

#include <cstring>

#include <spdlog/spdlog.h>

#include "transport/crypto.hpp"

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

RingOp::RingOp(const char* name, OpId op, NodeId self, std::vector<NodeId> ring, WireCodec codec,
               RingTimers timers, Time now)
    : self_(self),
      name_(name),
      op_(op),
      original_(std::move(ring)),
      codec_(codec),
      timers_(timers),
      started_(now) {
  original_sorted_ = original_;
  std::sort(original_sorted_.begin(), original_sorted_.end());
}

Header RingOp::header(MsgKind k) const {
  Header h;
  h.kind = k;
  h.op = op_;
  h.tag = tag_;
  h.codec = codec_;
  return h;
}

void RingOp::send(const NodeId& to, Bytes b, Time now) {
  stats_.bytes_sent += b.size();
  if (to == succ()) {
    last_sent_succ_ = now;
    ++in_flight_succ_;
  }
  out_.push_back({to, std::move(b)});
}

void RingOp::start_attempt(Time now) {
  ring_.clear();
  for (const auto& id : original_)
    if (!suspects_.count(id)) ring_.push_back(id);
  me_ = static_cast<std::size_t>(std::find(ring_.begin(), ring_.end(), self_) - ring_.begin());
  ring_sorted_ = ring_;
  std::sort(ring_sorted_.begin(), ring_sorted_.end());
  tag_ = tag_of(suspects_);
  const std::size_t N = ring_.size();
  done_from_.clear();
  lost_.clear();
  settled_ = 0;
  complete_ = false;
  in_flight_succ_ = 0;
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
    // Alone. Out of a pair, the partner died: the result of one is ours. Out of three or more,
    // losing every other member says more about our own links than theirs: fail, so that the
    // node re-syncs its state instead of going on with weights nobody else has.
    if (original_.size() > 2) return fail("lost every other member (isolated?)");
    alone(now);
    if (!finished()) complete(now);
    return;
  }
  start_data(now);
}

void RingOp::on_delivered(const NodeId& to, Time now) {
  if (finished() || ring_.size() < 2 || to != succ()) return;
  if (in_flight_succ_ > 0) --in_flight_succ_;
  on_succ_delivered(now);
}

void RingOp::on_message(const NodeId& from, const Message& m, Time now) {
  if (finished() || m.h.op != op_) return;
  if (!has(original_sorted_, from)) return;
  if (m.h.kind == MsgKind::abort) {
    if (std::find(m.h.suspects.begin(), m.h.suspects.end(), self_) != m.h.suspects.end()) {
      fail("excluded from the " + std::string(name_) + " by " + dht::short_hex(from));
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
  if (ring_.size() > 1 && from == pred()) {
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
      on_data(from, m, now);
      break;
    default:
      spdlog::warn("{}: unexpected {} from {}", name_, to_string(m.h.kind), dht::short_hex(from));
      break;
  }
}

void RingOp::bad_data(const NodeId& from, const char* why, Time now) {
  spdlog::warn("{}: bad chunk from {} ({}); suspecting it", name_, dht::short_hex(from), why);
  suspect({from}, now, "bad chunk");
}

void RingOp::complete(Time now) {
  complete_ = true;
  completed_at_ = now;
  for (const auto& id : ring_)
    if (id != self_) send(id, encode_message(header(MsgKind::done), 0), now);
  maybe_done();
}

void RingOp::maybe_done() {
  if (!complete_ || finished()) return;
  if (settled_ + 1 < ring_.size()) return;  // a member's done (or loss) is still missing
  status_ = OpStatus::done;
}

void RingOp::suspect(const std::set<NodeId>& ids, Time now, const char* why) {
  bool grew = false;
  for (const auto& id : ids)
    if (id != self_ && suspects_.insert(id).second) grew = true;
  if (!grew) return;
  std::string names;
  for (const auto& id : ids) {
    if (!names.empty()) names += ',';
    names += dht::short_hex(id);
  }
  spdlog::warn("{} {}: suspecting {} ({}); retrying among {} members at t={}", name_,
               transport::to_hex(self_).substr(0, 4), names, why,
               original_.size() - suspects_.size(), now.count());
  ++stats_.attempts;
  Header h = header(MsgKind::abort);
  h.suspects.assign(suspects_.begin(), suspects_.end());
  for (const auto& id : original_)
    if (id != self_ && !suspects_.count(id)) out_.push_back({id, encode_message(h, 0)});
  start_attempt(now);
}

void RingOp::on_peer_failed(const NodeId& peer, Time now) {
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

void RingOp::on_timer(Time now) {
  if (finished()) return;
  if (now - started_ >= timers_.total_timeout) return fail("timed out");
  if (ring_.size() < 2) return;
  if (complete_ && now - completed_at_ >= timers_.linger) {
    status_ = OpStatus::done;
    return;
  }
  if (!complete_ && now - last_heard_pred_ >= silence_bound()) {
    suspect({pred()}, now, "silent past the chunk timeout");
    if (finished()) return;
  }
  if (now - last_sent_succ_ >= timers_.heartbeat)
    send(succ(), encode_message(header(MsgKind::heartbeat), 0), now);
}

std::optional<Time> RingOp::next_deadline() const {
  if (finished()) return std::nullopt;
  Time t = started_ + timers_.total_timeout;
  if (ring_.size() >= 2) {
    t = std::min(t, last_sent_succ_ + timers_.heartbeat);
    if (complete_)
      t = std::min(t, completed_at_ + timers_.linger);
    else
      t = std::min(t, last_heard_pred_ + silence_bound());
  }
  return t;
}

std::vector<Outgoing> RingOp::take_outgoing() {
  return std::exchange(out_, {});
}

void RingOp::fail(std::string why) {
  spdlog::warn("{} failed: {}", name_, why);
  status_ = OpStatus::failed;
  failure_ = std::move(why);
}

}  // namespace grove::gossip
