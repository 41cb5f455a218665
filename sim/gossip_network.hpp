// A deterministic discrete-event network for the gossip cores (RingAllReduce, GroupExchange):
// the same sans-IO Protocol objects the real node runs, in virtual time, with a modelled link
// per node (one-way latency, an uplink of a given rate that sends its messages in order, so a
// message's bytes leave over time) and faults: kill a node now or once it has sent a given
// number of bytes (the message crossing that offset never arrives), or hang it (it goes silent
// without closing anything). Scale experiments add a latency per pair (a region matrix), jitter,
// a receiving rate, loss (as TCP feels it: a lower rate), partitions, and a wire size that lets a
// small tensor stand for a large one. Used by the gossip tests and the swarm simulator.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <span>
#include <vector>

#include "gossip/protocol.hpp"

namespace grove::sim {

struct GossipLinkModel {
  dht::Time latency{5};
  double bytes_per_ms = 125'000;  ///< uplink rate (125 000 B/ms = 1 Gbit/s)
  /// How long after a node dies its peers' connections report the loss (a killed process's
  /// kernel resets its connections). Hung nodes are never reported.
  dht::Time loss_detect{50};
  /// Uniform ± spread around a message's latency. Messages between two nodes still arrive in
  /// the order they were sent (they share one TCP connection).
  dht::Time jitter{0};
  /// Packet loss on the path. The transport is TCP, so a loss costs time, not data: a flow's rate
  /// is capped at the Mathis et al. (1997) bound 1.22·MSS / (RTT·√loss) for a Reno-style
  /// sender, with RTT twice the pair's latency.
  double loss = 0;
  double mss = 1448;  ///< bytes per segment, for the loss bound
};

/// The rate of one TCP flow over a line of `line_bytes_per_ms` with `loss` and a round trip of
/// `rtt_ms`: the line rate, capped by the Mathis bound 1.22·MSS / (RTT·√loss).
double tcp_flow_rate(double line_bytes_per_ms, double rtt_ms, double loss, double mss = 1448);

class GossipNetwork {
 public:
  GossipNetwork(std::uint64_t seed, GossipLinkModel model);

  /// Adds a node and returns its id (drawn from the seed).
  gossip::NodeId add_node();
  /// Adds a node with a given id (e.g. its DHT identity in sim::Swarm).
  gossip::NodeId add_node(const gossip::NodeId& id);
  /// When set, a finished operation is handed over (and removed from the node; later messages
  /// for it are dropped) instead of staying readable through protocol().
  using Finished = std::function<void(const gossip::NodeId&, std::unique_ptr<gossip::Protocol>)>;
  void set_on_finished(Finished f) { on_finished_ = std::move(f); }
  /// Starts an operation on `node` now; messages for its op that arrived early are delivered.
  void attach(const gossip::NodeId& node, std::unique_ptr<gossip::Protocol> p);
  gossip::Protocol* protocol(const gossip::NodeId& node, const gossip::OpId& op);
  /// An operation's driver called into it from outside (a StepGroup's begin() and end()): its
  /// messages are sent and its timer set now.
  void poke(const gossip::NodeId& node, const gossip::OpId& op);

  void kill(const gossip::NodeId& node);
  /// Kills `node` at the instant its cumulative sent bytes reach `offset` (set it before the
  /// node starts sending).
  void kill_at_byte(const gossip::NodeId& node, std::uint64_t offset);
  /// The node stops sending, receiving and timing out; nobody is told.
  void hang(const gossip::NodeId& node);
  bool alive(const gossip::NodeId& node) const;
  void set_uplink(const gossip::NodeId& node, double bytes_per_ms);
  /// A receiving rate: a message's bytes cannot arrive faster, and several arriving at once
  /// share it (0 = unlimited, the default).
  void set_downlink(const gossip::NodeId& node, double bytes_per_ms);
  /// One-way base latency per ordered pair, in place of the model's single figure.
  using LatencyFn = std::function<dht::Time(const gossip::NodeId&, const gossip::NodeId&)>;
  void set_latency(LatencyFn f) { latency_fn_ = std::move(f); }
  /// group(n) names node n's side; messages between sides vanish (no failure is reported, as on
  /// a path that blackholes). Empty = no partition.
  void set_partition(std::function<int(const gossip::NodeId&)> group) {
    partition_ = std::move(group);
  }
  /// Scale experiments carry small tensors that stand for large ones: a message's time on the
  /// wire is computed for `size(bytes)` bytes (e.g. the header plus the payload times a factor)
  /// instead of its real size. Empty = the real size.
  void set_wire_size(std::function<double(std::span<const std::uint8_t>)> size) {
    wire_size_ = std::move(size);
  }
  /// The common wire size: each payload byte stands for `scale` bytes (the header for itself).
  void set_payload_scale(double scale);

  dht::Time now() const { return now_; }
  /// The time of the next pending event, if any.
  std::optional<dht::Time> next_event() const;
  void run_until(dht::Time t);
  /// Runs until pred() holds (checked after every event) or `limit` of virtual time passes.
  bool run_until(const std::function<bool()>& pred, dht::Time limit);
  std::uint64_t bytes_sent(const gossip::NodeId& node) const;
  /// Bytes as the wire model counted them (set_wire_size), for scale experiments.
  double wire_bytes_sent(const gossip::NodeId& node) const;
  std::uint64_t events() const { return processed_; }

 private:
  struct Node {
    std::map<gossip::OpId, std::unique_ptr<gossip::Protocol>> ops;
    std::map<gossip::OpId, std::vector<std::pair<gossip::NodeId, std::vector<std::uint8_t>>>>
        early;  // messages for ops not started yet (bounded)
    std::size_t early_bytes = 0;
    bool alive = true, hung = false;
    dht::Time died{dht::Time::max()};
    dht::Time uplink_free{0};
    double bytes_per_ms = 0;
    double down_bytes_per_ms = 0;  // 0 = unlimited
    dht::Time downlink_free{0};
    std::uint64_t sent = 0;
    double wire_sent = 0;  // bytes as the wire model counts them
    std::uint64_t kill_offset = UINT64_MAX;
    std::map<gossip::OpId, dht::Time> timer_at;
    std::deque<gossip::OpId> finished;  // handed over: late messages for them are dropped
  };
  enum class Kind { deliver, left, timer, peer_failed, die };  // left: a message left its sender
  struct Event {
    dht::Time at{0};
    std::uint64_t seq = 0;
    Kind kind = Kind::timer;
    gossip::NodeId to{}, from{};
    gossip::OpId op{};
    dht::Time tx_end{0};
    std::shared_ptr<std::vector<std::uint8_t>> bytes;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  void push(Event e);
  void collect(const gossip::NodeId& node, gossip::Protocol& p);
  void schedule_timer(const gossip::NodeId& node, gossip::Protocol& p);
  void die(const gossip::NodeId& node, dht::Time at);
  void hand_over(const gossip::NodeId& node, const gossip::OpId& op);
  void step(Event e);
  dht::Time latency(const gossip::NodeId& from, const gossip::NodeId& to);

  GossipLinkModel model_;
  LatencyFn latency_fn_;
  std::function<int(const gossip::NodeId&)> partition_;
  std::function<double(std::span<const std::uint8_t>)> wire_size_;
  std::map<std::pair<gossip::NodeId, gossip::NodeId>, dht::Time> last_arrival_;  // per flow
  std::uint64_t processed_ = 0;
  std::mt19937_64 rng_;
  std::map<gossip::NodeId, Node> nodes_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t seq_ = 0;
  dht::Time now_{0};
  Finished on_finished_;
};

}  // namespace grove::sim
