#include "transport/tcp_link.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include <spdlog/spdlog.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace grove::transport {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
std::string endpoint_string(const tcp::endpoint& ep) {
  const auto a = ep.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(ep.port());
}
std::string remote_of(const tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  return ec ? std::string("?") : endpoint_string(ep);
}
std::error_code to_std(const boost::system::error_code& ec) {
  if (ec == asio::error::eof || ec == asio::error::connection_reset)
    return make_error_code(errc::connection_truncated);
  return {ec.value(), std::system_category()};
}
}  // namespace

bool split_host_port(const std::string& address, std::string& host, std::uint16_t& port) {
  std::string p;
  if (!address.empty() && address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':')
      return false;
    host = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos || address.find(':') != colon) return false;
    host = address.substr(0, colon);
    p = address.substr(colon + 1);
  }
  unsigned v = 0;
  auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (ec != std::errc() || ptr != p.data() + p.size() || p.empty() || v > 65535 || host.empty())
    return false;
  port = static_cast<std::uint16_t>(v);
  return true;
}

// ---------------------------------------------------------------------------------------------
// TcpLink

TcpLink::TcpLink(tcp::socket sock, const SessionKeys& keys, PeerInfo peer,
                 asio::thread_pool& workers, LinkLimits limits)
    : sock_(std::move(sock)),
      ex_(sock_.get_executor()),
      seal_strand_(asio::make_strand(workers.get_executor())),
      open_strand_(asio::make_strand(workers.get_executor())),
      tx_(keys.suite, keys.tx),
      rx_(keys.suite, keys.rx),
      peer_(std::move(peer)),
      limits_(limits),
      frame_timer_(ex_) {
  boost::system::error_code ec;
  sock_.set_option(tcp::no_delay(true), ec);
#ifdef TCP_NOTSENT_LOWAT
  if (limits_.notsent_lowat > 0) {
    const int v = static_cast<int>(std::min<std::size_t>(limits_.notsent_lowat, 1u << 30));
    if (::setsockopt(sock_.native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v) != 0)
      spdlog::debug("transport: TCP_NOTSENT_LOWAT not set: {}", std::strerror(errno));
  }
#endif
}

TcpLink::~TcpLink() = default;

void TcpLink::start(std::weak_ptr<LinkHandler> handler) {
  handler_ = std::move(handler);
  read_header();
}

void TcpLink::read_header() {
  asio::async_read(
      sock_, asio::buffer(hdr_),
      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
        if (self->closed_) return;
        if (ec) return self->read_failed(to_std(ec));
        const std::size_t len = (std::size_t{self->hdr_[0]} << 24) |
                                (std::size_t{self->hdr_[1]} << 16) |
                                (std::size_t{self->hdr_[2]} << 8) | self->hdr_[3];
        if (len + kRecordHeader > self->limits_.max_frame) {
          spdlog::warn("transport: peer {} ({}) announced a {}-byte frame (max {}); closing",
                       short_id(self->peer_.id), self->peer_.address, len, self->limits_.max_frame);
          return self->fail(make_error_code(errc::frame_too_large));
        }
        if (len < kTagSize + 2) {
          spdlog::warn("transport: peer {} ({}) sent a {}-byte record (too short); closing",
                       short_id(self->peer_.id), self->peer_.address, len);
          return self->fail(make_error_code(errc::malformed));
        }
        self->read_body(len);
      });
}

void TcpLink::read_body(std::size_t len) {
  Frame f{Bytes(kRecordHeader + len)};
  std::memcpy(f.buf.data(), hdr_.data(), kRecordHeader);
  // A frame body must arrive within a time proportional to its size (slow-loris defence).
  const auto gen = ++frame_gen_;
  frame_timer_.expires_after(
      limits_.min_frame_time +
      Duration(1000 * len / std::max<std::size_t>(1, limits_.min_frame_rate)));
  frame_timer_.async_wait([self = shared_from_this(), gen](boost::system::error_code ec) {
    if (ec || self->closed_ || gen != self->frame_gen_) return;
    spdlog::warn("transport: peer {} ({}) is too slow to send a frame; closing",
                 short_id(self->peer_.id), self->peer_.address);
    self->fail(make_error_code(errc::timed_out));
  });
  auto body = asio::buffer(f.buf.data() + kRecordHeader, len);
  asio::async_read(
      sock_, body,
      [self = shared_from_this(), f = std::move(f)](boost::system::error_code ec,
                                                    std::size_t) mutable {
        ++self->frame_gen_;  // disarms the frame timer
        if (self->closed_) return;
        if (ec) return self->read_failed(to_std(ec));
        const std::size_t n = f.buf.size();
        if (self->limits_.inline_crypto && self->opening_bytes_ == 0) {
          auto all = f.buf.span();
          self->opening_bytes_ += n;
          const bool ok =
              self->rx_.open(all.subspan(kRecordHeader, all.size() - kRecordOverhead),
                             all.first(kRecordHeader), all.data() + all.size() - kTagSize);
          self->on_opened(std::move(f), ok);
          if (!self->closed_ && !self->read_paused_) self->read_header();
          return;
        }
        self->opening_bytes_ += n;
        asio::post(self->open_strand_, [self, f = std::move(f)]() mutable {
          auto all = f.buf.span();
          const bool ok =
              self->rx_.open(all.subspan(kRecordHeader, all.size() - kRecordOverhead),
                             all.first(kRecordHeader), all.data() + all.size() - kTagSize);
          asio::post(self->ex_,
                     [self, f = std::move(f), ok]() mutable { self->on_opened(std::move(f), ok); });
        });
        if (self->opening_bytes_ < self->limits_.max_decrypt_ahead) {
          self->read_header();
        } else {
          self->read_paused_ = true;
        }
      });
}

void TcpLink::on_opened(Frame f, bool ok) {
  opening_bytes_ -= f.buf.size();
  if (closed_) return;
  if (!ok) {
    spdlog::warn(
        "transport: frame from peer {} ({}) failed authentication "
        "(tampered, replayed, reordered or dropped); closing",
        short_id(peer_.id), peer_.address);
    return fail(make_error_code(errc::auth_failed));
  }
  if (read_paused_ && !read_error_ && opening_bytes_ < limits_.max_decrypt_ahead) {
    read_paused_ = false;
    read_header();
  }
  if (auto h = handler_.lock()) h->on_frame(std::move(f));
  if (read_error_ && opening_bytes_ == 0) fail(read_error_);
}

void TcpLink::read_failed(std::error_code ec) {
  // Frames received before the end of the stream are still being decrypted: deliver them
  // first (one of them may be the goodbye that makes this EOF a clean close).
  if (opening_bytes_ > 0) {
    read_error_ = ec;
    return;
  }
  fail(ec);
}

void TcpLink::send(Frame f) {
  send_filled(std::move(f), {}, nullptr, Frame{});
}

// A null `fill` means the frame is complete already.
void TcpLink::send_filled(Frame f, std::span<std::uint8_t> payload, Fill fill, Frame fallback) {
  if (closed_ || closing_) return;
  queued_ += f.buf.size();
  if (queued_ >= limits_.low_water) above_low_water_ = true;
  ++sealing_;
  if (limits_.inline_crypto && sealing_ == 1) {
    if (!fill || fill(payload)) return seal_now(std::move(f));
    queued_ = queued_ + fallback.buf.size() - f.buf.size();
    return seal_now(std::move(fallback));
  }
  asio::post(seal_strand_, [self = shared_from_this(), f = std::move(f), payload,
                            fill = std::move(fill), fb = std::move(fallback)]() mutable {
    if (!fill || fill(payload)) return self->seal_and_post(std::move(f));
    // queued_ counted f; the write completion subtracts only what is written (the fallback).
    const std::size_t counted = f.buf.size(), written = fb.buf.size();
    asio::post(self->ex_,
               [self, counted, written] { self->queued_ = self->queued_ + written - counted; });
    self->seal_and_post(std::move(fb));
  });
}

// Writes the record length and seals the record in place; advances the send counter.
static bool seal_record(CipherState& tx, Frame& f) {
  auto all = f.buf.span();
  const std::size_t len = all.size() - kRecordHeader;
  all[0] = static_cast<std::uint8_t>(len >> 24);
  all[1] = static_cast<std::uint8_t>(len >> 16);
  all[2] = static_cast<std::uint8_t>(len >> 8);
  all[3] = static_cast<std::uint8_t>(len);
  return tx.seal(all.subspan(kRecordHeader, all.size() - kRecordOverhead), all.first(kRecordHeader),
                 all.data() + all.size() - kTagSize);
}

// On the host strand (inline crypto, nothing queued on the seal strand).
void TcpLink::seal_now(Frame f) {
  if (!seal_record(tx_, f)) return fail(make_error_code(errc::limit_reached));
  on_sealed(std::move(f));
}

// On the seal strand: the counter nonce advances in send order.
void TcpLink::seal_and_post(Frame f) {
  const bool ok = seal_record(tx_, f);
  asio::post(ex_, [self = shared_from_this(), f = std::move(f), ok]() mutable {
    if (!ok) return self->fail(make_error_code(errc::limit_reached));  // nonce space exhausted
    self->on_sealed(std::move(f));
  });
}

void TcpLink::on_sealed(Frame f) {
  --sealing_;
  if (closed_) return;
  write_q_.push_back(std::move(f));
  write_more();
}

void TcpLink::write_more() {
  if (writing_ || closed_) return;
  if (write_q_.empty()) return maybe_finish_flush();
  // Gather several small frames into one writev; large frames go one by one.
  std::vector<asio::const_buffer> bufs;
  std::size_t bytes = 0;
  while (!write_q_.empty() && bufs.size() < 64 && bytes < (1u << 20)) {
    in_flight_.push_back(std::move(write_q_.front()));
    write_q_.pop_front();
    bufs.emplace_back(in_flight_.back().buf.data(), in_flight_.back().buf.size());
    bytes += in_flight_.back().buf.size();
  }
  writing_ = true;
  asio::async_write(sock_, bufs,
                    [self = shared_from_this(), bytes](boost::system::error_code ec, std::size_t) {
                      self->writing_ = false;
                      self->in_flight_.clear();
                      if (self->closed_) return;
                      if (ec) return self->fail(to_std(ec));
                      self->queued_ -= bytes;
                      if (self->above_low_water_ && self->queued_ < self->limits_.low_water) {
                        self->above_low_water_ = false;
                        if (auto h = self->handler_.lock()) h->on_writable();
                      }
                      self->write_more();
                    });
}

void TcpLink::maybe_finish_flush() {
  if (!closing_ || closed_ || writing_ || sealing_ > 0 || !write_q_.empty()) return;
  boost::system::error_code ignored;
  sock_.shutdown(tcp::socket::shutdown_send, ignored);
  fail(close_reason_);
}

void TcpLink::close(std::error_code reason, bool flush) {
  if (closed_ || closing_) return;
  if (!flush) return fail(reason);
  closing_ = true;
  close_reason_ = reason;
  maybe_finish_flush();
}

void TcpLink::fail(std::error_code ec) {
  if (closed_) return;
  closed_ = true;
  ++frame_gen_;
  frame_timer_.cancel();
  boost::system::error_code ignored;
  sock_.close(ignored);
  write_q_.clear();
  asio::post(ex_, [self = shared_from_this(), ec] {
    if (auto h = self->handler_.lock()) h->on_closed(ec);
    self->handler_.reset();
  });
}

// ---------------------------------------------------------------------------------------------
// Handshake driver: runs the sans-IO Handshake over a socket with a deadline. Pre-handshake
// messages are framed as [u16 length][bytes], at most kHandshakeMaxMessage bytes.

class TcpConnector::HandshakeOp : public std::enable_shared_from_this<HandshakeOp> {
 public:
  /// `probe`: an initiator that stops once the responder has proven its identity (message 2)
  /// and never sends message 3, so the responder opens no session (a dial-back check).
  HandshakeOp(tcp::socket sock, Handshake::Role role, HandshakeConfig cfg,
              std::function<void(Result<std::pair<tcp::socket, SessionKeys>>)> done,
              bool probe = false)
      : sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        hs_(role, std::move(cfg)),
        role_(role),
        probe_(probe),
        done_(std::move(done)) {}
  /// Responder on our listener: a first message that is a relay preamble hands the socket to
  /// `hook` (this node relays) instead of running the handshake; done() then gets cancelled.
  void set_relay_hook(std::function<void(tcp::socket, RelayToken)> hook) {
    relay_hook_ = std::move(hook);
  }

  void start(Clock::time_point deadline) {
    timer_.expires_at(deadline);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->finish(errc::timed_out);
    });
    if (role_ == Handshake::Role::initiator) {
      write(hs_.start(), [self = shared_from_this()] { self->read(); });
    } else {
      read();
    }
  }

  void abort() { finish(errc::shutting_down); }

 private:
  void write(const std::vector<std::uint8_t>& msg, std::function<void()> next) {
    out_.assign(2 + msg.size(), 0);
    out_[0] = static_cast<std::uint8_t>(msg.size() >> 8);
    out_[1] = static_cast<std::uint8_t>(msg.size());
    std::copy(msg.begin(), msg.end(), out_.begin() + 2);
    asio::async_write(sock_, asio::buffer(out_),
                      [self = shared_from_this(), next](boost::system::error_code ec, std::size_t) {
                        if (self->finished_) return;
                        if (ec) return self->finish(to_std(ec));
                        next();
                      });
  }

  void read() {
    asio::async_read(sock_, asio::buffer(len_),
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       if (self->finished_) return;
                       if (ec) return self->finish(to_std(ec));
                       const std::size_t n = (std::size_t{self->len_[0]} << 8) | self->len_[1];
                       if (n == 0 || n > kHandshakeMaxMessage) return self->finish(errc::malformed);
                       self->in_.resize(n);
                       asio::async_read(self->sock_, asio::buffer(self->in_),
                                        [self](boost::system::error_code ec, std::size_t) {
                                          if (self->finished_) return;
                                          if (ec) return self->finish(to_std(ec));
                                          self->on_message();
                                        });
                     });
  }

  void on_message() {
    if (relay_hook_ && !got_first_)
      if (auto token = parse_relay_preamble(in_)) {
        finished_ = true;
        timer_.cancel();
        relay_hook_(std::move(sock_), *token);
        return done_(errc::cancelled);
      }
    got_first_ = true;
    auto step = hs_.on_message(in_);
    if (!step) return finish(step.error());
    if (probe_ && role_ == Handshake::Role::initiator) return finish({});  // identity proven
    auto after = [self = shared_from_this()] {
      if (self->hs_.done()) {
        self->finish({});
      } else {
        self->read();
      }
    };
    if (!step->reply.empty()) {
      write(step->reply, after);
    } else {
      after();
    }
  }

  void finish(std::error_code ec) {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    if (ec) {
      boost::system::error_code ignored;
      sock_.close(ignored);
      done_(ec);
    } else {
      done_(std::make_pair(std::move(sock_), hs_.keys()));
    }
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  Handshake hs_;
  Handshake::Role role_;
  bool probe_ = false;
  bool got_first_ = false;
  std::function<void(tcp::socket, RelayToken)> relay_hook_;
  std::function<void(Result<std::pair<tcp::socket, SessionKeys>>)> done_;
  std::array<std::uint8_t, 2> len_{};
  std::vector<std::uint8_t> in_, out_;
  bool finished_ = false;
};

TcpConnector::TcpConnector(asio::any_io_executor strand, asio::thread_pool& workers,
                           TcpConnectorOptions opts)
    : ex_(std::move(strand)), workers_(workers), opts_(std::move(opts)) {
  if (!opts_.identity) throw ConfigError("TcpConnector needs an identity");
}

std::string TcpConnector::listen(const std::string& address, std::function<bool()> admit,
                                 std::function<void(LinkPtr)> on_link) {
  std::string host;
  std::uint16_t port = 0;
  if (!split_host_port(address, host, port))
    throw ConfigError("listen address '" + address + "' is not HOST:PORT");
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec)
    throw ConfigError("listen address '" + address + "': '" + host + "' is not an IP address");
  tcp::endpoint ep(addr, port);
  acceptor_.emplace(ex_);
  acceptor_->open(ep.protocol(), ec);
  if (!ec) acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_->bind(ep, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw ConfigError("cannot listen on " + address + ": " + ec.message());
  admit_ = std::move(admit);
  on_link_ = std::move(on_link);
  accept_loop();
  return endpoint_string(acceptor_->local_endpoint());
}

void TcpConnector::accept_loop() {
  acceptor_->async_accept([self = shared_from_this()](boost::system::error_code ec, tcp::socket s) {
    if (self->closed_) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      spdlog::warn("transport: accept failed: {}", ec.message());
    } else if (self->half_open_ >= self->opts_.max_half_open || (self->admit_ && !self->admit_())) {
      spdlog::debug("transport: refusing connection from {}: connection or handshake limit",
                    remote_of(s));
      boost::system::error_code ignored;
      s.close(ignored);
    } else {
      ++self->half_open_;
      const std::string from = remote_of(s);
      self->handshake(
          std::move(s), Handshake::Role::responder, std::nullopt,
          Clock::now() + self->opts_.handshake_timeout,
          [self, from](Result<LinkPtr> r) {
            --self->half_open_;
            if (!r && r.error() == make_error_code(errc::cancelled)) {
              spdlog::debug("transport: {} opened a relayed connection", from);
              return;
            }
            if (!r) {
              // A connection closed mid-handshake is most often a peer's dial-back
              // check (it stops once we proved who we are): not worth a log line.
              if (r.error() == make_error_code(errc::connection_truncated))
                spdlog::debug("transport: inbound handshake from {} ended early", from);
              else
                spdlog::info("transport: inbound handshake from {} failed: {}", from,
                             r.error().message());
              return;
            }
            if (!self->closed_) self->on_link_(*r);
          },
          true);
    }
    self->accept_loop();
  });
}

void TcpConnector::handshake(tcp::socket sock, Handshake::Role role, std::optional<NodeId> expected,
                             Clock::time_point deadline, std::function<void(Result<LinkPtr>)> done,
                             bool relay_hook, bool relayed) {
  HandshakeConfig cfg{opts_.identity, opts_.swarm_key, expected, 0};
  const bool inbound = role == Handshake::Role::responder;
  auto op = std::make_shared<HandshakeOp>(
      std::move(sock), role, std::move(cfg),
      [self = shared_from_this(), done, inbound, expected,
       relayed](Result<std::pair<tcp::socket, SessionKeys>> r) {
        if (!r) return done(r.error());
        auto& [s, keys] = *r;
        // The handshake checks the responder's identity; a responder that expects a given
        // initiator (the far end of a relayed connection) checks it here.
        if (inbound && expected && keys.peer_id != *expected) {
          boost::system::error_code ignored;
          s.close(ignored);
          return done(errc::wrong_peer);
        }
        PeerInfo peer;
        peer.id = keys.peer_id;
        peer.key = keys.peer_key;
        peer.address = remote_of(s);
        peer.inbound = inbound;
        peer.relayed = relayed;
        peer.suite = suite_name(keys.suite);
        done(LinkPtr(std::make_shared<TcpLink>(std::move(s), keys, std::move(peer), self->workers_,
                                               self->opts_.limits)));
      });
  if (relay_hook && relay_hook_) op->set_relay_hook(relay_hook_);
  ops_.insert(op);
  op->start(deadline);
  // Forget the op once it finished (its completion ran or will run on this strand).
  asio::post(ex_, [self = shared_from_this()] {
    std::erase_if(self->ops_, [](const auto& o) { return o.use_count() == 1; });
  });
}

void TcpConnector::connect_socket(
    const std::string& address, Duration timeout,
    std::function<void(Result<tcp::socket>, Clock::time_point deadline)> done) {
  std::string host;
  std::uint16_t port = 0;
  const auto deadline = Clock::now() + timeout;
  if (closed_ || !split_host_port(address, host, port)) {
    asio::post(ex_, [done, deadline, closed = closed_] {
      done(closed ? errc::shutting_down : errc::unreachable, deadline);
    });
    return;
  }
  auto resolver = std::make_shared<tcp::resolver>(ex_);
  auto sock = std::make_shared<tcp::socket>(ex_);
  auto timer = std::make_shared<asio::steady_timer>(ex_, deadline);
  auto timed_out = std::make_shared<bool>(false);
  timer->async_wait([resolver, sock, timed_out](boost::system::error_code ec) {
    if (ec) return;
    *timed_out = true;
    resolver->cancel();
    boost::system::error_code ignored;
    sock->close(ignored);
  });
  resolver->async_resolve(
      host, std::to_string(port),
      [self = shared_from_this(), resolver, sock, timer, timed_out, deadline, done](
          boost::system::error_code ec, tcp::resolver::results_type results) {
        if (ec) {
          timer->cancel();
          return done(*timed_out ? errc::timed_out : errc::unreachable, deadline);
        }
        asio::async_connect(*sock, results,
                            [self, sock, timer, timed_out, deadline, done](
                                boost::system::error_code ec, const tcp::endpoint&) {
                              timer->cancel();
                              if (*timed_out) return done(errc::timed_out, deadline);
                              if (ec) return done(errc::unreachable, deadline);
                              if (self->closed_) return done(errc::shutting_down, deadline);
                              done(std::move(*sock), deadline);
                            });
      });
}

void TcpConnector::dial(const std::string& address, std::optional<NodeId> expected,
                        Duration timeout, std::function<void(Result<LinkPtr>)> done) {
  connect_socket(address, timeout,
                 [self = shared_from_this(), expected, done](Result<tcp::socket> s,
                                                             Clock::time_point deadline) {
                   if (!s) return done(s.error());
                   self->handshake(std::move(*s), Handshake::Role::initiator, expected, deadline,
                                   done);
                 });
}

void TcpConnector::dial_via_relay(const std::string& relay, const RelayToken& token,
                                  Handshake::Role role, const NodeId& expected, Duration timeout,
                                  std::function<void(Result<LinkPtr>)> done) {
  connect_socket(relay, timeout,
                 [self = shared_from_this(), token, role, expected, done](
                     Result<tcp::socket> s, Clock::time_point deadline) {
                   if (!s) return done(s.error());
                   auto sock = std::make_shared<tcp::socket>(std::move(*s));
                   auto pre = std::make_shared<std::vector<std::uint8_t>>(relay_preamble(token));
                   asio::async_write(*sock, asio::buffer(*pre),
                                     [self, sock, pre, role, expected, deadline, done](
                                         boost::system::error_code ec, std::size_t) {
                                       if (ec) return done(errc::unreachable);
                                       self->handshake(std::move(*sock), role, expected, deadline,
                                                       done, false, true);
                                     });
                 });
}

void TcpConnector::probe(const std::string& address, const NodeId& expected, Duration timeout,
                         std::function<void(std::error_code)> done) {
  connect_socket(address, timeout,
                 [self = shared_from_this(), expected, done](Result<tcp::socket> s,
                                                             Clock::time_point deadline) {
                   if (!s) return done(s.error());
                   HandshakeConfig cfg{self->opts_.identity, self->opts_.swarm_key, expected, 0};
                   auto op = std::make_shared<HandshakeOp>(
                       std::move(*s), Handshake::Role::initiator, std::move(cfg),
                       [done](Result<std::pair<tcp::socket, SessionKeys>> r) {
                         if (!r) return done(r.error());
                         boost::system::error_code ignored;
                         r->first.close(ignored);
                         done({});
                       },
                       true);
                   self->ops_.insert(op);
                   op->start(deadline);
                   asio::post(self->ex_, [self] {
                     std::erase_if(self->ops_, [](const auto& o) { return o.use_count() == 1; });
                   });
                 });
}

void TcpConnector::close() {
  if (closed_) return;
  closed_ = true;
  if (acceptor_) {
    boost::system::error_code ignored;
    acceptor_->close(ignored);
  }
  auto ops = std::move(ops_);
  for (auto& op : ops) op->abort();
}

}  // namespace grove::transport
