// A deterministic discrete-event network of DHT nodes in virtual time: the same sans-IO
// dht::DhtNode the real node runs, with modelled one-way latency, jitter, loss, dead nodes and
// partitions. Everything (identities, latencies, losses) comes from one seed, so a run is
// reproducible bit for bit. Used by the DHT tests and the lookup benchmark.
#pragma once

#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <vector>

#include "dht/node.hpp"

namespace grove::sim {

using dht::Time;

struct LinkModel {
  Time latency{20};  ///< one-way base latency
  Time jitter{0};    ///< uniform +- around the base
  double loss = 0;   ///< probability that a message is dropped
  /// A message to a dead node: true = the sender learns at once (connection refused);
  /// false = it vanishes (a host that is gone or hangs).
  bool dead_refuses = false;
};

class DhtNetwork {
 public:
  DhtNetwork(std::uint64_t seed, LinkModel model, dht::DhtOptions opts);

  /// Adds a node (address "sim:<index>") and returns its index. It knows nobody yet.
  std::size_t add_node();
  /// The node stops: it neither receives nor sends; its state is dropped.
  void kill(std::size_t i);
  bool alive(std::size_t i) const { return nodes_[i] && nodes_[i]->alive; }
  dht::DhtNode& node(std::size_t i) { return *nodes_[i]->dht; }
  std::size_t size() const { return nodes_.size(); }
  std::vector<std::size_t> alive_nodes() const;
  std::string address(std::size_t i) const { return "sim:" + std::to_string(i); }

  /// group(i) names node i's side; messages between sides are dropped. Empty = no partition.
  void set_partition(std::function<int(std::size_t)> group) { partition_ = std::move(group); }
  void set_model(LinkModel m) { model_ = m; }
  /// One-way base latency per pair of node indices, in place of the model's single figure
  /// (jitter and loss still come from the model).
  void set_latency(std::function<Time(std::size_t, std::size_t)> f) { latency_fn_ = std::move(f); }
  /// Called with a node's index whenever it handled an event or an API call (sim::Swarm looks
  /// only at the nodes that something happened to).
  void set_on_touched(std::function<void(std::size_t)> f) { touched_ = std::move(f); }

  Time now() const { return now_; }
  /// The time of the next pending event, if any.
  std::optional<Time> next_event() const {
    if (events_.empty()) return std::nullopt;
    return events_.top().at;
  }
  /// Runs `fn` on node i now (an API call), then collects what it sends.
  void call(std::size_t i, const std::function<void(dht::DhtNode&)>& fn);
  /// Processes events until virtual time `t`.
  void run_until(Time t);
  void run_for(Time d) { run_until(now_ + d); }
  /// Runs until pred() holds (checked after every event) or `limit` of virtual time passes.
  bool run_until(const std::function<bool()>& pred, Time limit);

  /// DHT bytes node i handed to the network (requests and replies, delivered or not).
  std::uint64_t bytes_sent(std::size_t i) const { return nodes_.at(i)->bytes_sent; }
  std::uint64_t messages_delivered() const { return delivered_; }
  std::uint64_t messages_dropped() const { return dropped_; }

 private:
  struct SimNode {
    std::shared_ptr<transport::Identity> identity;
    std::unique_ptr<dht::DhtNode> dht;
    bool alive = true;
    Time timer_at = Time::max();
    std::uint64_t bytes_sent = 0;
  };
  enum class Kind { deliver, timer, send_failed };
  struct Event {
    Time at{0};
    std::uint64_t seq = 0;
    Kind kind = Kind::timer;
    std::size_t to = 0;
    dht::NodeId from{};
    std::size_t from_index = 0;
    std::vector<std::uint8_t> bytes;
    std::uint64_t txid = 0;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  static Event make_event(Time at, Kind kind, std::size_t to) {
    Event e;
    e.at = at;
    e.kind = kind;
    e.to = to;
    return e;
  }
  void pump(std::size_t i);
  void push(Event e);
  bool step();
  std::optional<std::size_t> resolve(const dht::Endpoint& e) const;

  LinkModel model_;
  dht::DhtOptions opts_;
  std::mt19937_64 rng_;
  Time now_;
  std::uint64_t seq_ = 0, delivered_ = 0, dropped_ = 0;
  std::vector<std::unique_ptr<SimNode>> nodes_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::function<int(std::size_t)> partition_;
  std::function<Time(std::size_t, std::size_t)> latency_fn_;
  std::function<void(std::size_t)> touched_;
  std::shared_ptr<dht::SignatureCache> sig_cache_ =
      std::make_shared<dht::SignatureCache>(std::size_t{1} << 20);
};

}  // namespace grove::sim
