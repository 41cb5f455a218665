// GossipRuntime: the Asio driver of the averaging cores (gossip/protocol.hpp) over a
// transport::Host. Every gossip message travels as one transport stream of kind "gossip"
// (credit flow control, so a 64 MB segment queued at once never floods the connection), with
// meta = op (16 bytes) ‖ sequence number (u64 BE) per (op, sender → receiver). At most
// `streams_per_peer` streams are in flight to one peer, over all ops; the receiver re-orders
// completed streams by sequence number, so a core sees its peer's messages in the order they were
// sent (an abort before the retry's data). A stream that fails either way reports on_peer_failed to
// the op's core; messages for an op that has not started here yet wait in a bounded buffer.
//
// Threads: the cores run on the runtime's own strand on the transport worker pool (encoding and
// decoding of large tensors stay off the host strand); Host calls are thread-safe.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "gossip/protocol.hpp"
#include "transport/host.hpp"

namespace grove::gossip {

struct RuntimeOptions {
  /// Streams in flight to one peer, over all ops. Enough of them keep a link busy while each
  /// waits for its credit and its confirmation (on a 1 Gbit/s link whose queues add ~20 ms
  /// each way, 8 streams of 512 KiB left it idle a third of the time); at most the peer's
  /// SessionOptions::max_incoming_streams (default 16), or the peer refuses the extra ones.
  std::size_t streams_per_peer = 16;
  std::size_t max_message = 16u << 20;
  std::size_t max_early_bytes = 256u << 20;  ///< buffered messages for ops not started yet
  std::size_t max_reorder = 1024;            ///< out-of-order messages held per (op, peer)
  Time early_ttl{120000};                    ///< how long early messages wait for their op
};

class GossipRuntime : public std::enable_shared_from_this<GossipRuntime> {
 public:
  /// Registers the "gossip" stream kind on `host` (call before host->start()).
  static std::shared_ptr<GossipRuntime> create(std::shared_ptr<transport::Host> host,
                                               RuntimeOptions opts = {});
  /// Called on the runtime's strand with the finished core.
  using Done = std::function<void(std::unique_ptr<Protocol>)>;
  /// Runs `p` until it finishes. `addresses` tells where to dial members that have no session.
  void start(std::unique_ptr<Protocol> p, std::map<NodeId, std::string> addresses, Done done);
  /// Builds the operation on the gossip strand (make(now): encoding a large tensor takes time
  /// that the caller's thread should not spend), then starts it. A make that throws ends the
  /// operation at once: done(nullptr).
  using Make = std::function<std::unique_ptr<Protocol>(Time now)>;
  void start(Make make, std::map<NodeId, std::string> addresses, Done done);
  /// Runs fn(op's core) on the runtime's strand, then sends what the core has to send and sets
  /// its timer: how a driver calls into a core that lives long (a run's step calls) from its own
  /// thread. Nothing happens when the op is not running.
  void with(const OpId& op, std::function<void(Protocol&)> fn);
  /// Replaces the addresses an op dials its members at (a long-lived op's members change).
  void set_addresses(const OpId& op, std::map<NodeId, std::string> addresses);
  /// Steady-clock milliseconds: the time base of every core run here.
  static Time now();
  boost::asio::any_io_executor executor() const { return strand_; }

 private:
  struct Op {
    std::unique_ptr<Protocol> p;
    std::map<NodeId, std::string> addresses;
    Done done;
    std::unique_ptr<boost::asio::steady_timer> timer;
    Time timer_at{Time::max()};
  };
  struct OutQueue {
    std::deque<Bytes> q;
    std::size_t in_flight = 0;
    std::uint64_t next_seq = 0;
    bool failed = false;
    std::string address;
  };
  struct InOrder {
    std::uint64_t next = 0;
    std::map<std::uint64_t, Bytes> held;
  };
  using Key = std::pair<OpId, NodeId>;

  GossipRuntime(std::shared_ptr<transport::Host> host, RuntimeOptions opts);
  void begin(std::unique_ptr<Protocol> p, std::map<NodeId, std::string> addresses, Done done);
  void on_stream_end(const NodeId& from, const OpId& op, std::uint64_t seq, Bytes data,
                     std::error_code ec);
  void deliver(const NodeId& from, const OpId& op, Bytes data);
  void flush(const OpId& op);
  void pump(const Key& k);
  void stream_done(const Key& k, std::error_code ec);
  void peer_failed(const OpId& op, const NodeId& peer);
  void arm(const OpId& op, Op& o);

  std::shared_ptr<transport::Host> host_;
  RuntimeOptions opts_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  std::map<OpId, Op> ops_;
  struct Early {
    NodeId from{};
    Bytes data;
    Time at{0};
  };
  std::map<OpId, std::vector<Early>> early_;
  std::deque<OpId> finished_;  // recent ops: late messages for them are dropped
  std::size_t early_bytes_ = 0;
  std::map<Key, OutQueue> out_;
  std::map<NodeId, std::size_t> in_flight_;  // streams in flight per peer
  std::map<Key, InOrder> in_;
};

}  // namespace grove::gossip
