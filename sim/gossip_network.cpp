#include "sim/gossip_network.hpp"

#include <algorithm>
#include <cmath>

namespace grove::sim {

using gossip::NodeId;
using gossip::OpId;

namespace {
constexpr std::size_t kMaxEarlyBytes = 256u << 20;
}

double tcp_flow_rate(double line_bytes_per_ms, double rtt_ms, double loss, double mss) {
  if (loss <= 0) return line_bytes_per_ms;
  return std::min(line_bytes_per_ms, 1.22 * mss / (std::max(1.0, rtt_ms) * std::sqrt(loss)));
}

GossipNetwork::GossipNetwork(std::uint64_t seed, GossipLinkModel model)
    : model_(model), rng_(seed) {}

NodeId GossipNetwork::add_node() {
  NodeId id;
  for (auto& b : id) b = static_cast<std::uint8_t>(rng_());
  return add_node(id);
}

NodeId GossipNetwork::add_node(const NodeId& id) {
  nodes_[id].bytes_per_ms = model_.bytes_per_ms;
  return id;
}

std::optional<dht::Time> GossipNetwork::next_event() const {
  if (events_.empty()) return std::nullopt;
  return events_.top().at;
}

void GossipNetwork::hand_over(const NodeId& node, const OpId& op) {
  if (!on_finished_) return;
  auto& n = nodes_.at(node);
  auto it = n.ops.find(op);
  if (it == n.ops.end() || !it->second->finished()) return;
  auto p = std::move(it->second);
  n.ops.erase(it);
  n.timer_at.erase(op);
  n.finished.push_back(op);
  if (n.finished.size() > 256) n.finished.pop_front();
  on_finished_(node, std::move(p));
}

void GossipNetwork::set_payload_scale(double scale) {
  set_wire_size([scale](std::span<const std::uint8_t> m) {
    if (m.size() < 2) return static_cast<double>(m.size());
    const std::size_t header = 2 + ((std::size_t{m[0]} << 8) | m[1]);
    const double payload = m.size() > header ? static_cast<double>(m.size() - header) : 0.0;
    return static_cast<double>(m.size()) + payload * (scale - 1);
  });
}

void GossipNetwork::set_uplink(const NodeId& node, double bytes_per_ms) {
  nodes_.at(node).bytes_per_ms = bytes_per_ms;
}

void GossipNetwork::set_downlink(const NodeId& node, double bytes_per_ms) {
  nodes_.at(node).down_bytes_per_ms = bytes_per_ms;
}

double GossipNetwork::wire_bytes_sent(const NodeId& node) const {
  return nodes_.at(node).wire_sent;
}

dht::Time GossipNetwork::latency(const NodeId& from, const NodeId& to) {
  dht::Time lat = latency_fn_ ? latency_fn_(from, to) : model_.latency;
  if (model_.jitter.count() > 0)
    lat += dht::Time(std::uniform_int_distribution<std::int64_t>(-model_.jitter.count(),
                                                                 model_.jitter.count())(rng_));
  return std::max(lat, dht::Time(0));
}

bool GossipNetwork::alive(const NodeId& node) const {
  const auto& n = nodes_.at(node);
  return n.alive && !n.hung;
}

std::uint64_t GossipNetwork::bytes_sent(const NodeId& node) const {
  return nodes_.at(node).sent;
}

gossip::Protocol* GossipNetwork::protocol(const NodeId& node, const OpId& op) {
  auto& n = nodes_.at(node);
  auto it = n.ops.find(op);
  return it == n.ops.end() ? nullptr : it->second.get();
}

void GossipNetwork::push(Event e) {
  e.seq = seq_++;
  events_.push(std::move(e));
}

void GossipNetwork::attach(const NodeId& node, std::unique_ptr<gossip::Protocol> p) {
  auto& n = nodes_.at(node);
  if (!n.alive || n.hung) return;
  const OpId op = p->op();
  auto& slot = n.ops[op];
  slot = std::move(p);
  collect(node, *slot);
  if (auto it = n.early.find(op); it != n.early.end()) {
    auto msgs = std::move(it->second);
    n.early.erase(it);
    for (auto& [from, bytes] : msgs) {
      n.early_bytes -= bytes.size();
      if (auto m = gossip::decode_message(bytes)) slot->on_message(from, *m, now_);
      collect(node, *slot);
    }
  }
  schedule_timer(node, *slot);
  hand_over(node, op);
}

void GossipNetwork::poke(const NodeId& node, const OpId& op) {
  auto& n = nodes_.at(node);
  auto it = n.ops.find(op);
  if (!n.alive || n.hung || it == n.ops.end()) return;
  collect(node, *it->second);
  schedule_timer(node, *it->second);
}

void GossipNetwork::collect(const NodeId& node, gossip::Protocol& p) {
  auto& n = nodes_.at(node);
  for (auto& o : p.take_outgoing()) {
    if (!n.alive || n.hung) return;
    const dht::Time base = latency_fn_ ? latency_fn_(node, o.to) : model_.latency;
    const double bw = tcp_flow_rate(n.bytes_per_ms, 2.0 * static_cast<double>(base.count()),
                                    model_.loss, model_.mss);
    const double size =
        wire_size_ ? wire_size_(std::span<const std::uint8_t>(o.data.data(), o.data.size()))
                   : static_cast<double>(o.data.size());
    const dht::Time start = std::max(now_, n.uplink_free);
    if (n.sent + o.data.size() >= n.kill_offset) {
      // The node dies part-way through this message: it never arrives.
      const std::uint64_t left = n.kill_offset > n.sent ? n.kill_offset - n.sent : 0;
      const auto at = start + dht::Time(static_cast<std::int64_t>(std::ceil(left / bw)));
      n.sent = n.kill_offset;
      n.uplink_free = at;
      die(node, at);
      return;
    }
    n.sent += o.data.size();
    n.wire_sent += size;
    const dht::Time end = start + dht::Time(static_cast<std::int64_t>(std::ceil(size / bw)));
    n.uplink_free = end;
    Event e;
    e.kind = Kind::deliver;
    e.at = end + latency(node, o.to);
    if (auto r = nodes_.find(o.to); r != nodes_.end() && r->second.down_bytes_per_ms > 0) {
      // The receiver's downlink: its bytes arrive no faster than it takes them, after whatever
      // it is already receiving.
      auto& d = r->second;
      const dht::Time first = start + base;
      const dht::Time rx =
          std::max(first, d.downlink_free) +
          dht::Time(static_cast<std::int64_t>(std::ceil(size / d.down_bytes_per_ms)));
      e.at = std::max(e.at, rx);
      d.downlink_free = rx;
    }
    auto& flow = last_arrival_[{node, o.to}];
    e.at = std::max(e.at, flow);  // one connection: in order
    flow = e.at;
    if (partition_ && partition_(node) != partition_(o.to)) continue;  // blackholed
    Event left;  // the sender learns that the message has left (on_delivered)
    left.kind = Kind::left;
    left.at = end;
    left.to = node;
    left.from = o.to;
    left.op = p.op();
    push(std::move(left));
    e.to = o.to;
    e.from = node;
    e.tx_end = end;
    e.bytes =
        std::make_shared<std::vector<std::uint8_t>>(o.data.data(), o.data.data() + o.data.size());
    push(std::move(e));
  }
}

void GossipNetwork::schedule_timer(const NodeId& node, gossip::Protocol& p) {
  auto& n = nodes_.at(node);
  const auto d = p.next_deadline();
  if (!d) return;
  auto it = n.timer_at.find(p.op());
  if (it != n.timer_at.end() && it->second <= *d && it->second >= now_) return;
  n.timer_at[p.op()] = *d;
  Event e;
  e.kind = Kind::timer;
  e.at = std::max(*d, now_);
  e.to = node;
  e.op = p.op();
  push(std::move(e));
}

void GossipNetwork::die(const NodeId& node, dht::Time at) {
  Event e;
  e.kind = Kind::die;
  e.at = at;
  e.to = node;
  push(std::move(e));
}

void GossipNetwork::kill(const NodeId& node) {
  die(node, now_);
  run_until(now_);
}

void GossipNetwork::kill_at_byte(const NodeId& node, std::uint64_t offset) {
  nodes_.at(node).kill_offset = offset;
}

void GossipNetwork::hang(const NodeId& node) {
  nodes_.at(node).hung = true;
}

void GossipNetwork::step(Event e) {
  now_ = std::max(now_, e.at);
  ++processed_;
  auto& n = nodes_.at(e.to);
  switch (e.kind) {
    case Kind::die: {
      if (!n.alive) return;
      n.alive = false;
      n.died = e.at;
      n.ops.clear();
      n.early.clear();
      for (auto& [id, other] : nodes_) {  // every peer's connection to it breaks
        if (id == e.to || !other.alive) continue;
        Event f;
        f.kind = Kind::peer_failed;
        f.at = e.at + model_.loss_detect;
        f.to = id;
        f.from = e.to;
        push(std::move(f));
      }
      return;
    }
    case Kind::peer_failed: {
      if (!n.alive || n.hung) return;
      std::vector<OpId> ops;
      for (auto& [op, p] : n.ops) {
        p->on_peer_failed(e.from, now_);
        collect(e.to, *p);
        schedule_timer(e.to, *p);
        ops.push_back(op);
      }
      for (const auto& op : ops) hand_over(e.to, op);
      return;
    }
    case Kind::left: {
      if (!n.alive || n.hung) return;
      auto it = n.ops.find(e.op);
      if (it == n.ops.end()) return;
      it->second->on_delivered(e.from, now_);
      collect(e.to, *it->second);
      schedule_timer(e.to, *it->second);
      hand_over(e.to, e.op);
      return;
    }
    case Kind::timer: {
      if (!n.alive || n.hung) return;
      auto it = n.ops.find(e.op);
      if (it == n.ops.end()) return;
      if (auto t = n.timer_at.find(e.op); t != n.timer_at.end() && t->second == e.at)
        n.timer_at.erase(t);
      it->second->on_timer(now_);
      collect(e.to, *it->second);
      schedule_timer(e.to, *it->second);
      hand_over(e.to, e.op);
      return;
    }
    case Kind::deliver: {
      const auto& sender = nodes_.at(e.from);
      if (!sender.alive && e.tx_end > sender.died) return;  // cut off mid-message
      if (sender.hung) return;
      if (!n.alive) {
        if (sender.alive && !sender.hung) {  // connection refused
          Event f;
          f.kind = Kind::peer_failed;
          f.at = now_ + model_.latency;
          f.to = e.from;
          f.from = e.to;
          push(std::move(f));
        }
        return;
      }
      if (n.hung) return;
      auto m = gossip::decode_message(*e.bytes);
      if (!m) return;
      auto it = n.ops.find(m->h.op);
      if (it == n.ops.end()) {
        if (std::find(n.finished.begin(), n.finished.end(), m->h.op) != n.finished.end()) return;
        if (n.early_bytes + e.bytes->size() <= kMaxEarlyBytes) {
          n.early_bytes += e.bytes->size();
          n.early[m->h.op].emplace_back(e.from, std::move(*e.bytes));
        }
        return;
      }
      it->second->on_message(e.from, *m, now_);
      collect(e.to, *it->second);
      schedule_timer(e.to, *it->second);
      hand_over(e.to, m->h.op);
      return;
    }
  }
}

void GossipNetwork::run_until(dht::Time t) {
  while (!events_.empty() && events_.top().at <= t) {
    Event e = events_.top();
    events_.pop();
    step(std::move(e));
  }
  now_ = std::max(now_, t);
}

bool GossipNetwork::run_until(const std::function<bool()>& pred, dht::Time limit) {
  const dht::Time end = now_ + limit;
  if (pred()) return true;
  while (!events_.empty() && events_.top().at <= end) {
    Event e = events_.top();
    events_.pop();
    step(std::move(e));
    if (pred()) return true;
  }
  now_ = std::max(now_, end);
  return pred();
}

}  // namespace grove::sim
