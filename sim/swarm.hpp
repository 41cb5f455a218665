// A whole swarm in virtual time: every node runs the real DHT node, membership, round engine
// (gossip/round.hpp) and node controller (node/controller.hpp: join attempts, patience, overlap
// mixing, dropped phases, checkpoint cadence, graceful leave — grove-node's own policy, not a
// copy of it) over sim::DhtNetwork, its averaging operations over sim::GossipNetwork, and
// its state sync requests over a modelled request/response channel. The inner phase is modelled:
// a node "trains" for its inner_time, moving θ from φ towards its own target vector (a quadratic
// objective per node, so the swarm's optimum is the mean of the targets). One clock drives all
// three: the loop takes the earliest pending event of the DHT network, the gossip network, the
// state channel and the nodes' own deadlines, and runs everything due at that instant. Only the
// nodes something happened to are looked at (a queue of wake-ups and a touched set), so a step
// costs the same with 16 or 4096 nodes.
//
// Scale experiments add: a NetModel (regions, per-node access rates, jitter, loss), a Workload
// (sim/workload.hpp) whose inner phase is real optimizer steps, graceful leaves besides kills, and
// per-node step times from NodeSpec. The same seed gives the same run, bit for bit.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <vector>

#include "dht/membership.hpp"
#include "gossip/round.hpp"
#include "node/controller.hpp"
#include "sim/dht_network.hpp"
#include "sim/gossip_network.hpp"
#include "sim/net_model.hpp"
#include "sim/workload.hpp"

namespace grove::sim {

struct SwarmOptions {
  LinkModel dht_link{Time(10), Time(0), 0.0, true};
  GossipLinkModel gossip_link{};
  dht::DhtOptions dht{};
  dht::MembershipOptions membership{};
  gossip::RoundOptions round{};
  std::string run_id = "sim-run";
  std::size_t params = 1024;  ///< values in φ
  /// Parameters the state stands for (0: `params`). A larger figure models a model of that size
  /// with a φ of `params` values: every payload byte on the gossip network and every byte of a
  /// state reply takes the time of stands_for / params bytes, and the options given in bytes
  /// per second (the least rates of op deadlines and state sync) are divided by that factor, as
  /// the cores see the small byte counts. A simulated chunk stands for that many more values
  /// than a real one, so the silence timeouts (the cores' chunk_timeout, the controller's
  /// join_wait) grow by the factor a simulated piece (a chunk, a state chunk) stands for over a
  /// real one (2^18 values, snapshot_chunk bytes). Deadlines from sizes and rates are unchanged.
  double stands_for = 0;
  float inner_lr = 0.5f;  ///< θ = φ + inner_lr·(target − φ)
  /// What the nodes train; empty: every node pulls θ towards its own target (above). When set,
  /// `params` is taken from it.
  std::shared_ptr<Workload> workload;
  /// Regions and access lines; empty: the single links above.
  std::optional<NetModel> net;
  /// The nodes' policy (node::Controller); `window` and `overlap` are set per node from `round`
  /// and the NodeSpec.
  node::ControllerOptions control{};
};

/// Short windows, polls and timeouts (2 s matchmaking windows, 1 s membership polls) for
/// simulated swarms that should show many rounds in little virtual time: the tests' preset.
SwarmOptions fast_options(gossip::OuterMode mode);

struct NodeSpec {
  Time inner_time{1000};      ///< the inner phase's duration
  std::vector<float> target;  ///< empty: drawn from the seed
  /// Overlap: the next inner phase starts as soon as θ is submitted and trains on its own fast
  /// weights; when the round's new φ arrives they are mixed (RoundEngine::mix). Without it the
  /// node waits for the round and restarts from φ.
  bool overlap = false;
  /// The outer step's duration (the engine's StepJob: a large model's step, hash and
  /// serialisation take seconds, off the DHT's thread). The node's DHT goes on answering
  /// meanwhile; zero runs it at once. (A DiLoCo round's prepare job, one read of φ and θ, runs
  /// at once.)
  Time step_time{0};
  /// Called with θ after each inner phase (its 0-based number): tests make a phase diverge.
  std::function<void(std::size_t phase, std::span<float> theta)> after_inner{};
};

class Swarm {
 public:
  Swarm(std::uint64_t seed, SwarmOptions opts);
  ~Swarm();

  /// The first node: creates the run with φ = 0 (round 0).
  std::size_t bootstrap(NodeSpec spec = {});
  /// A node that joins through `via` (its address in the DHT) and syncs its state; its controller
  /// decides how often it tries before it gives up (it is then no longer alive).
  std::size_t join(std::size_t via, NodeSpec spec = {});
  void kill(std::size_t i);
  /// Graceful leave (node::Controller::stop): no new inner phase, the round in flight ends
  /// (bounded by control.stop_grace), the member record says "leaving", then the node stops.
  void leave(std::size_t i);
  bool leaving(std::size_t i) const;
  bool alive(std::size_t i) const;
  std::size_t alive_count() const;
  std::size_t size() const { return nodes_.size(); }

  gossip::RoundEngine& engine(std::size_t i);
  dht::Membership& membership(std::size_t i);
  /// Node i's outcomes: its rounds and syncs (sync_progress reports go to its controller and
  /// the on_report watcher only).
  const std::vector<gossip::RoundReport>& reports(std::size_t i) const;
  const std::vector<float>& target(std::size_t i) const;
  gossip::NodeId id(std::size_t i);
  /// Rounds that ended (kind round) on node i.
  std::size_t rounds(std::size_t i) const;
  /// Node i's controller (its policy state: patience, dropped phases, ...).
  const node::Controller& controller(std::size_t i) const;
  /// Checkpoints node i's controller asked for (the simulator writes none), and its join attempts.
  std::size_t checkpoints(std::size_t i) const;
  int join_attempts(std::size_t i) const;
  /// State requests (manifest or chunk) that reached node i as a donor.
  std::size_t state_requests(std::size_t i) const;
  /// Time node i spent in inner phases ÷ the time since its first inner phase began.
  double utilization(std::size_t i) const;
  /// Where node i was placed (with a NetModel).
  NetModel::Placement placement(std::size_t i) const;
  /// The workload's loss at node i's slow weights (needs SwarmOptions::workload); NaN while its
  /// outer step runs (NodeSpec::step_time: φ is with the step).
  double loss(std::size_t i) const;
  const SwarmOptions& options() const { return opts_; }
  /// Called with every report as it happens.
  void on_report(std::function<void(std::size_t, const gossip::RoundReport&)> f) {
    watch_ = std::move(f);
  }

  Time now() const { return now_; }
  void run_until(Time t);
  void run_for(Time d) { run_until(now_ + d); }
  /// Runs until pred() holds (checked after every instant) or `limit` of virtual time passes.
  bool run_until(const std::function<bool()>& pred, Time limit);

  DhtNetwork& dht_network() { return dht_; }
  GossipNetwork& gossip_network() { return gossip_; }

 private:
  struct Node;
  struct Reply {
    Time at{0};
    std::uint64_t seq = 0;
    std::size_t to = 0;
    std::uint64_t id = 0;
    bool ok = false;
    std::vector<std::uint8_t> body;
    bool operator>(const Reply& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  struct PendingStep {
    Time at{0};
    std::uint64_t seq = 0;
    std::size_t to = 0;
    gossip::RoundEngine::StepJob job;
    bool operator>(const PendingStep& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  std::size_t add(NodeSpec spec);
  void step(Time t);
  void visit(std::size_t i);    // inner phase, timers, leave, service; then its next wake-up
  void service(std::size_t i);  // drains the engine's queues, runs the controller's actions
  bool drain(std::size_t i);    // the engine's queues once; true when something came out
  bool act(std::size_t i);      // the controller's actions; true when there were any
  void end_step(std::size_t i, gossip::RoundEngine::StepJob& job);  // runs it, hands it back
  std::optional<Time> deadline(std::size_t i) const;
  void reschedule(std::size_t i);
  void inner_phase(std::size_t i, std::span<float> theta);

  SwarmOptions opts_;
  std::uint64_t seed_;
  DhtNetwork dht_;
  GossipNetwork gossip_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::priority_queue<Reply, std::vector<Reply>, std::greater<>> replies_;
  std::priority_queue<PendingStep, std::vector<PendingStep>, std::greater<>> steps_;
  std::uint64_t seq_ = 0;
  double scale_ = 1;  // stands_for / params
  Time now_{0};
  std::set<std::pair<Time, std::size_t>> wake_;  // (time, node), one entry per live node
  std::set<std::size_t> touched_;                // nodes to visit at this instant
  std::map<gossip::NodeId, std::size_t> index_;  // gossip id → node
  std::function<void(std::size_t, const gossip::RoundReport&)> watch_;
};

}  // namespace grove::sim
