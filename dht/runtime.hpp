// The real driver of the sans-IO DHT: feeds a DhtNode (and the run memberships riding on it)
// with messages from a transport::Host (method "dht", one-way messages over the secure
// sessions), the wall clock and one steady_timer, and sends what the node queues. Everything
// runs on the host's strand; the public methods may be called from any thread and their
// callbacks run on that strand.
#pragma once

#include <set>

#include <boost/asio/steady_timer.hpp>

#include "dht/membership.hpp"
#include "dht/node.hpp"
#include "transport/host.hpp"

namespace grove::dht {

class DhtRuntime : public std::enable_shared_from_this<DhtRuntime> {
 public:
  /// A sans-IO component driven on the strand together with the DHT node (the round engine):
  /// its deadlines join the DHT's timer, and after_event() runs after every event the node
  /// handled, so that it can pass on what the node's callbacks produced.
  class Rider {
   public:
    virtual ~Rider() = default;
    virtual void on_timer(Time now) = 0;
    virtual std::optional<Time> next_deadline() const = 0;
    virtual void after_event() = 0;
  };

  /// Registers the "dht" handler on `host`: call before host->start().
  static std::shared_ptr<DhtRuntime> create(std::shared_ptr<transport::Host> host, DhtOptions opts,
                                            std::uint64_t seed);
  ~DhtRuntime();

  /// After host->start(): learns our address (`advertise` overrides the listen address, for a
  /// node behind a port mapping or listening on 0.0.0.0) and arms the timer.
  void start(std::string advertise = {});
  /// The address we put in our messages from now on ("" = we accept no connections: peers do
  /// not add us to their tables, they answer over the connections we open).
  void set_address(std::string address);
  /// Stops the timer; pending callbacks are dropped. Call before host->shutdown().
  void stop();

  /// Runs fn(node, now) on the strand, then sends whatever it queued.
  void post(std::function<void(DhtNode&, Time)> fn);
  /// post(), and waits until fn has run (rethrows what it threw); never from the strand.
  void post_wait(const std::function<void(DhtNode&, Time)>& fn);
  void bootstrap(std::vector<std::string> peers, std::function<void(std::size_t)> done = {});
  void add_contact(std::string address);
  void get(const Key& key, DhtNode::GetCallback done, GetOptions opts = {});
  void put_signed(const Key& key, std::string subkey, std::uint64_t seq, Time ttl,
                  std::vector<std::uint8_t> value, DhtNode::PutCallback done = {});
  /// Joins a run: our member record is published and refreshed; the view is kept current.
  /// The returned object is used on the strand only (watch() before the first poll is safest
  /// from inside post()).
  std::shared_ptr<Membership> join(const std::string& run_id, MembershipOptions opts,
                                   MemberInfo self);

  /// Adds a rider (strand only, e.g. from inside post()); it is dropped once it expires.
  void add_rider(std::weak_ptr<Rider> r);
  /// Re-reads the riders' deadlines (strand only; after a rider changed them outside an event).
  void rearm() { arm(); }

  /// Wall-clock milliseconds since the epoch (the DHT's time base).
  static Time wall_now();
  boost::asio::any_io_executor executor() const { return host_->executor(); }
  const std::string& address() const { return address_; }

 private:
  DhtRuntime(std::shared_ptr<transport::Host> host, DhtOptions opts, std::uint64_t seed);
  void on_message(const transport::PeerInfo& from, transport::Payload body);
  void pump();
  void arm();

  std::shared_ptr<transport::Host> host_;
  std::unique_ptr<DhtNode> node_;
  boost::asio::steady_timer timer_;
  Time armed_for_ = Time::max();
  std::vector<std::shared_ptr<Membership>> runs_;
  std::vector<std::weak_ptr<Rider>> riders_;
  std::string address_;
  bool stopped_ = false;
};

}  // namespace grove::dht
