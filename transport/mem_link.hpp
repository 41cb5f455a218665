// In-memory links and an in-memory "network" of hosts addressed as "mem:N". Frames are
// handed over without copies or encryption; identities are still the hosts' real ones.
// Used by deterministic tests of everything above the transport (with FaultyLink for faults).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include <boost/asio/any_io_executor.hpp>

#include "transport/link.hpp"

namespace grove::transport {

class MemLink final : public Link, public std::enable_shared_from_this<MemLink> {
 public:
  /// A connected pair: `a` lives on executor `ea` and sees peer `a_sees`, and vice versa.
  static std::pair<std::shared_ptr<MemLink>, std::shared_ptr<MemLink>> make_pair(
      boost::asio::any_io_executor ea, PeerInfo a_sees, boost::asio::any_io_executor eb,
      PeerInfo b_sees);

  MemLink(boost::asio::any_io_executor ex, PeerInfo peer)
      : ex_(std::move(ex)), peer_(std::move(peer)) {}
  const PeerInfo& peer() const override { return peer_; }
  void start(std::weak_ptr<LinkHandler> handler) override;
  void send(Frame f) override;
  std::size_t queued_bytes() const override { return 0; }
  void close(std::error_code reason, bool flush) override;

 private:
  void deliver(Frame f);
  void remote_closed();
  void finish(std::error_code ec);

  boost::asio::any_io_executor ex_;
  PeerInfo peer_;
  std::weak_ptr<MemLink> other_;
  std::weak_ptr<LinkHandler> handler_;
  bool started_ = false;
  bool closed_ = false;
  std::deque<Frame> early_;  // frames that arrived before start()
};

/// Registry of in-memory listeners. Thread-safe. One per test "world".
class MemNetwork : public std::enable_shared_from_this<MemNetwork> {
 public:
  struct Listener {
    boost::asio::any_io_executor ex;
    PeerInfo self;  // what a dialer sees
    std::function<bool()> admit;
    std::function<void(std::shared_ptr<Link>)> on_link;
  };
  std::string add_listener(Listener l);
  void remove_listener(const std::string& address);
  std::optional<Listener> find(const std::string& address) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Listener> listeners_;
  int next_ = 1;
};

class MemConnector final : public Connector {
 public:
  MemConnector(std::shared_ptr<MemNetwork> net, boost::asio::any_io_executor ex,
               const Identity& self);
  std::string listen(const std::string& address, std::function<bool()> admit,
                     std::function<void(LinkPtr)> on_link) override;
  void dial(const std::string& address, std::optional<NodeId> expected, Duration timeout,
            std::function<void(Result<LinkPtr>)> done) override;
  void probe(const std::string& address, const NodeId& expected, Duration timeout,
             std::function<void(std::error_code)> done) override;
  void close() override;

 private:
  std::shared_ptr<MemNetwork> net_;
  boost::asio::any_io_executor ex_;
  PeerInfo self_;
  std::string address_;
};

}  // namespace grove::transport
