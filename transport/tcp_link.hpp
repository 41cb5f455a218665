// The secure channel over TCP (Boost.Asio).
//
// Record on the wire: [u32 length][ciphertext][16-byte tag]; the length is authenticated as
// associated data, the nonce is an implicit per-direction counter (see crypto.hpp), so any
// replayed, reordered, dropped or altered record fails to open and the link closes.
//
// Pipelining (so that crypto and the socket do not serialise each other): frames are sealed
// on a worker strand while the host strand writes earlier ones; received records are opened
// on another worker strand while the next ones are being read. Order is kept because each
// strand is FIFO and posts its results back to the host strand in order. At most
// LinkLimits::max_decrypt_ahead received bytes wait for decryption; beyond that reading pauses.
#pragma once

#include <array>
#include <deque>
#include <set>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include "transport/handshake.hpp"
#include "transport/link.hpp"
#include "transport/relay.hpp"

namespace grove::transport {

class TcpLink final : public Link, public std::enable_shared_from_this<TcpLink> {
 public:
  using tcp = boost::asio::ip::tcp;
  /// `sock` must use the host strand as its executor.
  TcpLink(tcp::socket sock, const SessionKeys& keys, PeerInfo peer,
          boost::asio::thread_pool& workers, LinkLimits limits);
  ~TcpLink() override;

  const PeerInfo& peer() const override { return peer_; }
  void start(std::weak_ptr<LinkHandler> handler) override;
  void send(Frame f) override;
  void send_filled(Frame f, std::span<std::uint8_t> payload, Fill fill, Frame fallback) override;
  std::size_t queued_bytes() const override { return queued_; }
  void close(std::error_code reason, bool flush) override;

 private:
  using WorkStrand = boost::asio::strand<boost::asio::thread_pool::executor_type>;
  void read_header();
  void read_body(std::size_t len);
  void on_opened(Frame f, bool ok);
  void read_failed(std::error_code ec);
  void on_sealed(Frame f);
  void seal_and_post(Frame f);
  void seal_now(Frame f);
  void write_more();
  void maybe_finish_flush();
  void fail(std::error_code ec);

  tcp::socket sock_;
  boost::asio::any_io_executor ex_;
  WorkStrand seal_strand_, open_strand_;
  CipherState tx_, rx_;  // tx_ only on seal_strand_, rx_ only on open_strand_
  PeerInfo peer_;
  LinkLimits limits_;
  std::weak_ptr<LinkHandler> handler_;
  boost::asio::steady_timer frame_timer_;
  std::uint64_t frame_gen_ = 0;

  std::array<std::uint8_t, kRecordHeader> hdr_{};
  std::size_t opening_bytes_ = 0;
  bool read_paused_ = false;
  std::error_code read_error_;  // the read side ended; reported once decryption drains

  std::deque<Frame> write_q_;     // sealed, waiting for the socket
  std::vector<Frame> in_flight_;  // being written
  std::size_t queued_ = 0;        // bytes from send() until written
  std::size_t sealing_ = 0;       // frames on the seal strand
  bool writing_ = false;
  bool above_low_water_ = false;

  bool closing_ = false;  // close(flush) requested: no more sends, drain then shut down
  bool closed_ = false;
  std::error_code close_reason_;
};

struct TcpConnectorOptions {
  const Identity* identity = nullptr;  ///< must outlive the connector
  std::optional<SwarmKey> swarm_key;
  std::size_t max_half_open = 32;     ///< concurrent inbound handshakes
  Duration handshake_timeout{10000};  ///< the whole handshake, from accept/connect
  LinkLimits limits;
};

/// Accepts and dials TCP connections and runs the handshake on them.
class TcpConnector final : public Connector, public std::enable_shared_from_this<TcpConnector> {
 public:
  TcpConnector(boost::asio::any_io_executor strand, boost::asio::thread_pool& workers,
               TcpConnectorOptions opts);
  std::string listen(const std::string& address, std::function<bool()> admit,
                     std::function<void(LinkPtr)> on_link) override;
  void dial(const std::string& address, std::optional<NodeId> expected, Duration timeout,
            std::function<void(Result<LinkPtr>)> done) override;
  void probe(const std::string& address, const NodeId& expected, Duration timeout,
             std::function<void(std::error_code)> done) override;
  void close() override;
  /// This node relays: inbound connections that start with a relay preamble go to `hook`.
  void set_relay_hook(std::function<void(TcpLink::tcp::socket, RelayToken)> hook) {
    relay_hook_ = std::move(hook);
  }
  /// A connection through the relay at `relay`: presents `token`, then runs the handshake in
  /// `role` with the node at the circuit's other end, which must be `expected`.
  void dial_via_relay(const std::string& relay, const RelayToken& token, Handshake::Role role,
                      const NodeId& expected, Duration timeout,
                      std::function<void(Result<LinkPtr>)> done);

  std::size_t half_open() const noexcept { return half_open_; }

 private:
  class HandshakeOp;
  void accept_loop();
  /// Resolves and connects; `done` gets the socket and the deadline left for what follows.
  void connect_socket(const std::string& address, Duration timeout,
                      std::function<void(Result<TcpLink::tcp::socket>, Clock::time_point)> done);
  void handshake(TcpLink::tcp::socket sock, Handshake::Role role, std::optional<NodeId> expected,
                 Clock::time_point deadline, std::function<void(Result<LinkPtr>)> done,
                 bool relay_hook = false, bool relayed = false);

  boost::asio::any_io_executor ex_;
  boost::asio::thread_pool& workers_;
  TcpConnectorOptions opts_;
  std::optional<TcpLink::tcp::acceptor> acceptor_;
  std::function<bool()> admit_;
  std::function<void(LinkPtr)> on_link_;
  std::function<void(TcpLink::tcp::socket, RelayToken)> relay_hook_;
  std::size_t half_open_ = 0;
  std::set<std::shared_ptr<HandshakeOp>> ops_;
  bool closed_ = false;
};

/// Splits "host:port" or "[v6]:port"; ConfigError-free: returns false on bad input.
bool split_host_port(const std::string& address, std::string& host, std::uint16_t& port);

}  // namespace grove::transport
