// Host (host.hpp): the worker pool, the session table, dialing and accepting, the operations on
// peers and the handler registry. Relays and connection reversal are in host_relay.cpp.
#include "transport/host.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "transport/tcp_link.hpp"

namespace grove::transport {
namespace asio = boost::asio;

namespace {
std::atomic<std::size_t> g_pool_threads{2};
std::atomic<std::size_t> g_pool_size{0};  // the real size, fixed when the pool is created
}  // namespace

asio::thread_pool& worker_pool() {
  // Intentionally never destroyed: strands of TcpLinks may be released from handlers that
  // outlive any single Host or io_context.
  static asio::thread_pool* pool = [] {
    g_pool_size = g_pool_threads.load();
    return new asio::thread_pool(g_pool_size.load());
  }();
  return *pool;
}

void configure_worker_pool(std::size_t threads) {
  g_pool_threads = std::max<std::size_t>(1, threads);
}

void quiesce_worker_pool() {
  // Occupy every worker with a barrier task: each one blocks until all n are inside, which
  // needs n distinct threads, so everything queued before them (FIFO) has finished. The state
  // is shared so that a task still waking up after this function returned touches live memory.
  struct Barrier {
    std::mutex mu;
    std::condition_variable cv;
    std::size_t arrived = 0, left = 0;
  };
  auto& pool = worker_pool();
  auto b = std::make_shared<Barrier>();
  const std::size_t n = g_pool_size.load();
  for (std::size_t i = 0; i < n; ++i) {
    asio::post(pool, [b, n] {
      std::unique_lock lk(b->mu);
      if (++b->arrived == n) b->cv.notify_all();
      b->cv.wait(lk, [&] { return b->arrived >= n; });
      ++b->left;
      b->cv.notify_all();
    });
  }
  std::unique_lock lk(b->mu);
  b->cv.wait(lk, [&] { return b->left == n; });
}

struct RequestHandle::Ctl {
  bool done = false;
  std::weak_ptr<Session> session;
  std::uint64_t rid = 0;
  ResponseHandler handler;
  void finish(Result<Payload> r) {
    if (done) return;
    done = true;
    auto h = std::move(handler);
    h(std::move(r));
  }
};

void RequestHandle::cancel() {
  auto h = host_.lock();
  if (!h || !ctl_) return;
  asio::post(h->executor(), [ctl = ctl_] {
    if (ctl->done) return;
    if (auto s = ctl->session.lock()) {
      s->cancel(ctl->rid);  // runs the wrapped handler with errc::cancelled
    } else {
      ctl->finish(errc::cancelled);  // still dialing
    }
  });
}

std::shared_ptr<Host> Host::create(asio::io_context& io, Identity identity, HostOptions opts) {
  auto h = std::shared_ptr<Host>(new Host(io, std::move(identity), std::move(opts)));
  h->serve_relay();
  return h;
}

Host::Host(asio::io_context& io, Identity identity, HostOptions opts)
    : strand_(asio::make_strand(io)), identity_(std::move(identity)), opts_(std::move(opts)) {
  if (opts_.max_connections == 0) throw ConfigError("max_connections must be at least 1");
  if (opts_.session.stream_chunk == 0 || opts_.session.stream_chunk + 64 > opts_.link.max_frame)
    throw ConfigError("stream_chunk must be positive and fit in a frame");
  if (opts_.session.stream_window < opts_.session.stream_chunk)
    throw ConfigError("stream_window must hold at least one chunk");
  if (opts_.session.send_queue_delay.count() <= 0 || opts_.session.send_queue_floor == 0 ||
      opts_.session.send_queue_floor > opts_.session.send_high_water)
    throw ConfigError(
        "send_queue_delay must be positive and 0 < send_queue_floor <= send_high_water");
  if (opts_.mem_network) {
    connector_ = std::make_shared<MemConnector>(opts_.mem_network, strand_, identity_);
  } else {
    TcpConnectorOptions t;
    t.identity = &identity_;
    t.swarm_key = opts_.swarm_key;
    t.max_half_open = opts_.max_half_open;
    t.handshake_timeout = opts_.handshake_timeout;
    t.limits = opts_.link;
    connector_ = std::make_shared<TcpConnector>(strand_, worker_pool(), t);
  }
}

Host::~Host() {
  connector_->close();
}

void Host::handle(const std::string& method, RequestHandler h) {
  req_handlers_[method] = std::move(h);
}
void Host::handle_message(const std::string& method, MessageHandler h) {
  msg_handlers_[method] = std::move(h);
}
void Host::accept_streams(const std::string& kind, StreamAcceptor a) {
  stream_acceptors_[kind] = std::move(a);
}

void Host::start() {
  if (opts_.listen.empty()) return;
  std::weak_ptr<Host> w = weak_from_this();
  address_ = connector_->listen(
      opts_.listen,
      [w] {
        auto self = w.lock();
        return self && !self->shut_ &&
               self->sessions_.size() + self->dialing_.size() < self->opts_.max_connections;
      },
      [w](std::shared_ptr<Link> link) {
        if (auto self = w.lock()) {
          if (self->shut_) return link->close(make_error_code(errc::shutting_down), false);
          ++self->counters_.handshakes_ok;
          self->add_session(std::move(link));
        }
      });
}

Host::SessionPtr Host::add_session(std::shared_ptr<Link> link) {
  if (opts_.faults) link = FaultyLink::wrap(std::move(link), opts_.faults, strand_);
  auto s = std::make_shared<Session>(link, strand_, opts_.session, weak_from_this());
  sessions_.insert(s);
  auto& slot = by_id_[s->peer().id];
  if (auto old = slot.lock(); old && !old->closed() && !old->retiring()) {
    // Two sessions with one peer: both dialed at once. Both sides keep the one dialed by the
    // smaller node id (the same choice on each side, so new traffic converges on one
    // connection) and let the other close once nothing is in flight on it.
    const auto dialer = [&](const SessionPtr& x) {
      return x->peer().inbound ? x->peer().id : id();
    };
    const NodeId lower = std::min(id(), s->peer().id);
    // A direct connection is kept over a relayed one (both sides see which is which);
    // otherwise the one dialed by the smaller id.
    const bool keep_new = s->peer().relayed != old->peer().relayed
                              ? !s->peer().relayed
                              : dialer(s) == lower && dialer(old) != lower;
    (keep_new ? old : s)->retire(opts_.duplicate_grace);
    if (keep_new) slot = s;
    ++counters_.duplicate_sessions;
    spdlog::debug("transport: second session with {}; keeping the one dialed by {}",
                  short_id(s->peer().id), short_id(lower));
  } else {
    slot = s;
  }
  spdlog::debug("transport: session with {} ({}, {}, {})", short_id(s->peer().id),
                s->peer().address, s->peer().inbound ? "inbound" : "outbound", s->peer().suite);
  s->start();
  if (auto it = awaiting_.find(s->peer().id); it != awaiting_.end()) {
    auto ws = std::move(it->second);
    awaiting_.erase(it);
    awaiting_count_ -= ws.size();
    auto kept = by_id_[s->peer().id].lock();
    for (auto& w : ws) {
      w.timer->cancel();
      w.cb(kept ? kept : s);
    }
  }
  return s;
}

Host::SessionPtr Host::find_session(const PeerRef& to) const {
  if (to.id) {
    auto it = by_id_.find(*to.id);
    if (it != by_id_.end())
      if (auto s = it->second.lock(); s && !s->closed()) return s;
  }
  if (!to.address.empty()) {
    auto it = by_addr_.find(to.address);
    if (it != by_addr_.end())
      if (auto s = it->second.lock(); s && !s->closed() && (!to.id || s->peer().id == *to.id))
        return s;
  }
  return nullptr;
}

void Host::with_session(const PeerRef& to, Clock::time_point deadline,
                        std::function<void(Result<SessionPtr>)> cb) {
  if (shut_) return cb(errc::shutting_down);
  if (auto s = find_session(to)) return cb(s);
  if (to.address.empty()) {
    // No address (a node that accepts no connections): wait for it to connect to us, as it
    // does when it takes part in the same operation, until the deadline.
    if (!to.id) return cb(errc::unreachable);
    return await_inbound(*to.id, deadline, std::move(cb));
  }
  auto& waiters = dialing_[to.address];
  waiters.push_back(std::move(cb));
  if (waiters.size() > 1) return;  // a dial to this address is already under way
  if (sessions_.size() + dialing_.size() > opts_.max_connections) {
    auto ws = std::move(dialing_[to.address]);
    dialing_.erase(to.address);
    for (auto& w : ws) w(errc::limit_reached);
    return;
  }
  if (to.address.starts_with("relay:")) return relay_dial(to, deadline);
  const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
  const Duration timeout = std::max(Duration(1), std::min(opts_.connect_timeout, left));
  connector_->dial(to.address, to.id, timeout,
                   [w = weak_from_this(), addr = to.address](Result<std::shared_ptr<Link>> r) {
                     if (auto self = w.lock()) self->dialed(addr, std::move(r));
                   });
}

void Host::await_inbound(const NodeId& id, Clock::time_point deadline,
                         std::function<void(Result<SessionPtr>)> cb) {
  if (shut_) return cb(errc::shutting_down);
  if (auto s = find_session(PeerRef::node(id))) return cb(s);
  if (awaiting_count_ >= kMaxAwaiting || deadline <= Clock::now()) return cb(errc::unreachable);
  const std::uint64_t key = ++await_seq_;
  auto timer = std::make_shared<asio::steady_timer>(strand_, deadline);
  awaiting_[id].push_back({key, std::move(cb), timer});
  ++awaiting_count_;
  timer->async_wait([w = weak_from_this(), id, key](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self) return;
    auto it = self->awaiting_.find(id);
    if (it == self->awaiting_.end()) return;
    auto& ws = it->second;
    for (auto wi = ws.begin(); wi != ws.end(); ++wi) {
      if (wi->key != key) continue;
      auto done = std::move(wi->cb);
      ws.erase(wi);
      if (ws.empty()) self->awaiting_.erase(it);
      --self->awaiting_count_;
      return done(errc::unreachable);
    }
  });
}

// A dial to `addr` (direct or through a relay) ended: its waiters get the session or the error.
void Host::dialed(const std::string& addr, Result<std::shared_ptr<Link>> r) {
  if (!r || shut_) {
    ++counters_.dials_failed;
    const auto ec = r ? make_error_code(errc::shutting_down) : r.error();
    spdlog::debug("transport: dialing {} failed: {}", addr, ec.message());
    if (r) (*r)->close(ec, false);
    return finish_dial(addr, ec);
  }
  ++counters_.handshakes_ok;
  auto s = add_session(std::move(*r));
  // When the new session is a duplicate, the one kept serves this address.
  if (auto kept = by_id_[s->peer().id].lock()) s = kept;
  finish_dial(addr, s);
}

void Host::finish_dial(const std::string& addr, Result<SessionPtr> r) {
  auto ws = std::move(dialing_[addr]);
  dialing_.erase(addr);
  if (r && !shut_) by_addr_[addr] = *r;
  if (r && shut_) r = errc::shutting_down;
  for (auto& cb : ws) cb(r);
}

RequestHandle Host::request(const PeerRef& to, const std::string& method, Bytes body,
                            Duration timeout, ResponseHandler handler) {
  RequestHandle h;
  h.host_ = weak_from_this();
  h.ctl_ = std::make_shared<RequestHandle::Ctl>();
  h.ctl_->handler = std::move(handler);
  const auto deadline = Clock::now() + timeout;
  asio::dispatch(strand_, [self = shared_from_this(), ctl = h.ctl_, to, method,
                           body = std::make_shared<Bytes>(std::move(body)), deadline] {
    self->with_session(to, deadline, [ctl, method, body, deadline](Result<SessionPtr> r) {
      if (ctl->done) return;
      if (!r) return ctl->finish(r.error());
      // Round up: the answer must not be given up on before the caller's deadline.
      const auto left = std::chrono::ceil<Duration>(deadline - Clock::now());
      if (left.count() <= 0) return ctl->finish(errc::timed_out);
      ctl->session = *r;
      ctl->rid = (*r)->request(method, body->span(), left,
                               [ctl](Result<Payload> resp) { ctl->finish(std::move(resp)); });
    });
  });
  return h;
}

void Host::send(const PeerRef& to, const std::string& method, Bytes body,
                std::function<void(std::error_code)> sent) {
  asio::dispatch(strand_, [self = shared_from_this(), to, method,
                           body = std::make_shared<Bytes>(std::move(body)), sent] {
    self->with_session(to, Clock::now() + self->opts_.connect_timeout,
                       [method, body, sent](Result<SessionPtr> r) {
                         const auto ec = r ? (*r)->send_message(method, body->span()) : r.error();
                         if (sent) sent(ec);
                       });
  });
}

void Host::send_stream(const PeerRef& to, const std::string& kind, Bytes meta,
                       std::shared_ptr<StreamSource> source, StreamDone done) {
  asio::dispatch(strand_, [self = shared_from_this(), to, kind,
                           meta = std::make_shared<Bytes>(std::move(meta)), source, done] {
    self->with_session(to, Clock::now() + self->opts_.connect_timeout,
                       [kind, meta, source, done](Result<SessionPtr> r) {
                         if (!r) return done(r.error());
                         (*r)->send_stream(kind, meta->span(), source, done);
                       });
  });
}

void Host::connect(const PeerRef& to, std::function<void(Result<PeerInfo>)> done) {
  asio::dispatch(strand_, [self = shared_from_this(), to, done] {
    self->with_session(to, Clock::now() + self->opts_.connect_timeout,
                       [done](Result<SessionPtr> r) {
                         if (!r) return done(r.error());
                         done((*r)->peer());
                       });
  });
}

void Host::probe(const std::string& address, const NodeId& expected, Duration timeout,
                 std::function<void(std::error_code)> done) {
  asio::dispatch(strand_, [self = shared_from_this(), address, expected, timeout, done] {
    if (self->shut_) return done(make_error_code(errc::shutting_down));
    self->connector_->probe(address, expected, timeout, done);
  });
}

void Host::disconnect(const NodeId& peer) {
  asio::dispatch(strand_, [self = shared_from_this(), peer] {
    std::vector<SessionPtr> victims;
    for (auto& s : self->sessions_)
      if (s->peer().id == peer) victims.push_back(s);
    for (auto& s : victims) s->close();
  });
}

void Host::shutdown() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    if (self->shut_) return;
    self->shut_ = true;
    self->connector_->close();
    if (self->relay_) self->relay_->close();
    auto awaiting = std::move(self->awaiting_);
    self->awaiting_.clear();
    self->awaiting_count_ = 0;
    for (auto& [id, ws] : awaiting)
      for (auto& w : ws) {
        w.timer->cancel();
        w.cb(errc::shutting_down);
      }
    auto all = self->sessions_;
    for (auto& s : all) s->close(make_error_code(errc::shutting_down));
  });
}

RelayStats Host::relay_stats() const {
  return relay_ ? relay_->stats() : RelayStats{};
}

HostStats Host::stats() const {
  HostStats st = counters_;
  st.sessions = sessions_.size();
  if (auto* t = dynamic_cast<TcpConnector*>(connector_.get())) st.half_open = t->half_open();
  st.bytes_sent = closed_bytes_sent_;
  st.bytes_received = closed_bytes_received_;
  for (auto& s : sessions_) {
    st.bytes_sent += s->stats().bytes_sent;
    st.bytes_received += s->stats().bytes_received;
  }
  return st;
}

std::vector<PeerInfo> Host::peers() const {
  std::vector<PeerInfo> v;
  for (auto& s : sessions_)
    if (!s->closed()) v.push_back(s->peer());
  return v;
}

void Host::on_request(Session& s, const std::string& method, Payload body, Responder r) {
  auto it = req_handlers_.find(method);
  if (it == req_handlers_.end()) return r.fail(errc::no_handler, "no handler for '" + method + "'");
  it->second(s.peer(), std::move(body), std::move(r));
}

void Host::on_message(Session& s, const std::string& method, Payload body) {
  auto it = msg_handlers_.find(method);
  if (it == msg_handlers_.end()) {
    spdlog::debug("transport: dropping message '{}' from {}: no handler", method,
                  short_id(s.peer().id));
    return;
  }
  it->second(s.peer(), std::move(body));
}

std::shared_ptr<StreamSink> Host::on_stream(Session& s, IncomingStream& in) {
  auto it = stream_acceptors_.find(in.kind);
  if (it == stream_acceptors_.end()) return nullptr;
  return it->second(s.peer(), in);
}

void Host::on_session_closed(Session& s, std::error_code ec) {
  spdlog::debug("transport: session with {} ({}) closed: {}", short_id(s.peer().id),
                s.peer().address, ec ? ec.message() : "ok");
  closed_bytes_sent_ += s.stats().bytes_sent;
  closed_bytes_received_ += s.stats().bytes_received;
  auto self = s.shared_from_this();
  sessions_.erase(self);
  if (auto it = by_id_.find(s.peer().id); it != by_id_.end() && it->second.lock() == self) {
    by_id_.erase(it);
    // Another live session to the same peer takes over.
    for (auto& o : sessions_)
      if (o->peer().id == s.peer().id && !o->closed()) {
        by_id_[o->peer().id] = o;
        if (!o->retiring()) break;
      }
  }
  std::erase_if(by_addr_, [&](auto& kv) {
    auto p = kv.second.lock();
    return !p || p == self;
  });
  if (!by_id_.contains(s.peer().id)) {
    // A reservation lasts as long as a session with its node (relayed circuits need one).
    if (relay_) relay_->drop(s.peer().id);
    reserved_at_.erase(s.peer().id);
  }
}

}  // namespace grove::transport
