// Fault injection for tests (this kernel has no netem): a Link decorator that delays, drops,
// throttles, hangs or cuts frames, configured per peer through a shared FaultPlan. It wraps a
// TcpLink or a MemLink alike, so the same knobs work over real sockets and in memory.
//
// Knobs act on frames this side sends (latency, jitter, bandwidth, loss, packet_loss,
// fail_after_frames);
// a frame is first serialised at the bandwidth (it waits in the link's queue, as in a router's
// buffer) and then travels for the latency (in flight, like bytes inside the network: they no
// longer count in queued_bytes(), so a sender keeps a bandwidth-delay product in flight as it
// would over TCP; on_writable() fires as the queue drains, not when frames arrive);
// `hang` swallows frames in both directions (a frozen peer: nothing arrives, nothing is
// answered, the connection stays open); FaultPlan::disconnect() cuts links abruptly.
// Two kinds of loss: `loss` makes a frame vanish (a message lost inside a live session, which a
// reliable stream never does: for tests of what a lost message does to a protocol), and
// `packet_loss` is what loss on an IP path does to a TCP connection (what --emulate-link
// models): a frame of S bytes spans ceil(S / 1448) packets, and when one of them is lost the
// frame arrives a retransmission timeout late (Linux: at least 200 ms, plus the round trip),
// holding back every frame behind it (in-order delivery; nothing new is sent meanwhile).
// Random choices come from the plan's seeded generator: the same seed drops the same frames.
#pragma once

#include <deque>
#include <map>
#include <random>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "transport/link.hpp"

namespace grove::transport {

struct FaultConfig {
  Duration latency{0};                 ///< one-way delay added to every sent frame
  Duration jitter{0};                  ///< plus a uniform random extra delay in [0, jitter]
  double bandwidth_bytes_per_sec = 0;  ///< serialisation rate limit; 0 = unlimited
  double loss = 0;                     ///< probability that a sent frame silently vanishes
  double packet_loss = 0;              ///< TCP over a lossy path: a frame late by an RTO per loss
  bool hang = false;                   ///< swallow every frame both ways, keep the link open
  std::size_t fail_after_frames = 0;   ///< cut the link when sending frame N+1 (0 = never)
};

class FaultyLink;

/// Fault settings shared by all links of a host. Use on the host's strand only.
class FaultPlan {
 public:
  explicit FaultPlan(std::uint64_t seed = 1) : rng_(seed) {}
  void set_default(const FaultConfig& c) { default_ = c; }
  void set(const NodeId& peer, const FaultConfig& c) { per_peer_[peer] = c; }
  void clear(const NodeId& peer) { per_peer_.erase(peer); }
  const FaultConfig& config_for(const NodeId& peer) const;
  /// Cuts every live link to `peer` now (both sides see the connection end).
  void disconnect(const NodeId& peer);

  std::uint64_t frames_dropped() const noexcept { return dropped_; }
  /// Frames held back a retransmission timeout by packet_loss.
  std::uint64_t frames_retransmitted() const noexcept { return retransmitted_; }
  std::uint64_t frames_swallowed() const noexcept { return swallowed_; }

 private:
  friend class FaultyLink;
  std::mt19937_64 rng_;
  FaultConfig default_;
  std::map<NodeId, FaultConfig> per_peer_;
  std::vector<std::weak_ptr<FaultyLink>> links_;
  std::uint64_t dropped_ = 0, swallowed_ = 0, retransmitted_ = 0;
};

class FaultyLink final : public Link,
                         public LinkHandler,
                         public std::enable_shared_from_this<FaultyLink> {
 public:
  static std::shared_ptr<FaultyLink> wrap(std::shared_ptr<Link> inner,
                                          std::shared_ptr<FaultPlan> plan,
                                          boost::asio::any_io_executor ex);
  FaultyLink(std::shared_ptr<Link> inner, std::shared_ptr<FaultPlan> plan,
             boost::asio::any_io_executor ex);

  const PeerInfo& peer() const override { return inner_->peer(); }
  void start(std::weak_ptr<LinkHandler> handler) override;
  void send(Frame f) override;
  /// The inner link's queue plus the frames not serialised yet (not those in flight).
  std::size_t queued_bytes() const override;
  void close(std::error_code reason, bool flush) override;

  // LinkHandler (from the inner link)
  void on_frame(Frame f) override;
  void on_writable() override;
  void on_closed(std::error_code ec) override;

  void cut();

 private:
  struct Delayed {
    Clock::time_point sent;  ///< serialised (left the queue, in flight from here)
    Clock::time_point at;    ///< delivered
    Frame frame;
  };
  /// Moves the frames serialised by `now` out of the queue; true if any moved.
  bool serialise(Clock::time_point now);
  void arm();
  void release();

  std::shared_ptr<Link> inner_;
  std::shared_ptr<FaultPlan> plan_;
  boost::asio::steady_timer timer_;
  std::weak_ptr<LinkHandler> handler_;
  std::deque<Delayed> delayed_;
  // delayed_[0, in_flight_) are serialised; the rest, queued_ bytes, wait to be. Both move on
  // the timer only: the queue drains in steps the session hears of (on_writable()). Counting
  // drained frames before the session is told made its drain meter see an empty queue whenever
  // it looked late (sanitized builds), overrate the link and queue more data ahead of control
  // frames.
  std::size_t in_flight_ = 0;
  std::size_t queued_ = 0;
  Clock::time_point last_at_{}, busy_until_{}, timer_at_{};
  std::size_t sent_ = 0;
  bool closed_ = false;
  bool timer_armed_ = false;
};

}  // namespace grove::transport
