// The narrow seam between the session layer and the bytes: a Link is an authenticated,
// ordered, reliable pipe of Frames to one proven peer. TcpLink (secure channel over TCP),
// MemLink (in-memory pair) and FaultyLink (a decorator that injects latency, loss, hangs and
// disconnects) implement it; Session, and everything above it, sees only this interface.
//
// Threading: every method is called on the host's strand and every LinkHandler callback runs
// there. A link may use worker threads internally (TcpLink seals and opens frames on them).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "transport/frame.hpp"
#include "transport/identity.hpp"

namespace grove::transport {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

/// Who is at the other end of a link (proven by the handshake).
struct PeerInfo {
  NodeId id{};
  PublicKey key{};
  std::string address;  ///< remote address as seen by us ("host:port" or "mem:N")
  bool inbound = false;
  bool relayed = false;  ///< a connection spliced by a relay (transport/relay.hpp)
  std::string suite;     ///< AEAD suite name, or "none" for in-memory links
};

class LinkHandler {
 public:
  virtual ~LinkHandler() = default;
  virtual void on_frame(Frame f) = 0;
  /// The send queue fell below the link's low-water mark after having been above it.
  virtual void on_writable() = 0;
  /// Called exactly once; no callback follows it. connection_truncated = the byte stream ended.
  virtual void on_closed(std::error_code ec) = 0;
};

class Link {
 public:
  virtual ~Link() = default;
  virtual const PeerInfo& peer() const = 0;
  /// Starts delivering frames. The handler is held weakly: a destroyed handler gets nothing.
  virtual void start(std::weak_ptr<LinkHandler> handler) = 0;
  /// Queues a frame (never blocks). Frames sent after close() are dropped.
  virtual void send(Frame f) = 0;
  /// Fills a frame's payload (on whichever thread the link chooses); false = the data could
  /// not be produced.
  using Fill = std::function<bool(std::span<std::uint8_t> payload)>;
  /// Queues a frame whose payload `fill` writes just before the frame is sealed, on the same
  /// worker (TcpLink), so that producing and encrypting a chunk stay on one core. Order with
  /// send() is kept. If fill fails, `fallback` is sent in the frame's place.
  virtual void send_filled(Frame f, std::span<std::uint8_t> payload, Fill fill, Frame fallback) {
    send(fill(payload) ? std::move(f) : std::move(fallback));
  }
  /// Bytes accepted by send() and not yet handed to the network.
  virtual std::size_t queued_bytes() const = 0;
  /// Closes the link. flush: send what is queued first. on_closed(reason) follows.
  virtual void close(std::error_code reason, bool flush) = 0;
};

/// Sizes a link works with (shared by every implementation).
struct LinkLimits {
  std::size_t max_frame = 16u << 20;         ///< largest record accepted (plaintext + overhead)
  std::size_t low_water = 2u << 20;          ///< on_writable() when queued_bytes() drops below
  std::size_t max_decrypt_ahead = 8u << 20;  ///< TcpLink: received bytes awaiting decryption
  Duration min_frame_time{10000};            ///< a frame body must arrive within this ...
  std::size_t min_frame_rate = 64u << 10;    ///< ... plus size / this many bytes per second
  /// TcpLink: TCP_NOTSENT_LOWAT, the most not-yet-sent bytes the kernel holds per socket (0:
  /// the system default, which lets the send buffer grow to megabytes). The session keeps its
  /// own queue to ~10 ms of sending; without this cap the kernel's buffer adds 25-55 ms on a
  /// 1 Gbit/s link in front of every credit and confirmation (measured, bench/netns_allreduce.sh).
  std::size_t notsent_lowat = 128u << 10;
  /// TcpLink: seal and open records on the host strand instead of on worker threads (falling
  /// back to the workers only while frames are already queued there, to keep order). Workers
  /// overlap crypto with socket I/O when there are spare cores; without them the hand-offs
  /// cost more than they give (2 vCPUs, two processes: 0.73-0.75 GB/s inline vs 0.67-0.71 GB/s
  /// on workers). Default: inline on machines with at most 2 hardware threads.
  bool inline_crypto = std::thread::hardware_concurrency() <= 2;
};

/// How links are made: TCP with the secure handshake, or an in-memory network.
class Connector {
 public:
  using LinkPtr = std::shared_ptr<Link>;
  virtual ~Connector() = default;
  /// Starts accepting. `admit` is asked before a handshake is started; each authenticated
  /// inbound link goes to `on_link`. Returns the bound address. ConfigError on bad addresses.
  virtual std::string listen(const std::string& address, std::function<bool()> admit,
                             std::function<void(LinkPtr)> on_link) = 0;
  /// Dials and authenticates; `expected` makes a different peer identity fail with wrong_peer.
  virtual void dial(const std::string& address, std::optional<NodeId> expected, Duration timeout,
                    std::function<void(Result<LinkPtr>)> done) = 0;
  /// A dial-back check: connects to `address` and proves that the node listening there is
  /// `expected` (its part of the handshake), then closes without opening a session (the
  /// listener sees a handshake that was not finished). wrong_peer, unreachable, timed_out.
  virtual void probe(const std::string& address, const NodeId& expected, Duration timeout,
                     std::function<void(std::error_code)> done) = 0;
  /// Stops accepting and aborts pending dials/handshakes.
  virtual void close() = 0;
};

}  // namespace grove::transport
