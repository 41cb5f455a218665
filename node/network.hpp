// Network: a node's network stack and what runs on its host strand. It owns the io thread, the
// Host (secure transport, listening), the DHT runtime, the gossip runtime, the "state" server for
// joiners, the dial-back checks it serves, LAN discovery (named after the swarm key), the UPnP
// port mapping, the run records ("grove-runs": every member publishes the run's config and
// refreshes it every 6 h; joiners read it back), and the driver of ReachUpkeep: it asks helpers
// and relays what the upkeep decides and puts what we advertise into the DHT, the member record
// and the round engine.
//
// Threads: the constructor, bootstrap(), find_run(), check_reach_now(), advertised(), attach(),
// stats() and shutdown() are called from the node's main thread and post to (and wait for) the
// host strand; everything else of this class runs on that strand and owns its fields.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "dht/lan_discovery.hpp"
#include "dht/runtime.hpp"
#include "gossip/round_runtime.hpp"
#include "node/cli.hpp"
#include "node/port_mapping.hpp"
#include "node/reach_upkeep.hpp"
#include "node/servers.hpp"
#include "transport/crypto.hpp"
#include "transport/identity.hpp"
#include "transport/relay.hpp"

namespace grove::node {

/// A node's seed for its own generators and sample stream: the first 8 bytes of its id.
std::uint64_t seed_of(const transport::NodeId& id);

class Network {
 public:
  /// Builds and starts the stack; `register_handlers` runs before the host starts listening (the
  /// node's own request servers). Throws transport::ConfigError.
  Network(const CliOptions& o, const transport::Identity& identity,
          std::optional<transport::SwarmKey> swarm_key,
          const std::function<void(const std::shared_ptr<transport::Host>&)>& register_handlers);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const std::shared_ptr<transport::Host>& host() const { return host_; }
  const std::shared_ptr<dht::DhtRuntime>& dht() const { return dht_; }
  const std::shared_ptr<gossip::GossipRuntime>& gossip() const { return gossip_; }
  const std::shared_ptr<gossip::StateServer>& state_server() const { return server_; }
  /// The address printed for others to join with.
  const std::string& advertise() const { return advertise_; }

  /// Pings the --peer contacts; throws ConfigError when none answers within 30 s.
  void bootstrap(const std::vector<std::string>& peers);
  /// A node restarted without --peer: pings the contacts it saved (up to 30 s), then, when none
  /// answered, waits up to `lan_wait` for a node of the swarm found on the LAN. Whether the DHT
  /// knows another node then.
  bool rejoin(const std::vector<std::string>& contacts, std::chrono::milliseconds lan_wait,
              const std::atomic<bool>& stopping);
  /// Whether LAN discovery runs (an Avahi daemon answered).
  bool lan_discovery() const { return lan_ != nullptr; }
  /// The run `name` (or the only one) among those published; throws ConfigError after 30 s, or
  /// when the swarm has several and none was named.
  std::pair<std::string, RunConfig> find_run(const std::optional<std::string>& name,
                                             const std::atomic<bool>& stopping);
  /// Publishes the run's config now and every 6 h.
  void publish_run(const RunConfig& config);
  /// A joiner asks peers to dial its candidates back before it advertises anything (≤ 15 s).
  void check_reach_now();
  /// What we advertise now and our reachability (for the first member record).
  std::pair<std::vector<std::string>, transport::Reachability> advertised();
  /// From now on what we advertise goes into the member record and the round engine, and an
  /// unreachable node keeps relays among the members.
  /// The servers learn the stack too.
  void attach(std::shared_ptr<dht::Membership> members, std::shared_ptr<gossip::RoundRuntime> round,
              Servers& servers);
  /// Calls fn(signal) on SIGINT/SIGTERM (on the strand).
  void on_signal(std::function<void(int)> fn);
  /// No more checks, renewals or port mapping changes (the node is stopping; any thread).
  void stop();

  struct Stats {
    transport::HostStats host;
    transport::RelayStats relay;
    transport::Reachability reach = transport::Reachability::unchecked;
  };
  Stats stats();
  /// Removes the port mapping, stops the DHT and the host, joins the io thread.
  void shutdown();

 private:
  using Time = std::chrono::milliseconds;
  static Time now();
  /// The rest of the constructor (after the host listens): LAN, reachability, UPnP.
  void start(const CliOptions& o, const std::optional<transport::SwarmKey>& swarm_key);
  // host strand
  void pump();
  void arm();
  void run_check(Time now, std::function<void()> done);
  void run_renewal(Time now);
  void publish();

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{
      io_.get_executor()};
  std::thread io_thread_;
  std::shared_ptr<transport::Host> host_;
  std::shared_ptr<dht::DhtRuntime> dht_;
  std::shared_ptr<gossip::GossipRuntime> gossip_;
  std::shared_ptr<gossip::StateServer> server_ = std::make_shared<gossip::StateServer>();
  std::unique_ptr<PortMapper> upnp_;
  std::unique_ptr<dht::LanDiscovery> lan_;
  std::string advertise_;
  bool keyed_ = false;  // a swarm key is set (the refusal's words)
  bool shut_ = false;
  // host strand from here on
  std::optional<ReachUpkeep> upkeep_;
  std::optional<boost::asio::steady_timer> timer_, run_timer_;
  std::optional<boost::asio::signal_set> signals_;
  std::shared_ptr<dht::Membership> members_;
  std::shared_ptr<gossip::RoundRuntime> round_;
  std::pair<std::vector<std::string>, transport::Reachability> published_;
};

}  // namespace grove::node
