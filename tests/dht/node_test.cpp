// DhtNode behaviour on small simulated networks and with hand-made messages.
#include "tests/dht/swarm_util.hpp"

namespace grove::dht::test {
namespace {

std::vector<std::uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

TEST(DhtNode, PutThenGetOnSmallSwarm) {
  DhtNetwork net(9, LinkModel{Time(10), Time(0), 0.0}, sim_options());
  std::mt19937_64 rng(1);
  grow(net, 30, rng);
  net.run_for(Time(10'000));
  const Key key = key_of("hello");
  auto p = put(net, 3, key, "", 1, Time(600'000), bytes_of("world"));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->tried, 20u);
  EXPECT_EQ(p->acked, 20u);
  std::size_t holders = 0;
  for (auto i : net.alive_nodes()) holders += net.node(i).storage().all(key, net.now()).size();
  EXPECT_GE(holders, 20u);
  for (std::size_t from : {0, 7, 29}) {
    auto g = get(net, from, key);
    ASSERT_TRUE(g);
    ASSERT_EQ(g->records.size(), 1u) << "from " << from;
    EXPECT_EQ(g->records[0].value, bytes_of("world"));
  }
}

}  // namespace
}  // namespace grove::dht::test

namespace grove::dht::test {
namespace {

// A bare node driven by hand: messages in, messages out.
struct Bare {
  std::shared_ptr<transport::Identity> id =
      std::make_shared<transport::Identity>(transport::Identity::from_seed({42}));
  DhtNode node{id, "me:1", DhtOptions{}, 1};
  Time now{1'800'000'000'000};

  std::vector<Message> deliver(const Peer& from, const Message& m) {
    node.on_message(from, encode(m), now);
    std::vector<Message> out;
    for (auto& o : node.take_outgoing()) out.push_back(*decode(o.bytes, WireLimits{}));
    return out;
  }
};

Peer peer(std::uint8_t seed) {
  return {transport::Identity::from_seed({seed}).id(), "p:1"};
}

TEST(DhtNodeBare, StoreRejectsForgedAndReplayedRecords) {
  Bare b;
  auto owner = transport::Identity::from_seed({5});
  const Key k = key_of("k");
  Message st;
  st.type = MsgType::store;
  st.txid = 7;
  st.sender_address = "p:1";
  Record good = make_record(owner, k, "", 2, b.now + Time(60'000), {1});
  Record forged = good;
  forged.value = {6};  // changed after signing
  Record old = make_record(owner, k, "", 1, b.now + Time(60'000), {0});
  Record expired = make_record(owner, k, "e", 1, b.now - Time(1), {0});
  st.records = {good, forged, old, expired};
  auto out = b.deliver(peer(9), st);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, MsgType::stored);
  EXPECT_EQ(out[0].txid, 7u);
  EXPECT_EQ(out[0].codes, (std::vector<StoreCode>{StoreCode::stored, StoreCode::invalid,
                                                  StoreCode::stale, StoreCode::invalid}));
  auto held = b.node.storage().all(k, b.now);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].value, std::vector<std::uint8_t>{1});
  EXPECT_EQ(b.node.stats().bad_records, 2u);
}

TEST(DhtNodeBare, GetIgnoresForgedWrongKeyAndSpoofedReplies) {
  Bare b;
  auto honest = transport::Identity::from_seed({5});
  const Key k = key_of("k");
  // Teach the node one contact.
  Message ping;
  ping.type = MsgType::ping;
  ping.txid = 1;
  ping.sender_address = "p:1";
  b.deliver(peer(9), ping);
  std::optional<GetResult> res;
  b.node.get(k, b.now, [&](GetResult r) { res = std::move(r); });
  auto out = b.node.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  auto req = *decode(out[0].bytes, WireLimits{});
  ASSERT_EQ(req.type, MsgType::find_value);
  Message val;
  val.type = MsgType::value;
  val.txid = req.txid;
  val.sender_address = "p:1";
  Record good = make_record(honest, k, "", 1, b.now + Time(60'000), {1});
  Record forged = make_record(honest, k, "x", 1, b.now + Time(60'000), {1});
  forged.value = {2};
  Record other_key = make_record(honest, key_of("other"), "", 1, b.now + Time(60'000), {3});
  val.records = {good, forged, other_key};
  // The same reply from a node we did not ask is ignored.
  b.deliver(peer(10), val);
  EXPECT_FALSE(res);
  EXPECT_EQ(b.node.stats().unexpected_replies, 1u);
  b.deliver(peer(9), val);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->records.size(), 1u);
  EXPECT_EQ(res->records[0].value, std::vector<std::uint8_t>{1});
  EXPECT_EQ(b.node.stats().bad_records, 2u);
}

TEST(DhtNodeBare, RateLimitDropsOnlyTheFlooder) {
  Bare b;
  Message fn;
  fn.type = MsgType::find_node;
  fn.sender_address = "p:1";
  std::size_t answered = 0;
  for (int i = 0; i < 5000; ++i) {
    fn.txid = static_cast<std::uint64_t>(i + 1);
    answered += b.deliver(peer(9), fn).size();
  }
  const auto& o = b.node.options();
  EXPECT_LE(answered, static_cast<std::size_t>(o.rate_burst) + 1);
  EXPECT_EQ(b.node.stats().rate_limited, 5000 - answered);
  // Someone else is answered at once.
  fn.txid = 99999;
  EXPECT_EQ(b.deliver(peer(10), fn).size(), 1u);
  // The flooder gets tokens back over time.
  b.now += Time(1000);
  EXPECT_EQ(b.deliver(peer(9), fn).size(), 1u);
}

TEST(DhtNodeBare, MalformedInputIsCountedNotFatal) {
  Bare b;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::uint8_t> junk(rng() % 300);
    for (auto& x : junk) x = static_cast<std::uint8_t>(rng());
    b.node.on_message(peer(9), junk, b.now);
  }
  EXPECT_GT(b.node.stats().malformed, 1900u);
  EXPECT_TRUE(b.node.take_outgoing().empty());
}

TEST(DhtNodeBare, RequestsTimeOutRetryAndFail) {
  Bare b;
  b.node.on_timer(b.now);  // first maintenance pass
  std::optional<bool> ok;
  b.node.ping(Endpoint{peer(9).id, "p:1"}, b.now, [&](bool r) { ok = r; });
  EXPECT_EQ(b.node.take_outgoing().size(), 1u);
  const Time t1 = b.now + b.node.options().rpc_timeout;
  EXPECT_LE(b.node.next_deadline(), t1);
  b.node.on_timer(t1 - Time(1));
  EXPECT_TRUE(b.node.take_outgoing().empty());
  b.node.on_timer(t1);
  EXPECT_EQ(b.node.take_outgoing().size(), 1u);  // one retry
  EXPECT_FALSE(ok);
  b.node.on_timer(t1 + b.node.options().rpc_timeout);
  ASSERT_TRUE(ok);
  EXPECT_FALSE(*ok);
  EXPECT_EQ(b.node.stats().rpc_timeouts, 1u);
}

}  // namespace
}  // namespace grove::dht::test
