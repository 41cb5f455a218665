// Host's side of relays and connection reversal (host.hpp, relay.hpp): the relay.* handlers it
// registers (serving circuits when it relays for others, taking circuits and dial-back requests
// from relays it reserved at), reservations, dial-back addresses, and dials through a relay.
// The rest of Host is in host.cpp.
#include "transport/host.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "transport/msgpack_util.hpp"
#include "transport/reach.hpp"
#include "transport/tcp_link.hpp"

namespace grove::transport {
namespace asio = boost::asio;

namespace {
// Relay control bodies (transport/relay.hpp): [1], [1, to id], [1, token], [1, from id, token].
std::vector<std::uint8_t> pack_relay(std::initializer_list<std::span<const std::uint8_t>> bins) {
  msgpack::sbuffer sb;
  mp::Packer p(sb);
  p.pack_array(static_cast<std::uint32_t>(1 + bins.size()));
  p.pack_uint8(1);
  for (auto b : bins) mp::pack_bin(p, b);
  return mp::bytes_of(sb);
}
// The bins of a relay body with `n` of them, each of the given size; false if it is not one.
bool unpack_relay(std::span<const std::uint8_t> body,
                  std::initializer_list<std::span<std::uint8_t>> out) {
  auto oh = unpack_bounded(body, {.array = 3, .map = 0, .str = 0, .bin = 32, .ext = 0, .depth = 1});
  if (!oh) return false;
  std::size_t n = 0;
  const mp::Obj* a = mp::get_array(oh->get(), 3, n);
  std::uint64_t v = 0;
  if (!a || n != 1 + out.size() || !mp::get_u64(a[0], v) || v != 1) return false;
  std::size_t i = 1;
  for (auto o : out) {
    const auto& e = a[i++];
    if (e.type != msgpack::type::BIN || e.via.bin.size != o.size()) return false;
    std::memcpy(o.data(), e.via.bin.ptr, o.size());
  }
  return true;
}
}  // namespace

// Relays (transport/relay.hpp). Every node answers "relay.incoming" (a relay it reserved at
// passes on a circuit); a TCP host that serves relays answers "relay.reserve" and
// "relay.connect" and splices the sockets that present its tokens.
void Host::serve_relay() {
  std::weak_ptr<Host> w = weak_from_this();
  msg_handlers_[kRelayIncoming] = [w](const PeerInfo& from, Payload body) {
    auto self = w.lock();
    NodeId who{};
    RelayToken token{};
    if (!self || !unpack_relay(body.bytes(), {who, token})) return;
    auto* tcp = dynamic_cast<TcpConnector*>(self->connector_.get());
    if (!tcp || !self->reserved_at_.contains(from.id)) return;  // only relays we reserved at
    if (self->relayed_dials_ >= kMaxRelayedDials) {
      spdlog::info("transport: {} relayed connections under way; refusing one from {} via {}",
                   kMaxRelayedDials, short_id(who), short_id(from.id));
      return;
    }
    ++self->relayed_dials_;
    tcp->dial_via_relay(from.address, token, Handshake::Role::responder, who,
                        self->opts_.connect_timeout, [w, who](Result<std::shared_ptr<Link>> r) {
                          auto self = w.lock();
                          if (!self) return;
                          --self->relayed_dials_;
                          if (!r || self->shut_) {
                            spdlog::debug("transport: relayed connection from {} failed: {}",
                                          short_id(who), r ? "shutting down" : r.error().message());
                            if (r) (*r)->close(make_error_code(errc::shutting_down), false);
                            return;
                          }
                          ++self->counters_.handshakes_ok;
                          self->add_session(std::move(*r));
                        });
  };
  // Connection reversal: a relay we reserved at passes on a node's request to be dialed.
  msg_handlers_[kRelayDialBack] = [w](const PeerInfo& from, Payload body) {
    auto self = w.lock();
    if (!self || self->shut_ || !self->reserved_at_.contains(from.id)) return;
    auto d = decode_relay_dialback(body.bytes());
    if (!d) {
      spdlog::info("transport: malformed relay.dialback from {}; ignored", short_id(from.id));
      return;
    }
    if (d->node == self->id() || self->find_session(PeerRef::node(d->node))) return;
    if (self->relayed_dials_ >= kMaxRelayedDials) {
      spdlog::info("transport: {} relayed connections under way; not dialing {} back",
                   kMaxRelayedDials, short_id(d->node));
      return;
    }
    ++self->relayed_dials_;
    self->dial_back(d->node, std::move(d->addresses), 0);
  };
  auto* tcp = dynamic_cast<TcpConnector*>(connector_.get());
  if (!tcp || !opts_.relay.serve) {
    for (const char* m : {kRelayReserve, kRelayConnect, kRelayReverse})
      req_handlers_[m] = [](const PeerInfo&, Payload, Responder r) {
        r.fail(errc::rejected, "this node does not relay");
      };
    return;
  }
  relay_ = std::make_shared<RelayServer>(strand_, opts_.relay);
  tcp->set_relay_hook([w](TcpLink::tcp::socket s, RelayToken t) {
    if (auto self = w.lock(); self && self->relay_) self->relay_->on_socket(std::move(s), t);
  });
  req_handlers_[kRelayReserve] = [w](const PeerInfo& from, Payload, Responder r) {
    auto self = w.lock();
    if (!self || !self->relay_->reserve(from.id))
      return r.fail(errc::rejected, "this node has no room for another reservation");
    r.reply(pack_relay({}));
  };
  req_handlers_[kRelayConnect] = [w](const PeerInfo& from, Payload body, Responder r) {
    auto self = w.lock();
    NodeId to{};
    if (!self || !unpack_relay(body.bytes(), {to}))
      return r.fail(errc::malformed, "malformed relay.connect");
    auto s = self->find_session(PeerRef::node(to));
    if (!s) return r.fail(errc::rejected, "that node is not connected here");
    auto token = self->relay_->open(from.id, to);
    if (!token) return r.fail(errc::rejected, token.why());
    s->send_message(kRelayIncoming, pack_relay({from.id, *token}));
    r.reply(pack_relay({*token}));
  };
  req_handlers_[kRelayReverse] = [w](const PeerInfo& from, Payload body, Responder r) {
    auto self = w.lock();
    auto d = decode_relay_dialback(body.bytes());
    if (!self || !d) return r.fail(errc::malformed, "malformed relay.reverse");
    auto s = self->find_session(PeerRef::node(d->node));
    if (!s || !self->relay_->reserved(d->node))
      return r.fail(errc::rejected, "that node has no reservation here");
    // Only addresses at the IP we see the asker at: a dial-back cannot be aimed at a third party.
    const std::string ip = ip_of(from.address);
    RelayDialBack out{from.id, {}};
    for (const auto& a : d->addresses)
      if (!ip.empty() && ip_of(a) == ip) out.addresses.push_back(a);
    if (out.addresses.empty())
      return r.fail(errc::rejected, "none of those addresses is at " + ip + ", where you are seen");
    self->relay_->count_reversal();
    s->send_message(kRelayDialBack, encode_relay_dialback(out));
    r.reply(pack_relay({}));
  };
}

// Dials `node` back at addresses[i], then the next ones, at a relay's word (relay.dialback).
void Host::dial_back(const NodeId& node, std::vector<std::string> addresses, std::size_t i) {
  const std::string addr = addresses[i];
  connector_->dial(addr, node, std::min(opts_.connect_timeout, opts_.dialback_wait),
                   [w = weak_from_this(), node, addresses = std::move(addresses),
                    i](Result<std::shared_ptr<Link>> r) mutable {
                     auto self = w.lock();
                     if (!self) return;
                     if (r && !self->shut_) {
                       --self->relayed_dials_;
                       ++self->counters_.handshakes_ok;
                       spdlog::debug("transport: dialed {} back at {} (connection reversal)",
                                     short_id(node), addresses[i]);
                       self->add_session(std::move(*r));
                       return;
                     }
                     if (r) (*r)->close(make_error_code(errc::shutting_down), false);
                     spdlog::debug("transport: could not dial {} back at {}: {}", short_id(node),
                                   addresses[i], r ? "shutting down" : r.error().message());
                     if (!self->shut_ && i + 1 < addresses.size())
                       return self->dial_back(node, std::move(addresses), i + 1);
                     --self->relayed_dials_;
                   });
}

void Host::set_dialback_addresses(std::vector<std::string> addresses) {
  asio::dispatch(strand_, [self = shared_from_this(), a = std::move(addresses)]() mutable {
    if (a.size() > kDialBackMaxAddresses) a.resize(kDialBackMaxAddresses);
    std::erase_if(a, [](const std::string& x) {
      return x.empty() || x.size() > kDialBackMaxAddress || x.starts_with("relay:");
    });
    self->dialback_addresses_ = std::move(a);
  });
}

void Host::reserve_relay(const PeerRef& relay, std::function<void(std::error_code)> done) {
  if (!relay.id) {
    asio::post(strand_, [done] {
      if (done) done(make_error_code(errc::unreachable));
    });
    return;
  }
  request(relay, kRelayReserve, Bytes::copy_of(pack_relay({})), opts_.connect_timeout,
          [w = weak_from_this(), relay_id = relay.id, done](Result<Payload> r) {
            auto self = w.lock();
            if (self && r && relay_id) self->reserved_at_.insert(*relay_id);
            if (done) done(r ? std::error_code{} : r.error());
          });
}

// A connection to `to` (an unreachable node) through the relay its address names: when we are
// reachable, the node is first asked to dial us back (no relay bandwidth); otherwise, or when no
// session arrives within dialback_wait, a circuit through the relay.
void Host::relay_dial(const PeerRef& to, Clock::time_point deadline) {
  NodeId relay{};
  std::string relay_addr;
  auto* tcp = dynamic_cast<TcpConnector*>(connector_.get());
  if (!to.id || !tcp || !parse_relay_address(to.address, relay, relay_addr) || relay == id())
    return dialed(to.address, errc::unreachable);
  const NodeId target = *to.id;
  if (dialback_addresses_.empty())
    return relay_circuit(to.address, relay, relay_addr, target, deadline);
  const auto wait_until = std::min(deadline, Clock::now() + opts_.dialback_wait);
  const auto left = std::chrono::duration_cast<Duration>(wait_until - Clock::now());
  request(PeerRef::node(relay, relay_addr), kRelayReverse,
          Bytes::copy_of(encode_relay_dialback({target, dialback_addresses_})),
          std::max(Duration(1), left),
          [w = weak_from_this(), addr = to.address, relay, relay_addr, target, deadline,
           wait_until](Result<Payload> r) {
            auto self = w.lock();
            if (!self) return;
            auto circuit = [w, addr, relay, relay_addr, target, deadline] {
              auto self = w.lock();
              if (!self) return;
              if (Clock::now() >= deadline) return self->dialed(addr, errc::timed_out);
              self->relay_circuit(addr, relay, relay_addr, target, deadline);
            };
            if (!r) {
              spdlog::debug("transport: {} passed no dial-back on to {}: {}", short_id(relay),
                            short_id(target), r.error().message());
              return circuit();
            }
            self->await_inbound(target, wait_until,
                                [w, addr, relay, target, circuit](Result<SessionPtr> s) {
                                  auto self = w.lock();
                                  if (!self) return;
                                  if (!s) return circuit();
                                  ++self->counters_.dialbacks;
                                  spdlog::debug("transport: {} dialed us back (asked via {})",
                                                short_id(target), short_id(relay));
                                  self->finish_dial(addr, std::move(s));
                                });
          });
}

void Host::relay_circuit(const std::string& addr, const NodeId& relay,
                         const std::string& relay_addr, const NodeId& target,
                         Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
  request(PeerRef::node(relay, relay_addr), kRelayConnect, Bytes::copy_of(pack_relay({target})),
          std::max(Duration(1), left),
          [w = weak_from_this(), addr, relay_addr, target, deadline](Result<Payload> r) {
            auto self = w.lock();
            if (!self) return;
            RelayToken token{};
            if (!r) return self->dialed(addr, r.error());
            if (!unpack_relay(r->bytes(), {token})) return self->dialed(addr, errc::malformed);
            auto* tcp = dynamic_cast<TcpConnector*>(self->connector_.get());
            const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
            tcp->dial_via_relay(relay_addr, token, Handshake::Role::initiator, target,
                                std::max(Duration(1), left),
                                [w, addr](Result<std::shared_ptr<Link>> r) {
                                  if (auto self = w.lock()) self->dialed(addr, std::move(r));
                                });
          });
}

}  // namespace grove::transport
