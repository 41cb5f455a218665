#include "sim/dht_network.hpp"

#include <charconv>

namespace grove::sim {

// Virtual time starts at a realistic wall-clock value so record expiry behaves as on a real node.
static constexpr Time kEpoch{1'780'000'000'000};

DhtNetwork::DhtNetwork(std::uint64_t seed, LinkModel model, dht::DhtOptions opts)
    : model_(model), opts_(opts), rng_(seed), now_(kEpoch) {}

std::size_t DhtNetwork::add_node() {
  std::array<std::uint8_t, 32> seed;
  for (auto& b : seed) b = static_cast<std::uint8_t>(rng_());
  auto n = std::make_unique<SimNode>();
  n->identity = std::make_shared<transport::Identity>(transport::Identity::from_seed(seed));
  const std::size_t i = nodes_.size();
  n->dht = std::make_unique<dht::DhtNode>(n->identity, address(i), opts_, rng_());
  n->dht->share_signature_cache(sig_cache_);  // one verification per distinct record
  nodes_.push_back(std::move(n));
  pump(i);
  return i;
}

void DhtNetwork::kill(std::size_t i) {
  if (!alive(i)) return;
  nodes_[i]->alive = false;
  nodes_[i]->dht.reset();
}

std::vector<std::size_t> DhtNetwork::alive_nodes() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (alive(i)) out.push_back(i);
  return out;
}

void DhtNetwork::call(std::size_t i, const std::function<void(dht::DhtNode&)>& fn) {
  if (!alive(i)) return;
  fn(*nodes_[i]->dht);
  pump(i);
}

void DhtNetwork::push(Event e) {
  e.seq = seq_++;
  events_.push(std::move(e));
}

std::optional<std::size_t> DhtNetwork::resolve(const dht::Endpoint& e) const {
  const std::string& a = e.address;
  if (a.rfind("sim:", 0) != 0) return std::nullopt;
  std::size_t idx = 0;
  auto [p, ec] = std::from_chars(a.data() + 4, a.data() + a.size(), idx);
  if (ec != std::errc() || p != a.data() + a.size() || idx >= nodes_.size()) return std::nullopt;
  return idx;
}

void DhtNetwork::pump(std::size_t i) {
  if (!alive(i)) return;
  if (touched_) touched_(i);
  SimNode& n = *nodes_[i];
  for (auto& o : n.dht->take_outgoing()) {
    n.bytes_sent += o.bytes.size();
    auto to = resolve(o.to);
    const bool wrong_id = to && alive(*to) && o.to.id && nodes_[*to]->identity->id() != *o.to.id;
    const bool cut = to && partition_ && partition_(i) != partition_(*to);
    if (!to || !alive(*to) || wrong_id || cut) {
      ++dropped_;
      // What the transport would report: a bad address or another identity fails the dial at
      // once; a dead host refuses or stays silent (model); a partition is silence.
      const bool refused = !to || wrong_id || (!alive(*to) && !cut && model_.dead_refuses);
      if (refused && o.txid) {
        Event e = make_event(now_ + model_.latency, Kind::send_failed, i);
        e.txid = o.txid;
        push(std::move(e));
      }
      continue;
    }
    if (model_.loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < model_.loss) {
      ++dropped_;
      continue;
    }
    Time lat = latency_fn_ ? latency_fn_(i, *to) : model_.latency;
    if (model_.jitter.count() > 0)
      lat += Time(std::uniform_int_distribution<std::int64_t>(-model_.jitter.count(),
                                                              model_.jitter.count())(rng_));
    if (lat < Time(0)) lat = Time(0);
    Event e = make_event(now_ + lat, Kind::deliver, *to);
    e.from = n.identity->id();
    e.from_index = i;
    e.bytes = std::move(o.bytes);
    push(std::move(e));
  }
  const Time nd = std::max(n.dht->next_deadline(), now_);
  if (nd < n.timer_at) {
    n.timer_at = nd;
    Event e = make_event(nd, Kind::timer, i);
    push(std::move(e));
  }
}

bool DhtNetwork::step() {
  if (events_.empty()) return false;
  // top() is const; moving out of it is safe because pop() follows at once.
  Event e = std::move(const_cast<Event&>(events_.top()));
  events_.pop();
  now_ = std::max(now_, e.at);
  if (!alive(e.to)) return true;
  SimNode& n = *nodes_[e.to];
  switch (e.kind) {
    case Kind::deliver:
      ++delivered_;
      n.dht->on_message(dht::Peer{e.from, address(e.from_index)}, e.bytes, now_);
      break;
    case Kind::timer:
      if (e.at != n.timer_at) return true;  // superseded by an earlier one
      n.timer_at = Time::max();
      n.dht->on_timer(now_);
      break;
    case Kind::send_failed:
      n.dht->on_send_failed(e.txid, now_);
      break;
  }
  pump(e.to);
  return true;
}

void DhtNetwork::run_until(Time t) {
  while (!events_.empty() && events_.top().at <= t) step();
  now_ = std::max(now_, t);
}

bool DhtNetwork::run_until(const std::function<bool()>& pred, Time limit) {
  const Time end = now_ + limit;
  if (pred()) return true;
  while (!events_.empty() && events_.top().at <= end) {
    step();
    if (pred()) return true;
  }
  now_ = std::max(now_, end);
  return pred();
}

}  // namespace grove::sim
