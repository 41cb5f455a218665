#include "gossip/runtime.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstring>

#include <spdlog/spdlog.h>

namespace grove::gossip {

namespace asio = boost::asio;
using transport::PeerRef;

namespace {
constexpr std::size_t kMetaSize = 16 + 8;
constexpr std::size_t kRecentOps = 256;
constexpr const char* kKind = "gossip";

Bytes make_meta(const OpId& op, std::uint64_t seq) {
  Bytes m(kMetaSize);
  std::memcpy(m.data(), op.data(), op.size());
  for (int i = 0; i < 8; ++i) m.data()[16 + i] = static_cast<std::uint8_t>(seq >> (56 - 8 * i));
  return m;
}

class BytesSource final : public transport::StreamSource {
 public:
  explicit BytesSource(Bytes b) : b_(std::move(b)) {}
  std::uint64_t size() const override { return b_.size(); }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) override {
    std::memcpy(out.data(), b_.data() + offset, out.size());
    return {};
  }

 private:
  Bytes b_;
};

// Collects one stream into a buffer; hands it to the runtime's strand at the end.
class Collector final : public transport::StreamSink {
 public:
  using End = std::function<void(Bytes, std::error_code)>;
  Collector(std::size_t size, End end) : buf_(size), end_(std::move(end)) {}
  void on_data(transport::Chunk c) override {
    const auto b = c.bytes();
    if (c.offset() + b.size() > buf_.size()) return;  // the session checks sizes; be safe
    std::memcpy(buf_.data() + c.offset(), b.data(), b.size());
  }
  void on_end(std::error_code ec) override { end_(std::move(buf_), ec); }

 private:
  Bytes buf_;
  End end_;
};
}  // namespace

Time GossipRuntime::now() {
  return std::chrono::duration_cast<Time>(transport::Clock::now().time_since_epoch());
}

GossipRuntime::GossipRuntime(std::shared_ptr<transport::Host> host, RuntimeOptions opts)
    : host_(std::move(host)),
      opts_(opts),
      strand_(asio::make_strand(transport::worker_pool().get_executor())) {}

std::shared_ptr<GossipRuntime> GossipRuntime::create(std::shared_ptr<transport::Host> host,
                                                     RuntimeOptions opts) {
  std::shared_ptr<GossipRuntime> rt(new GossipRuntime(host, opts));
  std::weak_ptr<GossipRuntime> w = rt;
  const std::size_t max = opts.max_message;
  host->accept_streams(
      kKind,
      [w, max](const transport::PeerInfo& peer,
               transport::IncomingStream& in) -> std::shared_ptr<transport::StreamSink> {
        auto self = w.lock();
        if (!self) return nullptr;
        const auto meta = in.meta.bytes();
        if (meta.size() != kMetaSize || in.size > max || in.size == 0) {
          spdlog::warn("gossip: refusing a stream from {} (meta {} bytes, size {})",
                       dht::short_hex(peer.id), meta.size(), in.size);
          return nullptr;
        }
        OpId op;
        std::memcpy(op.data(), meta.data(), op.size());
        std::uint64_t seq = 0;
        for (int i = 0; i < 8; ++i) seq = (seq << 8) | meta[16 + i];
        const NodeId from = peer.id;
        return std::make_shared<Collector>(
            static_cast<std::size_t>(in.size), [w, from, op, seq](Bytes b, std::error_code ec) {
              auto self = w.lock();
              if (!self) return;
              asio::post(self->strand_, [self, from, op, seq, b = std::move(b), ec]() mutable {
                self->on_stream_end(from, op, seq, std::move(b), ec);
              });
            });
      });
  return rt;
}

void GossipRuntime::start(std::unique_ptr<Protocol> p, std::map<NodeId, std::string> addresses,
                          Done done) {
  asio::post(strand_, [self = shared_from_this(), p = std::move(p),
                       addresses = std::move(addresses), done = std::move(done)]() mutable {
    self->begin(std::move(p), std::move(addresses), std::move(done));
  });
}

void GossipRuntime::start(Make make, std::map<NodeId, std::string> addresses, Done done) {
  asio::post(strand_, [self = shared_from_this(), make = std::move(make),
                       addresses = std::move(addresses), done = std::move(done)]() mutable {
    std::unique_ptr<Protocol> p = make(now());  // nullptr: it could not be built (logged)
    if (!p) {
      if (done) done(nullptr);
      return;
    }
    self->begin(std::move(p), std::move(addresses), std::move(done));
  });
}

void GossipRuntime::with(const OpId& op, std::function<void(Protocol&)> fn) {
  asio::post(strand_, [self = shared_from_this(), op, fn = std::move(fn)] {
    auto it = self->ops_.find(op);
    if (it == self->ops_.end()) return;
    fn(*it->second.p);
    self->flush(op);
  });
}

void GossipRuntime::set_addresses(const OpId& op, std::map<NodeId, std::string> addresses) {
  asio::post(strand_, [self = shared_from_this(), op, addresses = std::move(addresses)]() mutable {
    auto it = self->ops_.find(op);
    if (it == self->ops_.end()) return;
    for (auto& [id, a] : addresses)
      if (auto q = self->out_.find({op, id}); q != self->out_.end()) q->second.address = a;
    it->second.addresses = std::move(addresses);
  });
}

void GossipRuntime::begin(std::unique_ptr<Protocol> p, std::map<NodeId, std::string> addresses,
                          Done done) {
  const OpId op = p->op();
  Op& o = ops_[op];
  o.p = std::move(p);
  o.addresses = std::move(addresses);
  o.done = std::move(done);
  o.timer = std::make_unique<asio::steady_timer>(strand_);
  if (auto it = early_.find(op); it != early_.end()) {
    auto msgs = std::move(it->second);
    early_.erase(it);
    for (auto& e : msgs) {
      early_bytes_ -= e.data.size();
      deliver(e.from, op, std::move(e.data));
    }
  }
  flush(op);
}

void GossipRuntime::on_stream_end(const NodeId& from, const OpId& op, std::uint64_t seq, Bytes data,
                                  std::error_code ec) {
  if (ec) {
    spdlog::debug("gossip: stream from {} failed: {}", dht::short_hex(from), ec.message());
    peer_failed(op, from);
    return;
  }
  if (std::find(finished_.begin(), finished_.end(), op) != finished_.end()) return;  // late
  if (auto o = ops_.find(op); o != ops_.end() && !o->second.p->ordered()) {
    deliver(from, op, std::move(data));  // each message as it comes
    return;
  }
  const Key k{op, from};
  InOrder& io = in_[k];
  if (seq < io.next) return;  // a duplicate
  if (seq > io.next) {
    if (io.held.size() >= opts_.max_reorder) {
      spdlog::warn("gossip: {} is too far out of order; dropping it for this op",
                   dht::short_hex(from));
      peer_failed(op, from);
      return;
    }
    io.held.emplace(seq, std::move(data));
    return;
  }
  ++io.next;
  deliver(from, op, std::move(data));
  // deliver() may finish the op, which erases its in_ entries: look the entry up every time.
  for (;;) {
    auto it = in_.find(k);
    if (it == in_.end()) return;
    auto h = it->second.held.find(it->second.next);
    if (h == it->second.held.end()) return;
    Bytes next = std::move(h->second);
    it->second.held.erase(h);
    ++it->second.next;
    deliver(from, op, std::move(next));
  }
}

void GossipRuntime::deliver(const NodeId& from, const OpId& op, Bytes data) {
  auto it = ops_.find(op);
  if (it == ops_.end()) {
    if (std::find(finished_.begin(), finished_.end(), op) != finished_.end()) return;
    const Time t = now();
    for (auto e = early_.begin(); e != early_.end();) {  // expire stale early messages
      auto& v = e->second;
      while (!v.empty() && t - v.front().at > opts_.early_ttl) {
        early_bytes_ -= v.front().data.size();
        v.erase(v.begin());
      }
      e = v.empty() ? early_.erase(e) : std::next(e);
    }
    if (early_bytes_ + data.size() > opts_.max_early_bytes) {
      spdlog::warn("gossip: early-message buffer full; dropping a message from {}",
                   dht::short_hex(from));
      return;
    }
    early_bytes_ += data.size();
    early_[op].push_back({from, std::move(data), t});
    return;
  }
  auto m = decode_message(data.span());
  if (!m) {
    spdlog::warn("gossip: malformed message from {}: {}", dht::short_hex(from),
                 m.error().message());
    it->second.p->on_peer_failed(from, now());
  } else if (m->h.op != op) {
    spdlog::warn("gossip: message from {} names another op than its stream", dht::short_hex(from));
    it->second.p->on_peer_failed(from, now());
  } else {
    it->second.p->on_message(from, *m, now());
  }
  flush(op);
}

void GossipRuntime::flush(const OpId& op) {
  auto it = ops_.find(op);
  if (it == ops_.end()) return;
  Op& o = it->second;
  for (auto& msg : o.p->take_outgoing()) {
    const Key k{op, msg.to};
    OutQueue& q = out_[k];
    if (q.failed) continue;
    if (auto a = o.addresses.find(msg.to); a != o.addresses.end()) q.address = a->second;
    q.q.push_back(std::move(msg.data));
    pump(k);
  }
  if (o.p->finished()) {
    o.timer->cancel();
    auto p = std::move(o.p);
    auto done = std::move(o.done);
    ops_.erase(it);
    finished_.push_back(op);
    if (finished_.size() > kRecentOps) finished_.pop_front();
    for (auto i = in_.lower_bound({op, NodeId{}}); i != in_.end() && i->first.first == op;)
      i = in_.erase(i);
    if (done) done(std::move(p));
    return;
  }
  arm(op, o);
}

void GossipRuntime::arm(const OpId& op, Op& o) {
  const auto d = o.p->next_deadline();
  if (!d) return;
  if (o.timer_at == *d) return;
  o.timer_at = *d;
  o.timer->expires_at(
      transport::Clock::time_point(std::chrono::duration_cast<transport::Clock::duration>(*d)));
  o.timer->async_wait([w = weak_from_this(), op](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self) return;
    auto it = self->ops_.find(op);
    if (it == self->ops_.end()) return;
    it->second.timer_at = Time::max();
    it->second.p->on_timer(now());
    self->flush(op);
  });
}

void GossipRuntime::pump(const Key& k) {
  auto it = out_.find(k);
  if (it == out_.end()) return;
  OutQueue& q = it->second;
  std::size_t& peer_streams = in_flight_[k.second];
  while (!q.failed && !q.q.empty() && peer_streams < opts_.streams_per_peer) {
    Bytes b = std::move(q.q.front());
    q.q.pop_front();
    ++q.in_flight;
    ++peer_streams;
    const std::uint64_t seq = q.next_seq++;
    host_->send_stream(PeerRef::node(k.second, q.address), kKind, make_meta(k.first, seq),
                       std::make_shared<BytesSource>(std::move(b)),
                       [w = weak_from_this(), k](std::error_code ec) {
                         auto self = w.lock();
                         if (!self) return;
                         asio::post(self->strand_, [self, k, ec] { self->stream_done(k, ec); });
                       });
  }
  if (peer_streams == 0) in_flight_.erase(k.second);
  if (q.q.empty() && q.in_flight == 0 && !ops_.count(k.first)) out_.erase(it);
}

void GossipRuntime::stream_done(const Key& k, std::error_code ec) {
  if (auto p = in_flight_.find(k.second); p != in_flight_.end() && --p->second == 0)
    in_flight_.erase(p);
  auto it = out_.find(k);
  if (it == out_.end()) return;
  --it->second.in_flight;
  if (ec && !it->second.failed) {
    spdlog::debug("gossip: stream to {} failed: {}", dht::short_hex(k.second), ec.message());
    // An op whose messages stand alone keeps its link to the peer (its next messages may get
    // through); an ordered one has lost a message in its sequence: nothing more goes to the peer.
    const auto op = ops_.find(k.first);
    if (op == ops_.end() || op->second.p->ordered()) {
      it->second.failed = true;
      it->second.q.clear();
    }
    peer_failed(k.first, k.second);
  }
  // The op makes its next messages (a streamed tensor's window) before the freed slot goes to
  // it first (its messages keep flowing in order), then to the other ops waiting on the peer.
  if (!ec)
    if (auto op = ops_.find(k.first); op != ops_.end()) {
      op->second.p->on_delivered(k.second, now());
      flush(k.first);  // (may finish the op)
    }
  pump(k);
  std::vector<Key> waiting;
  for (const auto& [key, q] : out_)
    if (key.second == k.second && key != k && !q.q.empty() && !q.failed) waiting.push_back(key);
  for (const auto& key : waiting) pump(key);
}

void GossipRuntime::peer_failed(const OpId& op, const NodeId& peer) {
  auto it = ops_.find(op);
  if (it == ops_.end()) return;
  it->second.p->on_peer_failed(peer, now());
  flush(op);
}

}  // namespace grove::gossip
