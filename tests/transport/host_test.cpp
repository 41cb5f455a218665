// Host-level behaviour over real TCP: large streams, identity checks, limits, shutdown.
#include "transport/host.hpp"

#include <gtest/gtest.h>
#include <sodium.h>

#include "test_util.hpp"

namespace grove::transport {
namespace {
using namespace test;

class BigStream : public ::testing::TestWithParam<bool> {};  // inline crypto or workers

TEST_P(BigStream, Stream512MBArrivesIntact) {
  World w;
  auto key = SwarmKey::generate();
  HostOptions o;
  o.swarm_key = key;
  o.link.inline_crypto = GetParam();
  auto a = w.host(o), b = w.host(o);
  struct HashingSink : StreamSink {
    HashingSink() { crypto_generichash_init(&st, nullptr, 0, 32); }
    void on_data(Chunk c) override {
      ok_order = ok_order && c.offset() == got;
      got += c.bytes().size();
      crypto_generichash_update(&st, c.bytes().data(), c.bytes().size());
    }
    void on_end(std::error_code ec) override {
      Hash256 h;
      crypto_generichash_final(&st, h.data(), h.size());
      done.set_value({ec, to_hex(h)});
    }
    crypto_generichash_state st;
    std::uint64_t got = 0;
    bool ok_order = true;
    std::promise<std::pair<std::error_code, std::string>> done;
  };
  auto sink = std::make_shared<HashingSink>();
  std::uint64_t announced = 0;
  b->accept_streams("tensor", [&](const PeerInfo& from, IncomingStream& in) {
    EXPECT_EQ(from.id, a->id());
    announced = in.size;
    return sink;
  });
  w.start(a);
  w.start(b);
  const std::uint64_t size = 512ull << 20;
  // Expected hash, computed independently of the transport.
  std::string expected;
  {
    PatternSource src(size, 99);
    crypto_generichash_state st;
    crypto_generichash_init(&st, nullptr, 0, 32);
    std::vector<std::uint8_t> buf(4 << 20);
    for (std::uint64_t off = 0; off < size; off += buf.size()) {
      ASSERT_TRUE(src.read(off, buf));
      crypto_generichash_update(&st, buf.data(), buf.size());
    }
    Hash256 h;
    crypto_generichash_final(&st, h.data(), h.size());
    expected = to_hex(h);
  }
  std::promise<std::error_code> sent;
  a->send_stream(PeerRef::at(b->address()), "tensor", Bytes(),
                 std::make_shared<PatternSource>(size, 99),
                 [&](std::error_code ec) { sent.set_value(ec); });
  auto fs = sent.get_future();
  ASSERT_EQ(await(fs, std::chrono::minutes(4)), std::error_code());
  auto fr = sink->done.get_future();
  auto r = await(fr, 30s);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->first);
  EXPECT_EQ(announced, size);
  EXPECT_EQ(sink->got, size);
  EXPECT_TRUE(sink->ok_order);
  EXPECT_EQ(r->second, expected);
}

INSTANTIATE_TEST_SUITE_P(Crypto, BigStream, ::testing::Values(true, false),
                         [](const auto& i) { return i.param ? "inline" : "workers"; });

TEST(Host, ExpectedIdentityIsEnforced) {
  World w;
  auto a = w.host(), b = w.host();
  add_echo(b);
  w.start(a);
  w.start(b);
  EXPECT_EQ(call(a, PeerRef::node(Identity::generate().id(), b->address()), "echo", "x").error(),
            make_error_code(errc::wrong_peer));
  auto r = call(a, PeerRef::node(b->id(), b->address()), "echo", "x");
  EXPECT_TRUE(r) << r.error().message();
}

TEST(Host, UnreachableAndBadAddressFailFast) {
  World w;
  auto a = w.host();
  w.start(a);
  const auto t0 = Clock::now();
  EXPECT_EQ(call(a, PeerRef::at("127.0.0.1:1"), "echo", "x").error(),
            make_error_code(errc::unreachable));
  EXPECT_EQ(call(a, PeerRef::at("not an address"), "echo", "x").error(),
            make_error_code(errc::unreachable));
  EXPECT_LT(Clock::now() - t0, 5s);
}

// A dial-back check proves who listens at an address over a connection of its own and leaves
// no session behind on either side.
TEST(Host, ProbeProvesTheListenerWithoutOpeningASession) {
  World w;
  auto a = w.host(), b = w.host();
  w.start(a);
  w.start(b);
  auto probe = [&](const std::string& addr, const NodeId& id) {
    std::promise<std::error_code> p;
    a->probe(addr, id, 3s, [&](std::error_code ec) { p.set_value(ec); });
    auto f = p.get_future();
    return await(f, 10s).value_or(make_error_code(errc::timed_out));
  };
  EXPECT_EQ(probe(b->address(), b->id()), std::error_code{});
  EXPECT_EQ(probe(b->address(), Identity::generate().id()), make_error_code(errc::wrong_peer));
  EXPECT_EQ(probe("127.0.0.1:1", b->id()), make_error_code(errc::unreachable));
  EXPECT_TRUE(eventually(b->executor(), [&] { return b->stats().half_open == 0; }));
  run_on(a->executor(), [&] { EXPECT_EQ(a->stats().sessions, 0u); });
  run_on(b->executor(), [&] {
    EXPECT_EQ(b->stats().sessions, 0u);
    EXPECT_EQ(b->stats().handshakes_ok, 0u);
  });
}

// A node that accepts no connections is reached over the connection it opens to us: an
// operation addressed to it by id alone waits for that connection until its deadline.
TEST(Host, AnAddresslessPeerIsWaitedForUntilItConnects) {
  World w;
  auto a = w.host();
  HostOptions dial_only;
  dial_only.listen = "";
  auto c = w.host(dial_only);
  add_echo(c);
  add_echo(a);
  w.start(a);
  w.start(c);
  std::promise<Result<std::string>> p;
  a->request(PeerRef::node(c->id()), "echo", Bytes::copy_of(as_bytes("to c")), 20s,
             [&](Result<Payload> r) {
               if (!r) return p.set_value(r.error());
               auto b = r->bytes();
               p.set_value(std::string(b.begin(), b.end()));
             });
  ASSERT_TRUE(call(c, PeerRef::at(a->address()), "echo", "hello"));  // c connects to a
  auto f = p.get_future();
  auto r = await(f, 20s);
  ASSERT_TRUE(r);
  ASSERT_TRUE(*r) << r->error().message();
  EXPECT_EQ(**r, "to c");
  // One that never connects fails at the deadline, not before and not much after.
  const auto t0 = Clock::now();
  auto never = Identity::generate().id();
  EXPECT_EQ(call(a, PeerRef::node(never), "echo", "x", 500ms).error(),
            make_error_code(errc::unreachable));
  EXPECT_GE(Clock::now() - t0, 400ms);
  EXPECT_LT(Clock::now() - t0, 5s);
}

TEST(Host, BadListenAddressIsAConfigError) {
  World w;
  HostOptions o;
  o.listen = "nonsense";
  auto a = w.host(o);
  EXPECT_THROW(run_on(a->executor(), [&] { a->start(); }), ConfigError);
  o.listen = "127.0.0.1:99999";
  auto b = w.host(o);
  EXPECT_THROW(run_on(b->executor(), [&] { b->start(); }), ConfigError);
}

TEST(Host, ConnectionLimit) {
  World w;
  HostOptions o;
  o.max_connections = 1;
  auto server = w.host(o);
  add_echo(server);
  auto c1 = w.host(), c2 = w.host();
  w.start(server);
  ASSERT_TRUE(call(c1, PeerRef::at(server->address()), "echo", "1"));
  EXPECT_FALSE(call(c2, PeerRef::at(server->address()), "echo", "2", 3s));
  // Once c1 leaves, c2 gets in.
  c1->disconnect(server->id());
  ASSERT_TRUE(eventually(server->executor(), [&] { return server->stats().sessions == 0; }));
  EXPECT_TRUE(call(c2, PeerRef::at(server->address()), "echo", "2"));
}

TEST(Host, ShutdownFailsPendingWorkAndRefusesNew) {
  World w;
  auto a = w.host(), b = w.host();
  std::optional<Responder> held;
  b->handle("hold", [&](const PeerInfo&, Payload, Responder r) { held.emplace(std::move(r)); });
  w.start(a);
  w.start(b);
  std::promise<std::error_code> p;
  a->request(PeerRef::at(b->address()), "hold", Bytes(), 60s,
             [&](Result<Payload> r) { p.set_value(r.error()); });
  ASSERT_TRUE(eventually(b->executor(), [&] { return held.has_value(); }));
  b->shutdown();
  auto f = p.get_future();
  auto ec = await(f, 5s);
  ASSERT_TRUE(ec);
  EXPECT_EQ(*ec, make_error_code(errc::connection_closed)) << ec->message();
  EXPECT_EQ(call(b, PeerRef::at(a->address()), "echo", "x").error(),
            make_error_code(errc::shutting_down));
  run_on(b->executor(), [&] { held.reset(); });
}

// Two hosts that dial each other at the same moment get two sessions; both keep the one dialed
// by the smaller id, traffic flows throughout, and the other session closes once idle.
TEST(Host, SimultaneousDialsConvergeOnOneSession) {
  int duplicates = 0;
  for (int attempt = 0; attempt < 20 && duplicates == 0; ++attempt) {
    World w;
    HostOptions o;
    o.duplicate_grace = 200ms;
    auto a = w.host(o), b = w.host(o);
    add_echo(a);
    add_echo(b);
    w.start(a);
    w.start(b);
    std::promise<Result<PeerInfo>> pa, pb;
    a->connect(PeerRef::node(b->id(), b->address()), [&](Result<PeerInfo> r) { pa.set_value(r); });
    b->connect(PeerRef::node(a->id(), a->address()), [&](Result<PeerInfo> r) { pb.set_value(r); });
    auto fa = pa.get_future(), fb = pb.get_future();
    auto ra = await(fa, 10s), rb = await(fb, 10s);
    ASSERT_TRUE(ra && *ra) << "a could not connect";
    ASSERT_TRUE(rb && *rb) << "b could not connect";
    const auto dup_a = run_on(a->executor(), [&] { return a->stats().duplicate_sessions; });
    const auto dup_b = run_on(b->executor(), [&] { return b->stats().duplicate_sessions; });
    if (dup_a + dup_b == 0) continue;  // one dial won the race: nothing to converge
    ++duplicates;
    // Requests keep working both ways while the duplicate winds down, and after.
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(call(a, PeerRef::node(b->id(), b->address()), "echo", "x"));
      ASSERT_TRUE(call(b, PeerRef::node(a->id(), a->address()), "echo", "y"));
    }
    EXPECT_TRUE(eventually(
        a->executor(), [&] { return a->stats().sessions == 1; }, 15s));
    EXPECT_TRUE(eventually(
        b->executor(), [&] { return b->stats().sessions == 1; }, 15s));
    ASSERT_TRUE(call(a, PeerRef::node(b->id(), b->address()), "echo", "x"));
    ASSERT_TRUE(call(b, PeerRef::node(a->id(), a->address()), "echo", "y"));
    EXPECT_EQ(run_on(a->executor(), [&] { return a->stats().sessions; }), 1u);
    EXPECT_EQ(run_on(b->executor(), [&] { return b->stats().sessions; }), 1u);
  }
  EXPECT_GT(duplicates, 0) << "simultaneous dials never produced two sessions in 20 tries";
}

TEST(Host, ManyPeersConcurrently) {
  World w;
  auto server = w.host();
  add_echo(server);
  w.start(server);
  std::vector<std::shared_ptr<Host>> clients;
  for (int i = 0; i < 12; ++i) clients.push_back(w.host());
  std::vector<std::promise<bool>> ps(clients.size() * 10);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    auto& c = clients[i % clients.size()];
    c->request(PeerRef::at(server->address()), "echo", Bytes::copy_of(as_bytes(std::to_string(i))),
               10s, [&ps, i](Result<Payload> r) {
                 ps[i].set_value(r && std::string(r->bytes().begin(), r->bytes().end()) ==
                                          std::to_string(i));
               });
  }
  for (auto& p : ps) {
    auto f = p.get_future();
    EXPECT_EQ(await(f, 20s), true);
  }
  EXPECT_EQ(run_on(server->executor(), [&] { return server->stats().sessions; }), clients.size());
}

}  // namespace
}  // namespace grove::transport
