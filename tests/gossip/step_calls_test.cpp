// StepCalls (gossip/step_calls.hpp) on the simulated network: nodes that make the same calls get
// the sum, the mean and the concatenation of their inputs (all members the same bits, checked
// against the inputs); a barrier waits for the group to reach its size; a member that dies in a
// call is dropped and the survivors' results are those of the survivors.
#include "gossip/step_calls.hpp"

#include <gtest/gtest.h>

#include <random>

#include "sim/gossip_network.hpp"

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;

struct Node {
  NodeId id{};
  StepCalls* calls = nullptr;  // owned by the network (the group's protocol)
  std::vector<CallResult> results;
};

struct Calls {
  sim::GossipNetwork net;
  std::vector<Node> nodes;
  OpId group_op{};

  explicit Calls(std::size_t n, sim::GossipLinkModel link = {}) : net(7, link) {
    group_op[0] = 0xab;
    std::vector<NodeId> ids;
    for (std::size_t i = 0; i < n; ++i) ids.push_back(net.add_node());
    StepCallsOptions co;
    co.group.join_wait = 300ms;
    co.group.join_retry = 200ms;
    co.chunk_values = 256;
    co.timers.chunk_timeout = 1000ms;
    co.timers.heartbeat = 250ms;
    co.timers.linger = 1500ms;
    co.barrier_retry = 50ms;
    for (const auto& id : ids) {
      Node nd;
      nd.id = id;
      auto calls = std::make_unique<StepCalls>("run", group_op, id, co);
      calls->set_candidates(ids, net.now());
      nd.calls = calls.get();
      net.attach(id, std::move(calls));
      nodes.push_back(std::move(nd));
    }
    net.set_on_finished([this](const NodeId& at, std::unique_ptr<Protocol> p) {
      for (auto& nd : nodes)
        if (nd.id == at) nd.calls->on_op_finished(std::move(p), net.now());
    });
  }

  // The drivers' loop: after every millisecond, each node starts the operation its calls made,
  // takes their result, and the group's messages go out.
  void pump() {
    for (auto& nd : nodes) {
      if (!net.alive(nd.id)) continue;
      if (auto op = nd.calls->take_op()) net.attach(nd.id, std::move(op));
      net.poke(nd.id, group_op);
      if (auto r = nd.calls->take_result()) nd.results.push_back(std::move(*r));
    }
  }
  bool run_until(const std::function<bool()>& done, dht::Time limit) {
    const auto end = net.now() + limit;
    while (net.now() < end) {
      pump();
      if (done()) return true;
      net.run_until(net.now() + 1ms);
    }
    return done();
  }
  void submit(std::size_t i, CallSpec spec, std::vector<float> in) {
    nodes[i].calls->submit(spec, optim::Floats(std::move(in)), net.now() + 60s, net.now());
    net.poke(nodes[i].id, group_op);
  }
  bool all_have(std::size_t results) {
    for (auto& nd : nodes)
      if (net.alive(nd.id) && nd.results.size() < results) return false;
    return true;
  }
};

std::vector<float> vals(std::span<const float> s) {
  return {s.begin(), s.end()};
}

// A barrier that waits for three members, then a sum, a mean and a gather among them.
TEST(StepCalls, MembersGetTheSumTheMeanAndTheConcatenation) {
  Calls c(3);
  CallSpec b;
  b.kind = CallSpec::Kind::barrier;
  b.min_size = 3;
  for (std::size_t i = 0; i < 3; ++i) c.submit(i, b, {});
  ASSERT_TRUE(c.run_until([&] { return c.all_have(1); }, 30s));
  for (auto& nd : c.nodes) {
    ASSERT_TRUE(nd.results[0].ok) << nd.results[0].why;
    EXPECT_EQ(nd.results[0].size, 3u);
  }
  const std::size_t n = 1000;
  std::vector<std::vector<float>> in(3, std::vector<float>(n));
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-100, 100);  // exact in float sums
  for (auto& v : in)
    for (auto& x : v) x = static_cast<float>(d(rng));
  CallSpec sum;
  sum.kind = CallSpec::Kind::all_reduce;
  for (std::size_t i = 0; i < 3; ++i) c.submit(i, sum, in[i]);
  ASSERT_TRUE(c.run_until([&] { return c.all_have(2); }, 30s));
  CallSpec mean = sum;
  mean.mean = true;
  for (std::size_t i = 0; i < 3; ++i) c.submit(i, mean, in[i]);
  ASSERT_TRUE(c.run_until([&] { return c.all_have(3); }, 30s));
  CallSpec gather;
  gather.kind = CallSpec::Kind::all_gather;
  for (std::size_t i = 0; i < 3; ++i) c.submit(i, gather, in[i]);
  ASSERT_TRUE(c.run_until([&] { return c.all_have(4); }, 30s));

  // Ranks follow node ids: the gather is in rank order.
  std::vector<std::size_t> by_rank(3);
  for (std::size_t i = 0; i < 3; ++i) by_rank[c.nodes[i].results[3].rank] = i;
  std::vector<float> want_sum(n), want_mean(n), want_gather;
  for (std::size_t k = 0; k < n; ++k) {
    want_sum[k] = in[0][k] + in[1][k] + in[2][k];
    want_mean[k] = want_sum[k] / 3.0f;
  }
  for (auto r : by_rank) want_gather.insert(want_gather.end(), in[r].begin(), in[r].end());
  for (auto& nd : c.nodes) {
    for (auto& r : nd.results) ASSERT_TRUE(r.ok) << r.why;
    EXPECT_EQ(vals(nd.results[1].values), want_sum);
    const auto m = vals(nd.results[2].values);
    for (std::size_t k = 0; k < n; ++k) EXPECT_NEAR(m[k], want_mean[k], 1e-4);
    EXPECT_EQ(m, vals(c.nodes[0].results[2].values));  // the same bits everywhere
    EXPECT_EQ(vals(nd.results[3].values), want_gather);
    EXPECT_EQ(nd.results[3].size, 3u);
    EXPECT_EQ(nd.results[1].call + 2, nd.results[3].call);
  }
}

// A member killed during a sum: the survivors finish with the sum of theirs, the same on both,
// and go on together.
TEST(StepCalls, SurvivorsOfADeathInACallGetTheirOwnSum) {
  sim::GossipLinkModel link;
  link.bytes_per_ms = 200;
  link.loss_detect = 50ms;
  Calls c(3, link);
  CallSpec b;
  b.kind = CallSpec::Kind::barrier;
  b.min_size = 3;
  for (std::size_t i = 0; i < 3; ++i) c.submit(i, b, {});
  ASSERT_TRUE(c.run_until([&] { return c.all_have(1); }, 30s));
  const std::size_t n = 4096;
  CallSpec sum;
  sum.kind = CallSpec::Kind::all_reduce;
  std::vector<std::vector<float>> in;
  for (std::size_t i = 0; i < 3; ++i) in.emplace_back(n, static_cast<float>(i + 1));
  c.net.kill_at_byte(c.nodes[2].id, c.net.bytes_sent(c.nodes[2].id) + 3000);
  for (std::size_t i = 0; i < 3; ++i) c.submit(i, sum, in[i]);
  ASSERT_TRUE(c.run_until([&] { return c.all_have(2); }, 60s));
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& r = c.nodes[i].results[1];
    ASSERT_TRUE(r.ok) << r.why;
    EXPECT_EQ(r.size, 2u);
    EXPECT_EQ(vals(r.values), std::vector<float>(n, 3.0f));  // 1 + 2: without the dead one
  }
  // The next call is the survivors'.
  for (std::size_t i = 0; i < 2; ++i) c.submit(i, sum, in[i]);
  ASSERT_TRUE(c.run_until([&] { return c.all_have(3); }, 30s));
  for (std::size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.nodes[i].results[2].ok) << c.nodes[i].results[2].why;
    EXPECT_EQ(c.nodes[i].results[2].size, 2u);
  }
}

}  // namespace
}  // namespace grove::gossip
