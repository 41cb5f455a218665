// GossipRuntime: the averaging cores over real transport hosts (TCP loopback, encrypted).
#include "gossip/runtime.hpp"

#include <gtest/gtest.h>

#include <future>
#include <random>

#include "gossip/allreduce.hpp"
#include "gossip/exchange.hpp"
#include "tests/transport/test_util.hpp"

namespace grove::gossip {
namespace {

std::vector<float> vec(std::span<const float> s) {
  return {s.begin(), s.end()};
}

using namespace std::chrono_literals;
using transport::test::await;
using transport::test::World;

struct Members {
  World w;
  std::vector<std::shared_ptr<transport::Host>> hosts;
  std::vector<std::shared_ptr<GossipRuntime>> rts;
  std::vector<NodeId> ids;
  std::map<NodeId, std::string> addresses;

  explicit Members(std::size_t n, transport::HostOptions ho = {}, RuntimeOptions ro = {}) {
    for (std::size_t i = 0; i < n; ++i) {
      hosts.push_back(w.host(ho));
      rts.push_back(GossipRuntime::create(hosts.back(), ro));
      w.start(hosts.back());
      ids.push_back(hosts.back()->id());
      addresses[ids.back()] = hosts.back()->address();
    }
  }
};

std::vector<float> randn(std::uint32_t seed, std::size_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.01f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::future<std::unique_ptr<Protocol>> run(Members& m, std::size_t i, std::unique_ptr<Protocol> p) {
  auto done = std::make_shared<std::promise<std::unique_ptr<Protocol>>>();
  auto f = done->get_future();
  m.rts[i]->start(std::move(p), m.addresses,
                  [done](std::unique_ptr<Protocol> r) { done->set_value(std::move(r)); });
  return f;
}

TEST(GossipRuntime, RingAllReduceOverEncryptedTcp) {
  const std::size_t N = 4, n = (1u << 20) + 123;
  Members m(N);
  AllReduceOptions o;  // fp16, 256K-value chunks
  OpId op{};
  op[0] = 1;
  std::vector<std::future<std::unique_ptr<Protocol>>> fs;
  for (std::size_t i = 0; i < N; ++i)
    fs.push_back(run(
        m, i,
        RingAllReduce::create(op, m.ids[i], m.ids, randn(i, n), o, GossipRuntime::now()).value()));
  std::vector<std::unique_ptr<Protocol>> done;
  for (auto& f : fs) {
    auto r = await(f, 60s);
    ASSERT_TRUE(r);
    done.push_back(std::move(*r));
  }
  const auto& ref = static_cast<RingAllReduce&>(*done[0]);
  ASSERT_EQ(ref.status(), OpStatus::done) << ref.failure();
  for (std::size_t i = 1; i < N; ++i) {
    const auto& r = static_cast<RingAllReduce&>(*done[i]);
    ASSERT_EQ(r.status(), OpStatus::done) << r.failure();
    EXPECT_TRUE(vec(r.result()) == vec(ref.result())) << "member " << i;
  }
  std::vector<std::vector<float>> in;
  for (std::size_t i = 0; i < N; ++i) in.push_back(randn(i, n));
  for (std::size_t k = 0; k < n; k += 997) {
    const double mean = (double(in[0][k]) + in[1][k] + in[2][k] + in[3][k]) / 4;
    EXPECT_NEAR(ref.result()[k], mean, 1e-4);
  }
}

TEST(GossipRuntime, SurvivorsFinishWhenOneMemberNeverStartsAndAnotherShutsDown) {
  const std::size_t N = 5, n = 1u << 18;
  Members m(N);
  AllReduceOptions o;
  o.chunk_values = 1u << 14;
  o.chunk_timeout = 1500ms;
  o.heartbeat = 300ms;
  o.linger = 3000ms;
  OpId op{};
  op[0] = 2;
  std::vector<std::future<std::unique_ptr<Protocol>>> fs;
  for (std::size_t i = 0; i < 4; ++i)  // member 4 never starts the op: it hangs
    fs.push_back(run(
        m, i,
        RingAllReduce::create(op, m.ids[i], m.ids, randn(i, n), o, GossipRuntime::now()).value()));
  m.hosts[3]->shutdown();  // member 3 dies right after starting
  std::vector<RingAllReduce*> live;
  std::vector<std::unique_ptr<Protocol>> keep;
  for (std::size_t i = 0; i < 4; ++i) {
    auto r = await(fs[i], 60s);
    ASSERT_TRUE(r);
    keep.push_back(std::move(*r));
    if (i < 3) live.push_back(static_cast<RingAllReduce*>(keep.back().get()));
  }
  for (auto* r : live) {
    ASSERT_EQ(r->status(), OpStatus::done) << r->failure();
    EXPECT_EQ(r->members().size(), 3u);
    EXPECT_TRUE(vec(r->result()) == vec(live[0]->result()));
  }
}

TEST(GossipRuntime, PairExchangeOverEncryptedTcp) {
  Members m(2);
  ExchangeOptions o;
  o.codec = WireCodec::fp32;
  OpId op{};
  op[0] = 3;
  const std::size_t n = 3u << 18;
  auto f0 =
      run(m, 0,
          GroupExchange::create(op, m.ids[0], m.ids, std::vector<std::vector<float>>{randn(10, n)},
                                o, GossipRuntime::now())
              .value());
  auto f1 =
      run(m, 1,
          GroupExchange::create(op, m.ids[1], m.ids, std::vector<std::vector<float>>{randn(11, n)},
                                o, GossipRuntime::now())
              .value());
  auto r0 = await(f0, 60s), r1 = await(f1, 60s);
  ASSERT_TRUE(r0 && r1);
  auto& e0 = static_cast<GroupExchange&>(**r0);
  auto& e1 = static_cast<GroupExchange&>(**r1);
  ASSERT_EQ(e0.completed().size(), 1u);
  ASSERT_EQ(e1.completed().size(), 1u);
  const auto a = randn(10, n), b = randn(11, n);
  for (std::size_t k = 0; k < n; k += 101) {
    EXPECT_EQ(e0.mean()[0][k], (a[k] + b[k]) / 2.0f);
    EXPECT_EQ(e1.mean()[0][k], (b[k] + a[k]) / 2.0f);
  }
}

TEST(GossipRuntime, ConcurrentOpsShareOnePeerStreamLimit) {
  // Peers accept 4 incoming streams at a time, and the runtime keeps 4 in flight per peer: three
  // exchanges with the same partner at once, each of many messages, must share those 4 (with a
  // limit per op and peer they opened 12, and the partner refused the extra ones).
  transport::HostOptions ho;
  ho.session.max_incoming_streams = 4;
  ho.faults = std::make_shared<transport::FaultPlan>();  // 20 ms each way: the ops overlap
  transport::FaultConfig slow;
  slow.latency = 20ms;
  ho.faults->set_default(slow);
  RuntimeOptions ro;
  ro.streams_per_peer = 4;
  Members m(2, ho, ro);
  ExchangeOptions o;
  o.chunk_values = 1u << 13;  // 32 messages per tensor
  const std::size_t n = 1u << 18;
  std::vector<std::future<std::unique_ptr<Protocol>>> fs;
  for (std::uint8_t k = 0; k < 3; ++k) {
    OpId op{};
    op[0] = static_cast<std::uint8_t>(10 + k);
    for (std::size_t i = 0; i < 2; ++i)
      fs.push_back(run(m, i,
                       GroupExchange::create(op, m.ids[i], m.ids,
                                             std::vector<std::vector<float>>{randn(20 + i, n)}, o,
                                             GossipRuntime::now())
                           .value()));
  }
  for (auto& f : fs) {
    auto r = await(f, 60s);
    ASSERT_TRUE(r);
    const auto& e = static_cast<GroupExchange&>(**r);
    EXPECT_EQ(e.completed().size(), 1u)
        << (e.failures().empty() ? "" : e.failures().begin()->second);
  }
}

}  // namespace
}  // namespace grove::gossip
