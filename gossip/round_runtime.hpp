// RoundRuntime: the Asio driver of a RoundEngine (gossip/round.hpp) in the real node. The engine
// rides on the DHT runtime's strand (dht::DhtRuntime::Rider): its deadlines join the DHT timer and
// after every DHT event the runtime passes on what the engine produced:
//   - group operations → GossipRuntime::start, built on the gossip strand with its clock; the
//     finished core comes back to the engine on the DHT strand;
//   - step jobs (a round's outer step, φ's hash, the state's serialised form) → run on a thread
//     of the runtime's own, then on_step_done on the DHT strand (seconds for a large model, when
//     the DHT would otherwise not answer);
//   - snapshot jobs → hashed into a StateSnapshot on another thread of its own, handed back
//     on the DHT strand (a state of hundreds of MB takes seconds to hash);
//   - state requests → transport requests "state" to the donor (each with its deadline); answers
//     and failures come back to the engine;
//   - reports → the node's callback (on the DHT strand).
// serve_state() registers the "state" request handler that answers joiners from a StateServer
// (on its own two threads: reads of file-backed snapshots never run on the host strand);
// it must run before host->start() and the server is shared with the engine, which adds a
// snapshot after every round (StateServer is thread-safe).
#pragma once

#include <boost/asio/thread_pool.hpp>

#include "dht/runtime.hpp"
#include "gossip/round.hpp"
#include "gossip/runtime.hpp"

namespace grove::gossip {

/// Answers "state" requests (manifest and chunk requests of joiners) from `server`.
void serve_state(transport::Host& host, std::shared_ptr<StateServer> server);

class RoundRuntime : public dht::DhtRuntime::Rider,
                     public std::enable_shared_from_this<RoundRuntime> {
 public:
  /// Takes the report (a round's carries θ's buffer back: moved, never copied).
  using ReportFn = std::function<void(RoundReport&&)>;
  /// `members` is the run's membership from dht->join(). Reports go to `on_report`.
  static std::shared_ptr<RoundRuntime> create(
      std::shared_ptr<transport::Host> host, std::shared_ptr<dht::DhtRuntime> dht,
      std::shared_ptr<GossipRuntime> gossip, std::shared_ptr<dht::Membership> members,
      std::shared_ptr<StateServer> server, std::string run_id, std::vector<std::string> addresses,
      RoundOptions opts, ReportFn on_report);

  // Thread-safe: each posts to the DHT strand.
  void start(optim::OuterState state);
  void join(std::optional<std::size_t> values = std::nullopt);
  /// θ after the inner steps; ignored with an error line when a round is still in flight.
  void submit(optim::Floats theta);
  void request_mode(OuterMode mode, std::optional<std::uint64_t> from_round,
                    std::function<void(transport::Result<std::uint64_t>)> done);
  /// Runs fn(engine) on the strand (reading state, mixing θ).
  void with_engine(std::function<void(RoundEngine&)> fn);
  /// with_engine, and waits until fn has run (never call it from the strand).
  void with_engine_wait(const std::function<void(RoundEngine&)>& fn);

  // dht::DhtRuntime::Rider (strand)
  void on_timer(dht::Time now) override;
  std::optional<dht::Time> next_deadline() const override;
  void after_event() override;

 private:
  RoundRuntime(std::shared_ptr<transport::Host> host, std::shared_ptr<dht::DhtRuntime> dht,
               std::shared_ptr<GossipRuntime> gossip, std::shared_ptr<dht::Membership> members,
               ReportFn on_report);

  std::shared_ptr<transport::Host> host_;
  std::shared_ptr<dht::DhtRuntime> dht_;
  std::shared_ptr<GossipRuntime> gossip_;
  std::shared_ptr<dht::Membership> members_;
  ReportFn on_report_;
  std::unique_ptr<RoundEngine> engine_;  // created on the strand
  // Run the steps and build the snapshots (hashing) off the strand; declared last: joined first
  // when destroyed. Two threads: a round's step does not wait behind the last round's snapshot.
  boost::asio::thread_pool step_pool_{1};
  boost::asio::thread_pool snapshot_pool_{1};
};

}  // namespace grove::gossip
