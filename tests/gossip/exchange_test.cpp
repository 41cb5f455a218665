// GroupExchange: NoLoCo's pair/trio averaging of whole, verified tensors.
#include "gossip/exchange.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "sim/gossip_network.hpp"

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;

std::vector<float> randn(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Group {
  sim::GossipNetwork net;
  std::vector<NodeId> ids;
  std::vector<std::vector<std::vector<float>>> tensors;  // [member][tensor]
  OpId op{};
  ExchangeOptions opts;

  Group(std::uint64_t seed, std::size_t members, std::size_t tensors_each, std::size_t n,
        ExchangeOptions o, sim::GossipLinkModel link = {})
      : net(seed, link), opts(o) {
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    op[0] = static_cast<std::uint8_t>(seed);
    for (std::size_t i = 0; i < members; ++i) {
      ids.push_back(net.add_node());
      tensors.emplace_back();
      for (std::size_t t = 0; t < tensors_each; ++t) tensors.back().push_back(randn(rng, n));
    }
  }
  void start() {
    for (std::size_t i = 0; i < ids.size(); ++i)
      net.attach(ids[i],
                 GroupExchange::create(op, ids[i], ids, tensors[i], opts, net.now()).value());
  }
  GroupExchange* at(std::size_t i) { return static_cast<GroupExchange*>(net.protocol(ids[i], op)); }
  bool all_finished() {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (net.alive(ids[i]) && !at(i)->finished()) return false;
    return true;
  }
  // The mean over members `who` of tensor t, summed the way GroupExchange does: own first, then
  // partners in id order (fp32 codec: exact).
  std::vector<float> mean_of(std::size_t self, std::vector<std::size_t> who, std::size_t t) {
    std::sort(who.begin(), who.end(), [&](auto a, auto b) { return ids[a] < ids[b]; });
    std::vector<float> m = tensors[self][t];
    for (auto j : who)
      if (j != self)
        for (std::size_t k = 0; k < m.size(); ++k) m[k] += tensors[j][t][k];
    if (who.size() > 1)
      for (auto& v : m) v /= static_cast<float>(who.size());
    return m;
  }
};

ExchangeOptions fp32_opts() {
  ExchangeOptions o;
  o.codec = WireCodec::fp32;
  o.chunk_values = 256;
  o.chunk_timeout = 2000ms;
  o.heartbeat = 500ms;
  o.max_norm_ratio = 2.0;
  return o;
}

TEST(GroupExchange, PairAndTrioAverageWholeTensors) {
  for (std::size_t members : {2u, 3u}) {
    Group g(members, members, 2, 256 * 5 + 3, fp32_opts());
    g.start();
    ASSERT_TRUE(g.net.run_until([&] { return g.all_finished(); }, 30s));
    std::vector<std::size_t> all(members);
    std::iota(all.begin(), all.end(), 0);
    for (std::size_t i = 0; i < members; ++i) {
      EXPECT_EQ(g.at(i)->completed().size(), members - 1);
      for (std::size_t t = 0; t < 2; ++t) EXPECT_EQ(g.at(i)->mean()[t], g.mean_of(i, all, t));
      // Made as the chunks came (a pair's and a trio's): no pass over the model at the end.
      EXPECT_TRUE(g.at(i)->mean_streamed());
    }
  }
}

// A trio's mean is folded chunk by chunk while the partners' tensors arrive. A member killed at
// any byte leaves each survivor with the mean of whole, verified tensors only: its own and those
// of the partners that completed, the same bits as a mean taken at the end (the folded chunks
// that held the dead member's values are dropped).
TEST(GroupExchange, TrioMemberKilledAtAnyByteLeavesTheMeanOfTheWholeTensors) {
  std::mt19937_64 rng(7);
  int dropped = 0, streamed = 0;
  for (int trial = 0; trial < 40; ++trial) {
    sim::GossipLinkModel link;
    link.bytes_per_ms = 4000;
    link.loss_detect = trial % 2 ? 50ms : dht::Time::max() / 4;
    Group g(900 + trial, 3, 2, 256 * 8 + 5, fp32_opts(), link);
    // Member 2 sends 2 × 2 tensors of ~8 KiB: killed anywhere in them, or not at all.
    const std::uint64_t offset = rng() % (2 * 2 * 4 * (256 * 8 + 5) + 2000);
    g.net.kill_at_byte(g.ids[2], offset);
    g.start();
    ASSERT_TRUE(g.net.run_until([&] { return g.at(0)->finished() && g.at(1)->finished(); }, 60s));
    for (std::size_t i = 0; i < 2; ++i) {
      std::vector<std::size_t> who{i};
      for (const auto& id : g.at(i)->completed())
        who.push_back(
            static_cast<std::size_t>(std::find(g.ids.begin(), g.ids.end(), id) - g.ids.begin()));
      for (std::size_t t = 0; t < 2; ++t)
        EXPECT_EQ(g.at(i)->mean()[t], g.mean_of(i, who, t)) << "trial " << trial << " member " << i;
      if (who.size() < 3) ++dropped;
      EXPECT_EQ(g.at(i)->mean_streamed(), who.size() == 3) << "trial " << trial;
      streamed += g.at(i)->mean_streamed();
    }
  }
  EXPECT_GT(dropped, 30);  // the kill fell inside the tensors in most trials
  EXPECT_GT(streamed, 0);
  // A member whose tensors all arrive, and are all folded, but fail their check at the end (a
  // norm 100× the others'): the others' means leave every one of its values out.
  Group g(77, 3, 2, 256 * 8 + 5, fp32_opts());
  for (auto& t : g.tensors[2])
    for (auto& v : t) v *= 100.0f;
  g.start();
  ASSERT_TRUE(g.net.run_until([&] { return g.all_finished(); }, 30s));
  for (std::size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(g.at(i)->completed(), std::vector<NodeId>{g.ids[1 - i]});
    for (std::size_t t = 0; t < 2; ++t) EXPECT_EQ(g.at(i)->mean()[t], g.mean_of(i, {0, 1}, t));
    EXPECT_FALSE(g.at(i)->mean_streamed());
  }
}

TEST(GroupExchange, Fp16TravelsWithinItsBound) {
  auto o = fp32_opts();
  o.codec = WireCodec::fp16;
  Group g(4, 2, 1, 4096, o);
  g.start();
  ASSERT_TRUE(g.net.run_until([&] { return g.all_finished(); }, 30s));
  const auto exact = g.mean_of(0, {0, 1}, 0);
  for (std::size_t k = 0; k < exact.size(); ++k)
    EXPECT_NEAR(g.at(0)->mean()[0][k], exact[k], std::abs(g.tensors[1][0][k]) * 0.5f / 1024 + 1e-7);
  EXPECT_EQ(g.net.bytes_sent(g.ids[0]) < 4096 * 2 + 1024, true);  // fp16: 2 bytes a value
}

TEST(GroupExchange, PartnerKilledAtAnyByteNeverLeavesAPartialAverage) {
  std::mt19937_64 rng(99);
  int local_only = 0;
  for (int trial = 0; trial < 60; ++trial) {
    sim::GossipLinkModel link;
    link.bytes_per_ms = 4000;
    link.loss_detect = trial % 2 ? 50ms : dht::Time::max() / 4;  // reset, or silence
    Group g(500 + trial, 2, 2, 256 * 8, fp32_opts(), link);
    const std::uint64_t offset = rng() % (2 * 4 * 256 * 8 + 400);
    g.net.kill_at_byte(g.ids[1], offset);
    g.start();
    dht::Time died{0};
    ASSERT_TRUE(g.net.run_until(
        [&] {
          if (died == dht::Time{0} && !g.net.alive(g.ids[1])) died = g.net.now();
          return g.at(0)->finished();
        },
        60s));
    const auto& mean = g.at(0)->mean();
    if (g.at(0)->completed().empty()) {
      ++local_only;
      ASSERT_EQ(mean.size(), g.tensors[0].size());
      for (std::size_t t = 0; t < mean.size(); ++t)  // own tensors, untouched
        EXPECT_EQ(mean[t], g.tensors[0][t]) << "trial " << trial;
      // Abandoned within chunk timeout + 1 s of going silent.
      EXPECT_LE(g.net.now() - died, g.opts.chunk_timeout + 1000ms) << "trial " << trial;
    } else {
      for (std::size_t t = 0; t < 2; ++t) EXPECT_EQ(mean[t], g.mean_of(0, {0, 1}, t));
    }
  }
  EXPECT_GT(local_only, 40);
}

TEST(GroupExchange, HangingPartnerIsAbandonedWithinTheChunkTimeout) {
  sim::GossipLinkModel link;
  link.bytes_per_ms = 1000;
  Group g(7, 3, 1, 256 * 40, fp32_opts(), link);
  g.start();
  g.net.run_until(dht::Time(10));
  g.net.hang(g.ids[2]);
  const auto hung_at = g.net.now();
  ASSERT_TRUE(g.net.run_until([&] { return g.at(0)->finished() && g.at(1)->finished(); }, 60s));
  EXPECT_LE(g.net.now() - hung_at, g.opts.chunk_timeout + 1000ms);
  for (std::size_t i : {0u, 1u}) {
    EXPECT_EQ(g.at(i)->completed().size(), 1u);  // the live partner still counts
    EXPECT_EQ(g.at(i)->failures().count(g.ids[2]), 1u);
    EXPECT_EQ(g.at(i)->mean()[0], g.mean_of(i, {0, 1}, 0));
  }
}

// A partner still making its tensors (the proposal and momentum of a model in pages, on a busy
// disk) starts after us: it is given the start grace on top of the chunk timeout before its
// first byte is due, and the plain chunk timeout once it has been heard.
TEST(GroupExchange, APartnerStartingLateIsGivenTheStartGrace) {
  for (const bool grace : {false, true}) {
    auto o = fp32_opts();  // chunk timeout 2 s
    o.start_grace = grace ? 4000ms : 0ms;
    Group g(11, 2, 2, 256 * 8, o);
    g.net.attach(
        g.ids[0],
        GroupExchange::create(g.op, g.ids[0], g.ids, g.tensors[0], o, g.net.now()).value());
    g.net.run_until(g.net.now() + 3000ms);  // member 1 takes 3 s to make its tensors
    if (!grace) {
      EXPECT_TRUE(g.at(0)->finished());
      EXPECT_NE(g.at(0)->failures().begin()->second.find("silent"), std::string::npos);
      continue;
    }
    ASSERT_FALSE(g.at(0)->finished());
    g.net.attach(
        g.ids[1],
        GroupExchange::create(g.op, g.ids[1], g.ids, g.tensors[1], o, g.net.now()).value());
    ASSERT_TRUE(g.net.run_until([&] { return g.all_finished(); }, 30s));
    for (std::size_t i : {0u, 1u}) {
      EXPECT_EQ(g.at(i)->completed().size(), 1u) << i;
      EXPECT_EQ(g.at(i)->mean()[0], g.mean_of(i, {0, 1}, 0)) << i;
    }
  }
}

// Drives two exchanges by hand so a test can tamper with what travels.
struct Manual {
  NodeId a{}, b{};
  OpId op{};
  std::unique_ptr<GroupExchange> ea, eb;
  Manual(std::vector<float> ta, std::vector<float> tb, ExchangeOptions o) {
    a[0] = 1;
    b[0] = 2;
    ea = GroupExchange::create(op, a, std::vector{a, b},
                               std::vector<std::vector<float>>{std::move(ta)}, o, dht::Time(0))
             .value();
    eb = GroupExchange::create(op, b, std::vector{a, b},
                               std::vector<std::vector<float>>{std::move(tb)}, o, dht::Time(0))
             .value();
  }
  // Delivers b's messages to a, after `edit` may change each one.
  void deliver_b_to_a(const std::function<void(std::size_t, Bytes&)>& edit) {
    auto out = eb->take_outgoing();
    for (std::size_t i = 0; i < out.size(); ++i) {
      edit(i, out[i].data);
      auto m = decode_message(out[i].data.span());
      ASSERT_TRUE(m);
      ea->on_message(b, *m, dht::Time(1));
    }
  }
};

TEST(GroupExchange, TamperedChunkFailsTheDigest) {
  std::mt19937 rng(3);
  const auto mine = randn(rng, 1024), theirs = randn(rng, 1024);
  Manual x(mine, theirs, fp32_opts());
  x.deliver_b_to_a([](std::size_t i, Bytes& b) {
    if (i == 2) b.data()[b.size() - 3] ^= 0x01;  // a valid float, wrong bits
  });
  ASSERT_TRUE(x.ea->finished());
  EXPECT_TRUE(x.ea->completed().empty());
  EXPECT_NE(x.ea->failures().begin()->second.find("digest"), std::string::npos);
  EXPECT_EQ(x.ea->mean()[0], mine);  // own tensor, untouched
}

TEST(GroupExchange, OversizedNormAndWrongSizeAreRefused) {
  std::mt19937 rng(4);
  auto mine = randn(rng, 1024), big = mine;
  for (auto& v : big) v *= 100.0f;
  Manual x(mine, big, fp32_opts());
  x.deliver_b_to_a([](std::size_t, Bytes&) {});
  EXPECT_TRUE(x.ea->completed().empty());
  EXPECT_NE(x.ea->failures().begin()->second.find("norm"), std::string::npos);
  EXPECT_EQ(x.ea->mean()[0], mine);

  Manual y(randn(rng, 1024), randn(rng, 1000), fp32_opts());
  y.deliver_b_to_a([](std::size_t, Bytes&) {});
  EXPECT_TRUE(y.ea->completed().empty());
  EXPECT_NE(y.ea->failures().begin()->second.find("size"), std::string::npos);
}

// NoLoCo's Nesterov rule sends P then m': a member whose momentum is near zero (it was alone, or
// has just joined) still takes a partner's m' within the bound of its P, and nothing beyond it.
TEST(GroupExchange, TheBoundByTheFirstTensorLetsAFadedMomentumTakeItsPartners) {
  for (const bool by_first : {false, true}) {
    auto o = fp32_opts();
    o.bound_by_first = by_first;
    Group g(7, 2, 2, 1024, o);
    for (auto& v : g.tensors[0][1]) v *= 1e-3f;  // member 0's momentum has faded
    g.start();
    ASSERT_TRUE(g.net.run_until([&] { return g.all_finished(); }, 30s));
    EXPECT_EQ(g.at(0)->completed().size(), by_first ? 1u : 0u) << by_first;
    EXPECT_EQ(g.at(1)->completed().size(), 1u) << by_first;
  }
  auto o = fp32_opts();
  o.bound_by_first = true;
  Group g(8, 2, 2, 1024, o);
  for (auto& v : g.tensors[1][1]) v *= 100.0f;  // beyond twice member 0's P
  g.start();
  ASSERT_TRUE(g.net.run_until([&] { return g.all_finished(); }, 30s));
  EXPECT_TRUE(g.at(0)->completed().empty());
}

// The first bytes leave before any pass over our tensors (at a model's size, paged, a pass read
// gigabytes from the disk while the partner waited: 500M parameters, both sides dropped each
// other as silent after 10 s). A value that is not finite is found as its chunk is encoded: the
// exchange stops there, the partner is told at once, and each side keeps its own tensors.
TEST(GroupExchange, ANonFiniteValueStopsTheExchangeWhereTheStreamReachesIt) {
  std::mt19937 rng(9);
  auto o = fp32_opts();
  o.window = 4;
  auto mine = randn(rng, 256 * 20);
  const auto theirs = randn(rng, 256 * 20);
  mine[256 * 10 + 7] = std::numeric_limits<float>::quiet_NaN();  // chunk 10
  Manual x(mine, theirs, o);
  // Created: a window of messages (tensor_begin and chunks 0-2) is out, nothing is finished.
  EXPECT_FALSE(x.ea->finished());
  std::size_t chunks_sent = 0;
  bool aborted = false;
  for (int guard = 0; guard < 1000 && !(x.ea->finished() && x.eb->finished()); ++guard) {
    for (auto [from, to, e, peer] : {std::tuple{x.a, x.b, x.ea.get(), x.eb.get()},
                                     std::tuple{x.b, x.a, x.eb.get(), x.ea.get()}}) {
      for (auto& m : e->take_outgoing()) {
        auto msg = decode_message(m.data.span());
        ASSERT_TRUE(msg);
        if (from == x.a && msg->h.kind == MsgKind::chunk) ++chunks_sent;
        if (from == x.a && msg->h.kind == MsgKind::abort) aborted = true;
        if (!peer->finished()) peer->on_message(from, *msg, dht::Time(1));
        if (!e->finished()) e->on_delivered(to, dht::Time(1));
      }
    }
  }
  ASSERT_TRUE(x.ea->finished() && x.eb->finished());
  EXPECT_EQ(chunks_sent, 10u);  // chunks 0-9 went out; chunk 10 never did
  EXPECT_TRUE(aborted);
  EXPECT_TRUE(x.ea->completed().empty());
  EXPECT_NE(x.ea->failures().begin()->second.find("not finite"), std::string::npos);
  EXPECT_TRUE(x.eb->completed().empty());  // b dropped a on its abort, without a timeout
  EXPECT_NE(x.eb->failures().begin()->second.find("stopped the exchange"), std::string::npos);
  EXPECT_EQ(x.eb->mean()[0], theirs);
}

TEST(GroupExchange, OutOfOrderChunksAreRefused) {
  std::mt19937 rng(5);
  Manual x(randn(rng, 1024), randn(rng, 1024), fp32_opts());
  auto out = x.eb->take_outgoing();
  ASSERT_GE(out.size(), 3u);
  std::swap(out[1], out[2]);  // chunk 1 before chunk 0
  for (auto& o : out) {
    auto m = decode_message(o.data.span());
    x.ea->on_message(x.b, *m, dht::Time(1));
  }
  EXPECT_TRUE(x.ea->completed().empty());
}

// A tensor far larger than the window goes out a window at a time: the sender makes its next
// message only when one has left (a 1B-parameter tensor stands here as 100 chunks of 256 values,
// so nothing is ever encoded whole), and the pair still averages it.
TEST(GroupExchange, MakesAWindowOfMessagesAheadOfTheLink) {
  std::mt19937 rng(8);
  auto o = fp32_opts();
  o.window = 4;
  Manual x(randn(rng, 256 * 100), randn(rng, 256 * 100), o);
  std::size_t most = 0, made = 0;
  for (int guard = 0; guard < 10000 && !(x.ea->finished() && x.eb->finished()); ++guard) {
    for (auto [from, to, e, peer] : {std::tuple{x.a, x.b, x.ea.get(), x.eb.get()},
                                     std::tuple{x.b, x.a, x.eb.get(), x.ea.get()}}) {
      auto out = e->take_outgoing();
      most = std::max(most, out.size());
      made += out.size();
      for (auto& m : out) {
        peer->on_message(from, *decode_message(m.data.span()), dht::Time(1));
        e->on_delivered(to, dht::Time(1));  // one left: one more may be made
      }
    }
  }
  ASSERT_TRUE(x.ea->finished() && x.eb->finished());
  EXPECT_EQ(most, 4u);
  EXPECT_EQ(made, 2u * (100 + 2));  // begin, 100 chunks, end: each way
  EXPECT_EQ(x.ea->completed().size(), 1u);
  EXPECT_EQ(x.ea->mean()[0], x.eb->mean()[0]);
}

}  // namespace
}  // namespace grove::gossip
