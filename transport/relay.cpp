#include "transport/relay.hpp"

#include <cstring>

#include <sodium.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"
#include "transport/schema.hpp"

namespace grove::transport {

namespace asio = boost::asio;

namespace {
constexpr std::array<std::uint8_t, 4> kMagic{'G', 'R', 'V', 'R'};
constexpr std::size_t kSpliceBuffer = 64 * 1024;
}  // namespace

std::vector<std::uint8_t> relay_preamble(const RelayToken& t) {
  std::vector<std::uint8_t> out{0, static_cast<std::uint8_t>(kRelayPreamble)};
  out.insert(out.end(), kMagic.begin(), kMagic.end());
  out.push_back(1);
  out.insert(out.end(), t.begin(), t.end());
  return out;
}

std::optional<RelayToken> parse_relay_preamble(std::span<const std::uint8_t> body) {
  if (body.size() != kRelayPreamble || !std::equal(kMagic.begin(), kMagic.end(), body.begin()) ||
      body[4] != 1)
    return std::nullopt;
  RelayToken t;
  std::memcpy(t.data(), body.data() + 5, t.size());
  return t;
}

std::string relay_address(const NodeId& relay, const std::string& relay_addr) {
  return "relay:" + to_hex(relay) + "@" + relay_addr;
}

bool parse_relay_address(const std::string& a, NodeId& relay, std::string& relay_addr) {
  constexpr std::string_view kPrefix = "relay:";
  if (a.size() < kPrefix.size() + 64 + 2 || a.compare(0, kPrefix.size(), kPrefix) != 0 ||
      a[kPrefix.size() + 64] != '@')
    return false;
  const std::string hex = a.substr(kPrefix.size(), 64);
  std::size_t n = 0;
  if (sodium_hex2bin(relay.data(), relay.size(), hex.data(), hex.size(), nullptr, &n, nullptr) !=
          0 ||
      n != relay.size())
    return false;
  relay_addr = a.substr(kPrefix.size() + 65);
  return !relay_addr.empty();
}

namespace {
constexpr auto kDialBackSchema = schema::record<RelayDialBack>(
    "relay dial-back", 1, schema::field("node", &RelayDialBack::node, schema::Bin{32}),
    schema::field("addresses", &RelayDialBack::addresses,
                  schema::list(kDialBackMaxAddresses, schema::Str{kDialBackMaxAddress, 1}, 1)));
}  // namespace

std::vector<std::uint8_t> encode_relay_dialback(const RelayDialBack& d) {
  return schema::encode(kDialBackSchema, d);
}

Result<RelayDialBack> decode_relay_dialback(std::span<const std::uint8_t> body) {
  return schema::decode(kDialBackSchema, body);
}

// Two sockets and a pump in each direction. A pump reads what has arrived (up to 64 KiB),
// waits for the relay's shared rate to allow it, writes it to the other socket, and reads
// again: TCP's own flow control bounds what the relay holds to one buffer per direction.
class RelayServer::Circuit : public std::enable_shared_from_this<Circuit> {
 public:
  Circuit(std::weak_ptr<RelayServer> server, tcp::socket a, tcp::socket b, std::uint64_t max)
      : server_(std::move(server)), max_(max) {
    s_[0] = std::make_unique<tcp::socket>(std::move(a));
    s_[1] = std::make_unique<tcp::socket>(std::move(b));
  }
  void start() {
    pump(0);
    pump(1);
  }
  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    for (auto& s : s_) {
      s->shutdown(tcp::socket::shutdown_both, ignored);
      s->close(ignored);
    }
    if (auto srv = server_.lock()) srv->circuit_done(this, bytes_);
  }

 private:
  void pump(int from) {
    if (closed_) return;
    s_[from]->async_read_some(
        asio::buffer(buf_[from]),
        [self = shared_from_this(), from](boost::system::error_code ec, std::size_t n) {
          if (ec || self->closed_) return self->close();
          self->bytes_ += n;
          if (self->bytes_ > self->max_) {
            spdlog::info("relay: a circuit reached its limit of {} bytes; closing it", self->max_);
            return self->close();
          }
          auto srv = self->server_.lock();
          if (!srv) return self->close();
          srv->pace(n, [self, from, n] {
            if (self->closed_) return;
            asio::async_write(*self->s_[1 - from], asio::buffer(self->buf_[from].data(), n),
                              [self, from](boost::system::error_code ec, std::size_t) {
                                if (ec) return self->close();
                                self->pump(from);
                              });
          });
        });
  }

  std::weak_ptr<RelayServer> server_;
  std::uint64_t max_;
  std::unique_ptr<tcp::socket> s_[2];
  std::array<std::array<std::uint8_t, kSpliceBuffer>, 2> buf_{};
  std::uint64_t bytes_ = 0;
  bool closed_ = false;
};

RelayServer::RelayServer(asio::any_io_executor strand, RelayOptions o)
    : strand_(std::move(strand)), opts_(o), refilled_(std::chrono::steady_clock::now()) {}

RelayServer::~RelayServer() = default;

bool RelayServer::reserve(const NodeId& node) {
  if (closed_ || !opts_.serve) return false;
  if (reserved_.contains(node)) return true;
  if (reserved_.size() >= opts_.max_reservations) return false;
  reserved_.insert(node);
  return true;
}

void RelayServer::drop(const NodeId& node) {
  reserved_.erase(node);
}

Result<RelayToken> RelayServer::open(const NodeId& from, const NodeId& to) {
  auto refuse = [&](const char* w) -> Result<RelayToken> {
    ++stats_.refused;
    return {errc::rejected, w};
  };
  if (closed_ || !opts_.serve) return refuse("this node does not relay");
  if (!reserved_.contains(to)) return refuse("no reservation for that node here");
  if (from == to) return refuse("a circuit to oneself");
  if (circuits_.size() + pending_.size() >= opts_.max_circuits)
    return refuse("the relay's circuits are all in use");
  RelayToken t;
  randombytes_buf(t.data(), t.size());
  Pending& p = pending_[t];
  p.timer = std::make_unique<asio::steady_timer>(strand_, opts_.pair_timeout);
  p.timer->async_wait([w = weak_from_this(), t](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self) return;
    auto it = self->pending_.find(t);
    if (it == self->pending_.end()) return;
    spdlog::debug("relay: a circuit's second end did not come");
    if (it->second.first) {
      boost::system::error_code ignored;
      it->second.first->close(ignored);
    }
    self->pending_.erase(it);
  });
  return t;
}

void RelayServer::on_socket(tcp::socket s, const RelayToken& token) {
  auto it = pending_.find(token);
  boost::system::error_code ignored;
  if (closed_ || it == pending_.end()) {
    spdlog::debug("relay: a connection with an unknown or spent token");
    s.close(ignored);
    return;
  }
  if (!it->second.first) {
    it->second.first = std::make_unique<tcp::socket>(std::move(s));
    return;
  }
  auto first = std::move(it->second.first);
  it->second.timer->cancel();
  pending_.erase(it);
  first->set_option(tcp::no_delay(true), ignored);
  s.set_option(tcp::no_delay(true), ignored);
  auto c = std::make_shared<Circuit>(weak_from_this(), std::move(*first), std::move(s),
                                     opts_.max_circuit_bytes);
  circuits_.emplace(c.get(), c);
  ++stats_.circuits_total;
  c->start();
}

void RelayServer::pace(std::size_t n, std::function<void()> go) {
  if (opts_.bytes_per_sec <= 0) return go();
  // Token bucket: at most a quarter second of rate saved up.
  const auto now = std::chrono::steady_clock::now();
  allowance_ = std::min(
      opts_.bytes_per_sec / 4,
      allowance_ + opts_.bytes_per_sec * std::chrono::duration<double>(now - refilled_).count());
  refilled_ = now;
  allowance_ -= static_cast<double>(n);
  if (allowance_ >= 0) return go();
  const auto wait = std::chrono::duration<double>(-allowance_ / opts_.bytes_per_sec);
  auto t = std::make_shared<asio::steady_timer>(
      strand_, std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait));
  t->async_wait([t, go = std::move(go)](boost::system::error_code) { go(); });
}

void RelayServer::circuit_done(Circuit* c, std::uint64_t bytes) {
  stats_.bytes += bytes;
  asio::post(strand_, [w = weak_from_this(), c] {  // not from inside the circuit's own call
    if (auto self = w.lock()) self->circuits_.erase(c);
  });
}

void RelayServer::close() {
  if (closed_) return;
  closed_ = true;
  reserved_.clear();
  boost::system::error_code ignored;
  for (auto& [t, p] : pending_) {
    p.timer->cancel();
    if (p.first) p.first->close(ignored);
  }
  pending_.clear();
  auto all = circuits_;
  for (auto& [raw, c] : all) c->close();
}

RelayStats RelayServer::stats() const {
  RelayStats s = stats_;
  s.reservations = reserved_.size();
  s.circuits = circuits_.size();
  return s;
}

}  // namespace grove::transport
