#include "dht/runtime.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "transport/strand.hpp"

namespace grove::dht {

namespace asio = boost::asio;
static constexpr const char* kMethod = "dht";

Time DhtRuntime::wall_now() {
  return std::chrono::duration_cast<Time>(std::chrono::system_clock::now().time_since_epoch());
}

DhtRuntime::DhtRuntime(std::shared_ptr<transport::Host> host, DhtOptions opts, std::uint64_t seed)
    : host_(std::move(host)),
      node_(std::make_unique<DhtNode>(std::make_shared<transport::Identity>(host_->identity()),
                                      host_->address(), opts, seed)),
      timer_(host_->executor()) {}

DhtRuntime::~DhtRuntime() = default;

std::shared_ptr<DhtRuntime> DhtRuntime::create(std::shared_ptr<transport::Host> host,
                                               DhtOptions opts, std::uint64_t seed) {
  auto rt = std::shared_ptr<DhtRuntime>(new DhtRuntime(host, opts, seed));
  std::weak_ptr<DhtRuntime> weak = rt;
  host->handle_message(kMethod, [weak](const transport::PeerInfo& from, transport::Payload body) {
    if (auto self = weak.lock()) self->on_message(from, std::move(body));
  });
  return rt;
}

void DhtRuntime::start(std::string advertise) {
  post([self = shared_from_this(), advertise](DhtNode& n, Time) {
    self->address_ = advertise.empty() ? self->host_->address() : advertise;
    n.set_address(self->address_);
  });
}

void DhtRuntime::set_address(std::string address) {
  post([self = shared_from_this(), address](DhtNode& n, Time) {
    self->address_ = address;
    n.set_address(address);
  });
}

void DhtRuntime::stop() {
  asio::post(host_->executor(), [self = shared_from_this()] {
    self->stopped_ = true;
    self->timer_.cancel();
    self->runs_.clear();
  });
}

void DhtRuntime::post(std::function<void(DhtNode&, Time)> fn) {
  asio::post(host_->executor(), [self = shared_from_this(), fn = std::move(fn)] {
    if (self->stopped_) return;
    fn(*self->node_, wall_now());
    self->pump();
  });
}

void DhtRuntime::post_wait(const std::function<void(DhtNode&, Time)>& fn) {
  transport::run_on(host_->executor(), [&] {
    if (stopped_) return;
    fn(*node_, wall_now());
    pump();
  });
}

void DhtRuntime::on_message(const transport::PeerInfo& from, transport::Payload body) {
  if (stopped_) return;
  node_->on_message(Peer{from.id, from.address}, body.bytes(), wall_now());
  pump();
}

void DhtRuntime::add_rider(std::weak_ptr<Rider> r) {
  riders_.push_back(std::move(r));
}

void DhtRuntime::pump() {
  std::erase_if(riders_, [](const auto& w) { return w.expired(); });
  for (auto& w : std::vector(riders_))
    if (auto r = w.lock()) r->after_event();
  for (auto& o : node_->take_outgoing()) {
    transport::PeerRef to{o.to.id, o.to.address};
    auto body = transport::Bytes::copy_of(o.bytes);
    std::function<void(std::error_code)> sent;
    if (o.txid) {
      // A dial that fails tells the node at once instead of after its RPC timeout.
      std::weak_ptr<DhtRuntime> weak = shared_from_this();
      sent = [weak, txid = o.txid](std::error_code ec) {
        if (!ec) return;
        if (auto self = weak.lock(); self && !self->stopped_) {
          self->node_->on_send_failed(txid, wall_now());
          self->pump();
        }
      };
    }
    host_->send(to, kMethod, std::move(body), std::move(sent));
  }
  arm();
}

void DhtRuntime::arm() {
  if (stopped_) return;
  Time due = node_->next_deadline();
  for (auto& m : runs_) due = std::min(due, m->next_deadline());
  for (auto& w : riders_)
    if (auto r = w.lock())
      if (auto d = r->next_deadline()) due = std::min(due, *d);
  if (due >= armed_for_) return;
  armed_for_ = due;
  const auto wait = std::max(Time(0), due - wall_now());
  timer_.expires_after(wait);
  timer_.async_wait(
      [weak = std::weak_ptr<DhtRuntime>(shared_from_this())](boost::system::error_code ec) {
        auto self = weak.lock();
        if (!self || self->stopped_) return;
        if (ec == asio::error::operation_aborted) return;  // re-armed earlier, or stopped
        self->armed_for_ = Time::max();
        const Time now = wall_now();
        self->node_->on_timer(now);
        for (auto& m : self->runs_) m->on_timer(now);
        for (auto& w : std::vector(self->riders_))
          if (auto r = w.lock()) r->on_timer(now);
        self->pump();
      });
}

void DhtRuntime::bootstrap(std::vector<std::string> peers, std::function<void(std::size_t)> done) {
  post([peers = std::move(peers), done = std::move(done)](DhtNode& n, Time now) {
    n.bootstrap(peers, now, done);
  });
}

void DhtRuntime::add_contact(std::string address) {
  post([address = std::move(address)](DhtNode& n, Time now) {
    n.add_contact(Endpoint{std::nullopt, address}, now);
  });
}

void DhtRuntime::get(const Key& key, DhtNode::GetCallback done, GetOptions opts) {
  post([key, done = std::move(done), opts](DhtNode& n, Time now) { n.get(key, now, done, opts); });
}

void DhtRuntime::put_signed(const Key& key, std::string subkey, std::uint64_t seq, Time ttl,
                            std::vector<std::uint8_t> value, DhtNode::PutCallback done) {
  post([=, subkey = std::move(subkey), value = std::move(value)](DhtNode& n, Time now) {
    n.put_signed(key, subkey, seq, now + ttl, value, now, done);
  });
}

std::shared_ptr<Membership> DhtRuntime::join(const std::string& run_id, MembershipOptions opts,
                                             MemberInfo self) {
  auto m = std::make_shared<Membership>(*node_, run_id, opts);  // ConfigError on a bad run id
  post([rt = shared_from_this(), m, self = std::move(self)](DhtNode&, Time now) {
    m->set_self(self);
    rt->runs_.push_back(m);
    m->on_timer(now);
  });
  return m;
}

}  // namespace grove::dht
