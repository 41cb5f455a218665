#include "dht/membership.hpp"

#include "tests/dht/swarm_util.hpp"

namespace grove::dht::test {
namespace {

TEST(Membership, RecordRoundTripAndRejection) {
  MemberInfo m;
  m.addresses = {"10.0.0.1:4000", "[::1]:4000"};
  m.run_id = "run-1";
  m.status = "training";
  m.payload = {1, 2, 3};
  auto d = decode_member(encode_member(m));
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, m);
  auto bytes = encode_member(m);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_member(std::span(bytes).first(n)));
  for (auto r : {transport::Reachability::reachable, transport::Reachability::unreachable}) {
    MemberInfo w = m;
    w.reach = r;
    auto dw = decode_member(encode_member(w));
    ASSERT_TRUE(dw);
    EXPECT_EQ(dw->reach, r);
  }
  // One shape only: [1, addresses, run, status, reach, payload]; another version, a missing
  // field, an unknown reachability or an oversized payload is refused with its reason.
  ASSERT_EQ(bytes.front(), 0x96);  // fixarray of 6
  ASSERT_EQ(bytes[1], 1);          // version
  auto v2 = bytes;
  v2[1] = 2;
  EXPECT_NE(decode_member(v2).why().find("version"), std::string::npos);
  auto shorter = encode_member(m);
  shorter.front() = 0x95;
  EXPECT_FALSE(decode_member(shorter));
  MemberInfo w = m;
  w.reach = static_cast<transport::Reachability>(3);
  auto bad = decode_member(encode_member(w));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.why(), "member record field reach: out of range");
  w = m;
  w.payload.assign(kMaxMemberPayload + 1, 0);
  EXPECT_FALSE(decode_member(encode_member(w)));
  w.payload.pop_back();
  EXPECT_TRUE(decode_member(encode_member(w)));
  EXPECT_FALSE(valid_run_id(""));
  EXPECT_FALSE(valid_run_id("has space"));
  EXPECT_FALSE(valid_run_id(std::string(65, 'x')));
  EXPECT_TRUE(valid_run_id("grove/demo-1"));
}

struct MemberSwarm {
  DhtNetwork net{21, LinkModel{Time(20), Time(5), 0.01}, sim_options()};
  std::mt19937_64 rng{3};
  MembershipOptions mo;
  std::vector<std::unique_ptr<Membership>> mem;
  std::vector<std::map<NodeId, int>> seen;  // +1 joined, -1 left, per watcher

  explicit MemberSwarm(std::size_t n, std::size_t scale_members = 128) {
    mo.ttl = Time(6000);
    mo.publish_every = Time(2000);
    mo.poll_every = Time(1500);
    mo.scale_members = scale_members;
    grow(net, n, rng);
    seen.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      mem.push_back(std::make_unique<Membership>(net.node(i), "run-a", mo));
      mem[i]->watch([this, i](MemberEvent e, const MemberInfo& m) {
        if (e == MemberEvent::joined) seen[i][m.id] = 1;
        if (e == MemberEvent::left) seen[i][m.id] = -1;
      });
      MemberInfo self;
      self.addresses = {net.address(i)};
      self.status = "training";
      mem[i]->set_self(self);
    }
  }
  // Advances virtual time, ticking every live member's timers.
  void run(Time d) {
    const Time end = net.now() + d;
    while (net.now() < end) {
      net.run_for(Time(100));
      for (auto i : net.alive_nodes())
        if (mem[i]) net.call(i, [&](DhtNode&) { mem[i]->on_timer(net.now()); });
    }
  }
  bool all_views(std::size_t expect) {
    for (auto i : net.alive_nodes())
      if (mem[i] && mem[i]->live(net.now()).size() != expect) return false;
    return true;
  }
};

TEST(Membership, ViewsConvergeAndDropTheDeadWithinTwoTtl) {
  MemberSwarm s(30);
  Time waited{0};
  while (!s.all_views(30) && waited < Time(20'000)) {
    s.run(Time(500));
    waited += Time(500);
  }
  ASSERT_TRUE(s.all_views(30)) << "views did not converge in 20 s";
  std::printf("30 views complete after %lld ms\n", static_cast<long long>(waited.count()));
  // Five nodes die at once.
  std::vector<NodeId> dead;
  for (std::size_t i = 0; i < 5; ++i) {
    dead.push_back(s.net.node(i).id());
    s.mem[i].reset();
    s.net.kill(i);
  }
  const Time killed = s.net.now();
  while (!s.all_views(25) && s.net.now() - killed < 2 * s.mo.ttl) s.run(Time(100));
  const Time took = s.net.now() - killed;
  std::printf("dead members dropped from every view after %lld ms (TTL %lld ms)\n",
              static_cast<long long>(took.count()), static_cast<long long>(s.mo.ttl.count()));
  EXPECT_TRUE(s.all_views(25));
  EXPECT_LE(took, 2 * s.mo.ttl);
  for (auto i : s.net.alive_nodes())
    for (const auto& d : dead) EXPECT_EQ(s.seen[i][d], -1) << "watcher " << i;
  // A clean leave is seen at the next poll, well before the TTL.
  s.net.call(10, [&](DhtNode&) { s.mem[10]->leave(s.net.now()); });
  const Time left = s.net.now();
  while (!s.all_views(24) && s.net.now() - left < s.mo.ttl) s.run(Time(100));
  EXPECT_TRUE(s.all_views(24));
  EXPECT_LT(s.net.now() - left, s.mo.ttl);
  std::printf("a clean leave left every view after %lld ms\n",
              static_cast<long long>((s.net.now() - left).count()));
  // A joiner appears in every view.
  const std::size_t j = s.net.add_node();
  s.net.call(j, [&](DhtNode& d) { d.bootstrap({s.net.address(20)}, s.net.now()); });
  s.mem.push_back(std::make_unique<Membership>(s.net.node(j), "run-a", s.mo));
  s.seen.emplace_back();
  MemberInfo self;
  self.addresses = {s.net.address(j)};
  s.mem[j]->set_self(self);
  Time t{0};
  while (s.mem[20]->live(s.net.now()).size() != 25 && t < Time(20'000)) {
    s.run(Time(200));
    t += Time(200);
  }
  EXPECT_EQ(s.mem[20]->live(s.net.now()).size(), 25u);
  EXPECT_EQ(s.mem[j]->live(s.net.now()).size(), 25u);
  std::printf("a joiner was in the views after %lld ms\n", static_cast<long long>(t.count()));
}

// A swarm past scale_members polls less often in proportion and publishes records that live
// as much longer, so that nobody drops out of a view between two polls.
TEST(Membership, LargeSwarmsPollLessOftenWithoutLosingMembers) {
  MemberSwarm s(40, 8);  // 40 members, 8 per step: intervals ×5
  Time waited{0};
  while (!s.all_views(40) && waited < Time(30'000)) {
    s.run(Time(500));
    waited += Time(500);
  }
  ASSERT_TRUE(s.all_views(40)) << "views did not converge in 30 s";
  // The records read while the views were growing were published with the short TTL of a small
  // swarm: they are replaced at the next poll (a swarm that grows 5× in one poll, as here, has
  // views short by a few members for up to one poll interval).
  s.run(5 * s.mo.poll_every);
  std::vector<std::uint64_t> polls0;
  for (auto& m : s.mem) polls0.push_back(m->polls());
  std::size_t short_views = 0;
  for (int t = 0; t < 120; ++t) {  // 60 s
    s.run(Time(500));
    short_views += !s.all_views(40);
  }
  std::uint64_t polls = 0;
  for (std::size_t i = 0; i < s.mem.size(); ++i) polls += s.mem[i]->polls() - polls0[i];
  const double per_node = double(polls) / 40.0;
  std::printf(
      "40 members, intervals x5: %.1f polls per member in 60 s (fixed: 40), views short "
      "at %zu of 120 checks\n",
      per_node, short_views);
  EXPECT_LE(per_node, 9.0);  // 60 s / 7.5 s, plus the one in flight
  EXPECT_GE(per_node, 7.0);
  EXPECT_EQ(short_views, 0u);
  EXPECT_EQ(s.mem[0]->poll_interval(), 5 * s.mo.poll_every);
  EXPECT_EQ(s.mem[0]->record_ttl(), 5 * s.mo.ttl);
}

}  // namespace
}  // namespace grove::dht::test
