// Host: a node's endpoint on the network. It owns the connector (TCP or in-memory), the table
// of sessions (one per connected peer, reused for every operation), the limits on connections
// and handshakes, and the method/stream-kind handler registry. Upper layers (dht, gossip)
// talk to peers only through a Host.
//
// Threading: every operation may be called from any thread; its callback runs on the host's
// strand. Register handlers before start(). Callers address peers with a PeerRef: by node id
// (reusing a live session) and/or by address (dialing when there is no session; a given id is
// then checked against the identity the peer proves).
#pragma once

#include <map>
#include <set>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "transport/faulty_link.hpp"
#include "transport/mem_link.hpp"
#include "transport/relay.hpp"
#include "transport/session.hpp"

namespace grove::transport {

/// The process-wide worker pool used for sealing/opening frames and pulling stream data.
/// Created on first use and never destroyed (links may outlive any one host).
boost::asio::thread_pool& worker_pool();
/// Sets the pool size; only effective before the first worker_pool() call (later calls are
/// ignored). Default 2.
void configure_worker_pool(std::size_t threads);
/// Waits until every task queued on the worker pool before this call has run. Call after the
/// hosts shut down and before their io_context is destroyed (tasks post results back to it).
void quiesce_worker_pool();

struct PeerRef {
  std::optional<NodeId> id;
  std::string address;
  static PeerRef at(std::string addr) { return {std::nullopt, std::move(addr)}; }
  static PeerRef node(const NodeId& id, std::string addr = {}) { return {id, std::move(addr)}; }
};

struct HostOptions {
  std::string listen = "127.0.0.1:0";  ///< "" = dial-only; "mem" address ignored in memory
  std::optional<SwarmKey> swarm_key;
  std::size_t max_connections = 256;
  std::size_t max_half_open = 32;
  Duration handshake_timeout{10000};
  Duration connect_timeout{10000};
  /// A second session with a peer (both dialed at once) closes after this long with nothing in
  /// flight on it; the other one carries all new traffic.
  Duration duplicate_grace{2000};
  LinkLimits link;
  SessionOptions session;
  RelayOptions relay;  ///< TCP hosts relay for nodes that accept no connections (relay.hpp)
  /// Connection reversal (relay.hpp): how long a dial through a relay waits for the unreachable
  /// node to dial us back before it opens a relayed circuit instead.
  Duration dialback_wait{4000};
  std::shared_ptr<FaultPlan> faults;        ///< test knob: wrap every link in a FaultyLink
  std::shared_ptr<MemNetwork> mem_network;  ///< test knob: in-memory links instead of TCP
};

struct HostStats {
  std::size_t sessions = 0;
  std::size_t half_open = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t handshakes_ok = 0, dials_failed = 0;
  std::uint64_t duplicate_sessions = 0;  ///< second sessions with a peer (simultaneous dials)
  std::uint64_t dialbacks = 0;  ///< direct sessions an unreachable node opened at our request
};

class Host;

/// Cancels a request started with Host::request (from any thread).
class RequestHandle {
 public:
  RequestHandle() = default;
  void cancel();

 private:
  friend class Host;
  struct Ctl;
  std::weak_ptr<Host> host_;
  std::shared_ptr<Ctl> ctl_;
};

class Host final : public SessionOwner, public std::enable_shared_from_this<Host> {
 public:
  using RequestHandler = std::function<void(const PeerInfo&, Payload, Responder)>;
  using MessageHandler = std::function<void(const PeerInfo&, Payload)>;
  using StreamAcceptor =
      std::function<std::shared_ptr<StreamSink>(const PeerInfo&, IncomingStream&)>;

  /// Throws ConfigError for unusable options. Call start() to listen.
  static std::shared_ptr<Host> create(boost::asio::io_context& io, Identity identity,
                                      HostOptions opts);
  ~Host() override;

  void handle(const std::string& method, RequestHandler h);
  void handle_message(const std::string& method, MessageHandler h);
  void accept_streams(const std::string& kind, StreamAcceptor a);

  /// Binds the listener (ConfigError if it cannot) and starts accepting.
  void start();
  /// The address peers can dial ("127.0.0.1:port", "mem:N"); empty if dial-only.
  const std::string& address() const noexcept { return address_; }
  const Identity& identity() const noexcept { return identity_; }
  const NodeId& id() const noexcept { return identity_.id(); }
  boost::asio::any_io_executor executor() const { return strand_; }

  /// The deadline covers dialing and the handshake as well as the answer.
  RequestHandle request(const PeerRef& to, const std::string& method, Bytes body, Duration timeout,
                        ResponseHandler handler);
  /// One-way message; `sent` (optional) reports whether it was queued on a connection.
  void send(const PeerRef& to, const std::string& method, Bytes body,
            std::function<void(std::error_code)> sent = {});
  /// Streams `source` to the peer; done(ok) once the peer confirmed every byte.
  void send_stream(const PeerRef& to, const std::string& kind, Bytes meta,
                   std::shared_ptr<StreamSource> source, StreamDone done);
  /// Connects (or reuses a session) and reports who answered. A PeerRef with an id and no
  /// address (a node that accepts no connections) is not dialed: every operation on it waits,
  /// until its deadline, for that node to connect to us (then fails with unreachable).
  void connect(const PeerRef& to, std::function<void(Result<PeerInfo>)> done);
  /// Dial-back check: proves that the node listening at `address` is `expected` over a fresh
  /// connection of its own (never a session we already have), without opening a session.
  void probe(const std::string& address, const NodeId& expected, Duration timeout,
             std::function<void(std::error_code)> done);
  /// Reserves a slot at a relay (a reachable node; `relay` must name its id): it then passes on
  /// circuits to us, and others reach us at relay_address(relay id, its address) while our
  /// session with it stays open.
  void reserve_relay(const PeerRef& relay, std::function<void(std::error_code)> done);
  /// Addresses at which others have dialed us (reachability checked; transport/reach.hpp). When
  /// set, a dial through a relay first asks the unreachable node to dial us back at one of them
  /// (connection reversal); empty (the default) = always a relayed circuit.
  void set_dialback_addresses(std::vector<std::string> addresses);
  /// Closes every session with this peer gracefully.
  void disconnect(const NodeId& peer);
  /// Stops accepting, says goodbye to every peer; new operations fail with shutting_down.
  void shutdown();

  /// Snapshot (call on the strand, or after the io_context stopped).
  HostStats stats() const;
  RelayStats relay_stats() const;  ///< on the strand
  std::vector<PeerInfo> peers() const;

  // SessionOwner
  void on_request(Session& s, const std::string& method, Payload body, Responder r) override;
  void on_message(Session& s, const std::string& method, Payload body) override;
  std::shared_ptr<StreamSink> on_stream(Session& s, IncomingStream& in) override;
  void on_session_closed(Session& s, std::error_code ec) override;

 private:
  using SessionPtr = std::shared_ptr<Session>;
  Host(boost::asio::io_context& io, Identity identity, HostOptions opts);
  void with_session(const PeerRef& to, Clock::time_point deadline,
                    std::function<void(Result<SessionPtr>)> cb);
  SessionPtr add_session(std::shared_ptr<Link> link);
  SessionPtr find_session(const PeerRef& to) const;
  void serve_relay();
  void relay_dial(const PeerRef& to, Clock::time_point deadline);
  void relay_circuit(const std::string& addr, const NodeId& relay, const std::string& relay_addr,
                     const NodeId& target, Clock::time_point deadline);
  void dial_back(const NodeId& node, std::vector<std::string> addresses, std::size_t i);
  /// Waits (until `deadline`) for a session with `id` that the peer opens.
  void await_inbound(const NodeId& id, Clock::time_point deadline,
                     std::function<void(Result<SessionPtr>)> cb);
  void dialed(const std::string& addr, Result<std::shared_ptr<Link>> r);
  void finish_dial(const std::string& addr, Result<SessionPtr> r);

  boost::asio::any_io_executor strand_;
  Identity identity_;
  HostOptions opts_;
  std::shared_ptr<Connector> connector_;
  std::string address_;
  bool shut_ = false;

  std::map<std::string, RequestHandler> req_handlers_;
  std::map<std::string, MessageHandler> msg_handlers_;
  std::map<std::string, StreamAcceptor> stream_acceptors_;

  std::set<SessionPtr> sessions_;
  std::map<NodeId, std::weak_ptr<Session>> by_id_;
  std::map<std::string, std::weak_ptr<Session>> by_addr_;
  std::map<std::string, std::vector<std::function<void(Result<SessionPtr>)>>> dialing_;
  struct Awaiting {
    std::uint64_t key;
    std::function<void(Result<SessionPtr>)> cb;
    std::shared_ptr<boost::asio::steady_timer> timer;
  };
  static constexpr std::size_t kMaxAwaiting = 4096;
  std::map<NodeId, std::vector<Awaiting>> awaiting_;  ///< operations waiting for an inbound session
  std::size_t awaiting_count_ = 0;
  std::shared_ptr<RelayServer> relay_;  ///< when we relay for others
  std::set<NodeId> reserved_at_;        ///< relays that pass circuits on to us
  static constexpr std::size_t kMaxRelayedDials = 16;
  std::size_t relayed_dials_ = 0;  ///< relayed connections we are opening at a relay's word
  std::vector<std::string> dialback_addresses_;  ///< set_dialback_addresses
  std::uint64_t await_seq_ = 0;
  HostStats counters_;
  std::uint64_t closed_bytes_sent_ = 0, closed_bytes_received_ = 0;
};

}  // namespace grove::transport
