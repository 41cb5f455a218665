// Relays between real TCP hosts on loopback: two hosts that accept no connections talk through a
// third, the relay's limits and refusals, and a relay shut down mid-request.
#include "transport/relay.hpp"

#include <gtest/gtest.h>

#include "tests/transport/test_util.hpp"

namespace grove::transport {
namespace {

using namespace std::chrono_literals;
using namespace test;

HostOptions dial_only() {
  HostOptions o;
  o.listen = "";
  return o;
}

std::error_code reserve(const std::shared_ptr<Host>& b, const std::shared_ptr<Host>& relay) {
  std::promise<std::error_code> p;
  b->reserve_relay(PeerRef::node(relay->id(), relay->address()),
                   [&](std::error_code ec) { p.set_value(ec); });
  auto f = p.get_future();
  return await(f, 10s).value_or(make_error_code(errc::timed_out));
}

TEST(Relay, PreambleAndAddressRoundTrip) {
  RelayToken t{};
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint8_t>(i * 13);
  const auto p = relay_preamble(t);
  ASSERT_EQ(p.size(), 2 + kRelayPreamble);
  EXPECT_EQ(parse_relay_preamble(std::span(p).subspan(2)), t);
  EXPECT_FALSE(parse_relay_preamble(std::span(p).subspan(3)));
  auto bad = p;
  bad[2] = 'X';
  EXPECT_FALSE(parse_relay_preamble(std::span(bad).subspan(2)));
  const NodeId id = Identity::generate().id();
  NodeId back{};
  std::string addr;
  ASSERT_TRUE(parse_relay_address(relay_address(id, "[2001:db8::1]:7400"), back, addr));
  EXPECT_EQ(back, id);
  EXPECT_EQ(addr, "[2001:db8::1]:7400");
  EXPECT_FALSE(parse_relay_address("relay:abc@1.2.3.4:5", back, addr));
  EXPECT_FALSE(parse_relay_address("1.2.3.4:5", back, addr));
  EXPECT_FALSE(parse_relay_address(relay_address(id, ""), back, addr));
}

// A and B both accept no connections; B keeps a reservation at R. A reaches B through R, both
// ways, with a 4 MB body intact; the relay counts one circuit.
TEST(Relay, TwoHostsThatAcceptNoConnectionsTalkThroughARelay) {
  World w;
  auto r = w.host();
  auto a = w.host(dial_only()), b = w.host(dial_only());
  add_echo(a);
  add_echo(b);
  w.start(r);
  w.start(a);
  w.start(b);
  ASSERT_EQ(reserve(b, r), std::error_code{});
  const std::string via = relay_address(r->id(), r->address());
  std::string big(4 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  auto got = call(a, PeerRef::node(b->id(), via), "echo", big, 20s);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_TRUE(*got == big);
  // B answers A over the same (relayed) session.
  auto back = call(b, PeerRef::node(a->id()), "echo", "back", 5s);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(*back, "back");
  run_on(r->executor(), [&] {
    EXPECT_EQ(r->relay_stats().circuits_total, 1u);
    EXPECT_EQ(r->relay_stats().reservations, 1u);
  });
  // Nobody can be reached through a relay it holds no reservation at.
  auto c = w.host(dial_only());
  w.start(c);
  auto none = call(a, PeerRef::node(c->id(), via), "echo", "x", 5s);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error(), make_error_code(errc::rejected)) << none.error().message();
}

TEST(Relay, LimitsAndOptOut) {
  World w;
  HostOptions no_relay;
  no_relay.relay.serve = false;
  auto quiet = w.host(no_relay);
  HostOptions one;
  one.relay.max_circuits = 1;
  one.relay.pair_timeout = 300ms;
  auto r = w.host(one);
  auto a = w.host(dial_only()), b = w.host(dial_only()), c = w.host(dial_only());
  add_echo(b);
  add_echo(c);
  for (auto& h : {quiet, r, a, b, c}) w.start(h);
  EXPECT_EQ(reserve(b, quiet), make_error_code(errc::rejected));  // --no-relay
  ASSERT_EQ(reserve(b, r), std::error_code{});
  ASSERT_EQ(reserve(c, r), std::error_code{});
  const std::string via = relay_address(r->id(), r->address());
  ASSERT_TRUE(call(a, PeerRef::node(b->id(), via), "echo", "1", 10s));
  auto second = call(a, PeerRef::node(c->id(), via), "echo", "2", 10s);
  ASSERT_FALSE(second) << "one circuit at most";
  EXPECT_EQ(second.error(), make_error_code(errc::rejected));
  run_on(r->executor(), [&] { EXPECT_GE(r->relay_stats().refused, 1u); });
}

// The relay goes away while A waits for B's answer: A's request fails promptly (a cut
// connection), it does not hang until its own deadline.
TEST(Relay, ARelayThatDiesCutsTheCircuit) {
  World w;
  auto r = w.host();
  auto a = w.host(dial_only()), b = w.host(dial_only());
  std::optional<Responder> held;
  b->handle("hold", [&](const PeerInfo&, Payload, Responder res) { held.emplace(std::move(res)); });
  add_echo(b);
  for (auto& h : {r, a, b}) w.start(h);
  ASSERT_EQ(reserve(b, r), std::error_code{});
  const PeerRef to_b = PeerRef::node(b->id(), relay_address(r->id(), r->address()));
  ASSERT_TRUE(call(a, to_b, "echo", "up", 10s));
  std::promise<std::error_code> p;
  a->request(to_b, "hold", Bytes(), 60s, [&](Result<Payload> res) { p.set_value(res.error()); });
  ASSERT_TRUE(eventually(b->executor(), [&] { return held.has_value(); }));
  const auto t0 = Clock::now();
  r->shutdown();
  auto f = p.get_future();
  auto ec = await(f, 30s);
  ASSERT_TRUE(ec);
  EXPECT_TRUE(*ec) << "the request cannot have succeeded";
  EXPECT_LT(Clock::now() - t0, 15s);
  run_on(b->executor(), [&] { held.reset(); });
}

// Connection reversal: A accepts connections and says where; B (behind R) is asked through R to
// dial A back and does: a direct session, no circuit. A dial-back that cannot arrive (a closed
// port) or that the relay refuses to pass on (an address at another IP than A's) falls back to a
// relayed circuit within the dial's deadline.
TEST(Relay, AReachableNodeIsDialedBackInsteadOfRelayed) {
  World w;
  auto r = w.host();
  HostOptions quick;
  quick.dialback_wait = 500ms;
  auto a = w.host(quick), a2 = w.host(quick), a3 = w.host(quick);
  auto b = w.host(dial_only());
  add_echo(b);
  for (auto& h : {r, a, a2, a3, b}) w.start(h);
  ASSERT_EQ(reserve(b, r), std::error_code{});
  a->set_dialback_addresses({a->address()});
  a2->set_dialback_addresses({"127.0.0.1:1"});     // nobody listens there
  a3->set_dialback_addresses({"192.0.2.7:7400"});  // not where R sees a3
  const PeerRef to_b = PeerRef::node(b->id(), relay_address(r->id(), r->address()));
  const auto session_with_b = [&](const std::shared_ptr<Host>& h) {
    return run_on(h->executor(), [&] {
      std::optional<PeerInfo> found;
      for (const auto& p : h->peers())
        if (p.id == b->id()) found = p;
      return found;
    });
  };

  auto got = call(a, to_b, "echo", "direct", 10s);
  ASSERT_TRUE(got) << got.error().message();
  auto pa = session_with_b(a);
  ASSERT_TRUE(pa);
  EXPECT_FALSE(pa->relayed);
  EXPECT_TRUE(pa->inbound) << "B dialed A";
  run_on(a->executor(), [&] { EXPECT_EQ(a->stats().dialbacks, 1u); });
  run_on(r->executor(), [&] {
    EXPECT_EQ(r->relay_stats().reversals, 1u);
    EXPECT_EQ(r->relay_stats().circuits_total, 0u);
  });

  for (const auto& h : {a2, a3}) {
    auto res = call(h, to_b, "echo", "relayed", 10s);
    ASSERT_TRUE(res) << res.error().message();
    auto p = session_with_b(h);
    ASSERT_TRUE(p);
    EXPECT_TRUE(p->relayed);
    run_on(h->executor(), [&] { EXPECT_EQ(h->stats().dialbacks, 0u); });
  }
  run_on(r->executor(), [&] {
    EXPECT_EQ(r->relay_stats().reversals, 2u) << "a3's address was not passed on";
    EXPECT_EQ(r->relay_stats().circuits_total, 2u);
  });
}

TEST(Relay, DialBackCodecRejectsWhatItMust) {
  RelayDialBack d;
  d.node = Identity::generate().id();
  d.addresses = {"1.2.3.4:5", "[2001:db8::1]:7400"};
  auto back = decode_relay_dialback(encode_relay_dialback(d));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node, d.node);
  EXPECT_EQ(back->addresses, d.addresses);
  d.addresses.clear();
  EXPECT_FALSE(decode_relay_dialback(encode_relay_dialback(d))) << "no address";
  d.addresses.assign(kDialBackMaxAddresses + 1, "1.2.3.4:5");
  EXPECT_FALSE(decode_relay_dialback(encode_relay_dialback(d))) << "too many";
  d.addresses = {std::string(kDialBackMaxAddress + 1, '1')};
  EXPECT_FALSE(decode_relay_dialback(encode_relay_dialback(d))) << "too long";
  auto bytes = encode_relay_dialback({d.node, {"1.2.3.4:5"}});
  bytes.pop_back();
  EXPECT_FALSE(decode_relay_dialback(bytes)) << "truncated";
}

}  // namespace
}  // namespace grove::transport
