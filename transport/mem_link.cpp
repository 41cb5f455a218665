#include "transport/mem_link.hpp"

#include <boost/asio/post.hpp>

namespace grove::transport {
namespace asio = boost::asio;

std::pair<std::shared_ptr<MemLink>, std::shared_ptr<MemLink>> MemLink::make_pair(
    asio::any_io_executor ea, PeerInfo a_sees, asio::any_io_executor eb, PeerInfo b_sees) {
  auto a = std::make_shared<MemLink>(std::move(ea), std::move(a_sees));
  auto b = std::make_shared<MemLink>(std::move(eb), std::move(b_sees));
  a->other_ = b;
  b->other_ = a;
  return {a, b};
}

void MemLink::start(std::weak_ptr<LinkHandler> handler) {
  handler_ = std::move(handler);
  started_ = true;
  while (!early_.empty() && !closed_) {
    Frame f = std::move(early_.front());
    early_.pop_front();
    if (auto h = handler_.lock()) h->on_frame(std::move(f));
  }
}

void MemLink::send(Frame f) {
  if (closed_) return;
  if (auto o = other_.lock()) {
    asio::post(o->ex_, [o, f = std::move(f)]() mutable { o->deliver(std::move(f)); });
  }
}

void MemLink::deliver(Frame f) {
  if (closed_) return;
  if (!started_) {
    early_.push_back(std::move(f));
    return;
  }
  if (auto h = handler_.lock()) h->on_frame(std::move(f));
}

void MemLink::close(std::error_code reason, bool /*flush*/) {
  if (closed_) return;
  // Frames already posted to the peer are delivered before the peer sees the close, as
  // with a flushed TCP close; frames sent after close() are dropped.
  if (auto o = other_.lock()) asio::post(o->ex_, [o] { o->remote_closed(); });
  finish(reason);
}

void MemLink::remote_closed() {
  if (closed_) return;
  finish(make_error_code(errc::connection_truncated));  // like EOF on a socket
}

void MemLink::finish(std::error_code ec) {
  closed_ = true;
  early_.clear();
  asio::post(ex_, [self = shared_from_this(), ec] {
    if (auto h = self->handler_.lock()) h->on_closed(ec);
    self->handler_.reset();
  });
}

std::string MemNetwork::add_listener(Listener l) {
  std::lock_guard lk(mu_);
  std::string addr = "mem:" + std::to_string(next_++);
  l.self.address = addr;
  listeners_.emplace(addr, std::move(l));
  return addr;
}

void MemNetwork::remove_listener(const std::string& address) {
  std::lock_guard lk(mu_);
  listeners_.erase(address);
}

std::optional<MemNetwork::Listener> MemNetwork::find(const std::string& address) const {
  std::lock_guard lk(mu_);
  auto it = listeners_.find(address);
  if (it == listeners_.end()) return std::nullopt;
  return it->second;
}

MemConnector::MemConnector(std::shared_ptr<MemNetwork> net, asio::any_io_executor ex,
                           const Identity& self)
    : net_(std::move(net)), ex_(std::move(ex)) {
  self_.id = self.id();
  self_.key = self.public_key();
  self_.suite = "none";
}

std::string MemConnector::listen(const std::string& /*address*/, std::function<bool()> admit,
                                 std::function<void(LinkPtr)> on_link) {
  address_ = net_->add_listener({ex_, self_, std::move(admit), std::move(on_link)});
  self_.address = address_;
  return address_;
}

void MemConnector::dial(const std::string& address, std::optional<NodeId> expected,
                        Duration /*timeout*/, std::function<void(Result<LinkPtr>)> done) {
  auto l = net_->find(address);
  if (!l) {
    asio::post(ex_, [done] { done(errc::unreachable); });
    return;
  }
  if (expected && *expected != l->self.id) {
    asio::post(ex_, [done] { done(errc::wrong_peer); });
    return;
  }
  PeerInfo listener_sees = self_;
  listener_sees.inbound = true;
  if (listener_sees.address.empty()) listener_sees.address = "mem:dialer";
  PeerInfo dialer_sees = l->self;
  dialer_sees.inbound = false;
  auto [mine, theirs] = MemLink::make_pair(ex_, dialer_sees, l->ex, listener_sees);
  // The accept side runs on the listener's executor, like a real accept would.
  asio::post(l->ex, [l = *l, theirs = theirs, mine = mine, done, ex = ex_]() mutable {
    if (l.admit && !l.admit()) {
      asio::post(ex, [done] { done(errc::rejected); });
      return;
    }
    l.on_link(theirs);
    asio::post(ex, [done, mine] { done(LinkPtr(mine)); });
  });
}

void MemConnector::probe(const std::string& address, const NodeId& expected, Duration /*timeout*/,
                         std::function<void(std::error_code)> done) {
  auto l = net_->find(address);
  const std::error_code ec = !l                       ? make_error_code(errc::unreachable)
                             : expected != l->self.id ? make_error_code(errc::wrong_peer)
                                                      : std::error_code{};
  asio::post(ex_, [done, ec] { done(ec); });
}

void MemConnector::close() {
  if (!address_.empty()) net_->remove_listener(address_);
  address_.clear();
}

}  // namespace grove::transport
