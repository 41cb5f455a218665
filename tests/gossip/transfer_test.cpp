// Transfer (gossip/transfer.hpp) on the simulated network: a tensor arrives whole and exact; the
// sender waits for a receiver that calls late; a size mismatch, a sender that dies mid-stream and
// a receiver that never calls each end both sides (or the one left) with the reason, by the
// deadlines.
#include "gossip/transfer.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "sim/gossip_network.hpp"

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;

struct Pair {
  sim::GossipNetwork net;
  NodeId a{}, b{};
  OpId op{};
  std::map<NodeId, std::unique_ptr<Protocol>> done;
  TransferOptions o;

  explicit Pair(sim::GossipLinkModel link = {}) : net(3, link) {
    a = net.add_node();
    b = net.add_node();
    op[0] = 0x42;
    o.chunk_values = 1000;
    o.window = 4;
    o.heartbeat = 200ms;
    o.chunk_timeout = 1000ms;
    o.total_timeout = 20000ms;
    net.set_on_finished(
        [this](const NodeId& at, std::unique_ptr<Protocol> p) { done[at] = std::move(p); });
  }
  Transfer* of(const NodeId& n) { return static_cast<Transfer*>(done.at(n).get()); }
};

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;
  return v;
}

TEST(Transfer, ATensorArrivesWholeAndExactEvenWhenTheReceiverCallsLate) {
  Pair p;
  const auto want = ramp(12345);  // 13 chunks, the last one short
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats(want), p.o, p.net.now()));
  p.net.run_until(p.net.now() + 3000ms);  // the receiver is not there yet: the sender waits
  EXPECT_TRUE(p.done.empty());
  p.net.attach(p.b, Transfer::receive(p.op, p.a, optim::Floats(std::vector<float>(12345, 0.0f)),
                                      p.o, p.net.now()));
  ASSERT_TRUE(p.net.run_until([&] { return p.done.size() == 2; }, 10000ms));
  ASSERT_EQ(p.of(p.a)->status(), OpStatus::done) << p.of(p.a)->failure();
  ASSERT_EQ(p.of(p.b)->status(), OpStatus::done) << p.of(p.b)->failure();
  EXPECT_EQ(p.of(p.b)->take_result(), want);
}

TEST(Transfer, AnEmptyTensorArrivesToo) {
  Pair p;
  p.net.attach(p.b, Transfer::receive(p.op, p.a, optim::Floats{}, p.o, p.net.now()));
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats{}, p.o, p.net.now()));
  ASSERT_TRUE(p.net.run_until([&] { return p.done.size() == 2; }, 5000ms));
  EXPECT_EQ(p.of(p.a)->status(), OpStatus::done);
  EXPECT_EQ(p.of(p.b)->status(), OpStatus::done);
}

TEST(Transfer, ASizeMismatchEndsBothSidesWithTheReason) {
  Pair p;
  p.net.attach(p.b, Transfer::receive(p.op, p.a, optim::Floats(std::vector<float>(10, 0.0f)), p.o,
                                      p.net.now()));
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats(ramp(11)), p.o, p.net.now()));
  ASSERT_TRUE(p.net.run_until([&] { return p.done.size() == 2; }, 5000ms));
  EXPECT_EQ(p.of(p.b)->status(), OpStatus::failed);
  EXPECT_NE(p.of(p.b)->failure().find("sends 11 values"), std::string::npos)
      << p.of(p.b)->failure();
  EXPECT_EQ(p.of(p.a)->status(), OpStatus::failed);
  EXPECT_NE(p.of(p.a)->failure().find("refused"), std::string::npos) << p.of(p.a)->failure();
}

TEST(Transfer, ASenderThatDiesMidStreamEndsTheReceiver) {
  sim::GossipLinkModel link;
  link.bytes_per_ms = 100;  // 4 KB chunks take 40 ms each
  Pair p(link);
  p.net.attach(p.b, Transfer::receive(p.op, p.a, optim::Floats(std::vector<float>(20000, 0.0f)),
                                      p.o, p.net.now()));
  p.net.kill_at_byte(p.a, 30'000);
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats(ramp(20000)), p.o, p.net.now()));
  const auto t0 = p.net.now();
  ASSERT_TRUE(p.net.run_until([&] { return p.done.count(p.b) > 0; }, 20000ms));
  EXPECT_EQ(p.of(p.b)->status(), OpStatus::failed);
  EXPECT_FALSE(p.of(p.b)->failure().empty());
  EXPECT_LT(p.net.now() - t0, 5000ms);  // not the total deadline
}

TEST(Transfer, ASenderThatHangsMidStreamEndsTheReceiverBySilence) {
  sim::GossipLinkModel link;
  link.bytes_per_ms = 100;
  Pair p(link);
  p.net.attach(p.b, Transfer::receive(p.op, p.a, optim::Floats(std::vector<float>(20000, 0.0f)),
                                      p.o, p.net.now()));
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats(ramp(20000)), p.o, p.net.now()));
  p.net.run_until(p.net.now() + 300ms);  // a few chunks across
  p.net.hang(p.a);                       // then nothing more, and nothing closes
  const auto t0 = p.net.now();
  ASSERT_TRUE(p.net.run_until([&] { return p.done.count(p.b) > 0; }, 20000ms));
  EXPECT_EQ(p.of(p.b)->status(), OpStatus::failed);
  EXPECT_NE(p.of(p.b)->failure().find("silent"), std::string::npos) << p.of(p.b)->failure();
  EXPECT_LT(p.net.now() - t0, 2000ms);  // the chunk timeout (1 s), not the total deadline
}

TEST(Transfer, AReceiverThatNeverCallsEndsTheSenderAtItsDeadline) {
  Pair p;
  p.o.total_timeout = 4000ms;
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats(ramp(100)), p.o, p.net.now()));
  ASSERT_TRUE(p.net.run_until([&] { return p.done.size() == 1; }, 10000ms));
  EXPECT_EQ(p.of(p.a)->status(), OpStatus::failed);
  EXPECT_NE(p.of(p.a)->failure().find("did not call"), std::string::npos) << p.of(p.a)->failure();
  EXPECT_EQ(p.net.now(), 4000ms);
}

TEST(Transfer, ANonFiniteValueIsNeverSent) {
  Pair p;
  auto v = ramp(5000);
  v[4321] = std::numeric_limits<float>::quiet_NaN();
  p.net.attach(p.b, Transfer::receive(p.op, p.a, optim::Floats(std::vector<float>(5000, 0.0f)), p.o,
                                      p.net.now()));
  p.net.attach(p.a, Transfer::send(p.op, p.b, optim::Floats(v), p.o, p.net.now()));
  ASSERT_TRUE(p.net.run_until([&] { return p.done.size() == 2; }, 5000ms));
  EXPECT_EQ(p.of(p.a)->status(), OpStatus::failed);
  EXPECT_NE(p.of(p.a)->failure().find("not finite"), std::string::npos);
  EXPECT_EQ(p.of(p.b)->status(), OpStatus::failed);
}

}  // namespace
}  // namespace grove::gossip
