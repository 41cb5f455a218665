// RingAllGather on the simulated network: every member ends with the very same bits, which are
// the mean of what each member encoded (top-k, 2-bit top-k, E3M0, fp32), summed in ring order;
// members that die at any byte or send garbage are left out; each member sends (N−1) messages.
#include "gossip/allgather.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tests/gossip/ring_swarm.hpp"

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;
using testing::op_of;
using testing::vec;

GatherCodec codec_of(int c) {
  GatherCodec g;
  switch (c) {
    case 0:
      g.kind = WireCodec::fp32;
      break;
    case 1:
      g.kind = WireCodec::e3m0;
      break;
    case 2:
      g.kind = WireCodec::topk;
      g.topk = {512, 8, false};
      break;
    default:
      g.kind = WireCodec::topk;
      g.topk = {512, 8, true};
      break;
  }
  return g;
}

AllGatherOptions options(int c) {
  AllGatherOptions o;
  o.codec = codec_of(c);
  o.piece_values = 1024;
  o.timers.chunk_timeout = 2000ms;
  o.timers.heartbeat = 500ms;
  o.timers.linger = 3000ms;
  o.window = 4;
  return o;
}

struct Swarm : testing::RingSwarm<RingAllGather, AllGatherOptions> {
  using RingSwarm::RingSwarm;
  // What the members of `ring` should all hold: each one's input encoded and decoded, summed in
  // ring order, divided by the count — bit for bit.
  std::vector<float> expected(const std::vector<NodeId>& ring) const {
    const std::size_t n = inputs[0].size();
    std::vector<float> out(n), d(n);
    std::vector<std::uint8_t> bytes;
    std::vector<float> scratch;
    for (std::size_t lo = 0; lo < n; lo += opts.piece_values) {
      const std::size_t len = std::min(opts.piece_values, n - lo);
      bytes.resize(opts.codec.encoded_size(len));
      for (std::size_t j = 0; j < ring.size(); ++j) {
        const auto k =
            static_cast<std::size_t>(std::find(ids.begin(), ids.end(), ring[j]) - ids.begin());
        EXPECT_EQ(opts.codec.encode(std::span(inputs[k]).subspan(lo, len), bytes, scratch),
                  optim::CodecError::ok);
        auto dst = std::span(j == 0 ? out : d).subspan(lo, len);
        EXPECT_EQ(opts.codec.decode(bytes, dst), optim::CodecError::ok);
        if (j > 0)
          for (std::size_t i = 0; i < len; ++i) out[lo + i] += d[lo + i];
      }
      for (std::size_t i = 0; i < len; ++i) out[lo + i] /= static_cast<float>(ring.size());
    }
    return out;
  }
};

class GatherSizes : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GatherSizes, EveryMemberGetsTheSameMeanOfTheEncodedTensors) {
  const auto [members, codec] = GetParam();
  const std::size_t n = 1024 * 5 + 300;  // a short last piece (and a short top-k chunk)
  Swarm s(members * 10 + codec, static_cast<std::size_t>(members), n, options(codec));
  s.start();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
  const auto want = s.expected(s.ids);
  for (std::size_t i = 0; i < s.ids.size(); ++i) {
    ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
    EXPECT_EQ(vec(s.at(i)->result()), want) << "member " << i;
    EXPECT_EQ(s.at(i)->stats().attempts, 1u);
  }
  // The input is not changed (the caller's error buffer: its feedback is the caller's).
  EXPECT_EQ(vec(s.at(0)->take_input()), s.inputs[0]);
}

INSTANTIATE_TEST_SUITE_P(Sizes, GatherSizes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(0, 1, 2, 3)));

TEST(RingAllGather, EachMemberSendsItsMessageToEveryOtherOnce) {
  const std::size_t N = 4, n = 512 * 256;
  for (int c : {1, 2, 3}) {
    auto o = options(c);
    o.piece_values = 512 * 32;
    Swarm s(70 + c, N, n, o);
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    const double ideal = static_cast<double>((N - 1) * o.codec.encoded_size(n));
    for (std::size_t i = 0; i < N; ++i) {
      const double sent = static_cast<double>(s.net.bytes_sent(s.ids[i]));
      EXPECT_GE(sent, ideal) << "codec " << c;
      // Headers: one a piece a hop, done messages, a heartbeat or two.
      const double messages = static_cast<double>((N - 1) * (n / o.piece_values) + 2 * N);
      EXPECT_LE(sent, ideal + 64 * messages) << "codec " << c << " member " << i;
    }
    // Top-k at 8 of 512 (fp32 values, u16 indices): 6 bytes per 512 values...
    if (c == 2) {
      EXPECT_EQ(o.codec.encoded_size(n), n / 512 * 8 * 6);
    }
  }
}

TEST(RingAllGather, HoldsAFewPiecesAtATimeNotEveryMessage) {
  const std::size_t N = 4, n = 512 * 256;
  auto o = options(2);
  o.piece_values = 2048;  // 64 pieces
  Swarm s(75, N, n, o);
  s.start();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
  const std::size_t piece = o.codec.encoded_size(o.piece_values);
  for (std::size_t i = 0; i < N; ++i) {
    ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
    const std::size_t peak = s.at(i)->peak_held_bytes();
    EXPECT_GT(peak, 0u);
    // Every member's pieces in flight (the window, plus those passed on) — not all N messages.
    EXPECT_LE(peak, (o.window + N) * N * piece) << "member " << i;
    EXPECT_LT(peak, N * o.codec.encoded_size(n) / 4) << "member " << i;
  }
}

TEST(RingAllGather, ScalesItsInputAPieceAtATime) {
  for (int c : {0, 2}) {
    auto o = options(c);
    o.scale = 0.25f;  // a power of two: the scaled values are exact
    const std::size_t n = 1024 * 3 + 100;
    Swarm s(80 + c, 3, n, o);
    const auto given = s.inputs;
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    for (auto& in : s.inputs)
      for (float& x : in) x *= 0.25f;  // what each member's message is cut from
    const auto want = s.expected(s.ids);
    for (std::size_t i = 0; i < s.ids.size(); ++i) {
      ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
      EXPECT_EQ(vec(s.at(i)->result()), want) << "codec " << c << " member " << i;
      EXPECT_EQ(vec(s.at(i)->take_input()), s.inputs[i]) << "codec " << c << " member " << i;
    }
    EXPECT_NE(given[0], s.inputs[0]);
  }
}

TEST(RingAllGather, SurvivorsAreBitIdenticalWhenAMemberDiesAtAnyByte) {
  const std::size_t N = 6, n = 1024 * 6 + 100;
  std::mt19937_64 rng(77);
  int excluded = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int codec = trial % 4;
    auto o = options(codec);
    const std::uint64_t message = o.codec.encoded_size(n);
    const std::uint64_t offset = rng() % ((N - 1) * message + 1);
    const std::size_t victim = rng() % N;
    sim::GossipLinkModel link;
    link.bytes_per_ms = 200;
    link.loss_detect = trial % 2 ? 50ms : dht::Time::max() / 4;  // reset, or silence
    Swarm s(2000 + trial, N, n, o, link);
    s.net.kill_at_byte(s.ids[victim], offset);
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 120s)) << "trial " << trial;
    const RingAllGather* ref = nullptr;
    for (std::size_t i = 0; i < N; ++i) {
      if (!s.net.alive(s.ids[i])) continue;
      const auto* p = s.at(i);
      ASSERT_EQ(p->status(), OpStatus::done) << "trial " << trial << ": " << p->failure();
      if (!ref) ref = p;
      EXPECT_EQ(p->members(), ref->members()) << "trial " << trial;
      EXPECT_EQ(vec(p->result()), vec(ref->result())) << "trial " << trial << " member " << i;
    }
    ASSERT_NE(ref, nullptr);
    if (ref->members().size() < N) ++excluded;
    EXPECT_EQ(vec(ref->result()), s.expected(ref->members())) << "trial " << trial;
  }
  EXPECT_GT(excluded, 30);
}

// grove.all_gather: every member's tensor in ring order, exact in fp32; when a member dies the
// survivors hold the same concatenation of the members that completed.
TEST(RingAllGather, ConcatGivesEveryMembersTensorInRingOrder) {
  const std::size_t n = 1024 * 2 + 77;
  for (std::size_t N : {1u, 3u, 4u}) {
    auto o = options(0);
    o.concat = true;
    Swarm s(300 + N, N, n, o);
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    std::vector<float> want;
    for (const auto& id : s.ids) {
      const auto k =
          static_cast<std::size_t>(std::find(s.ids.begin(), s.ids.end(), id) - s.ids.begin());
      want.insert(want.end(), s.inputs[k].begin(), s.inputs[k].end());
    }
    for (std::size_t i = 0; i < N; ++i) {
      ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
      EXPECT_EQ(vec(s.at(i)->result()), want) << "N " << N << " member " << i;
    }
  }
  // A member that dies: the survivors' result is the survivors' tensors, in ring order.
  auto o = options(0);
  o.concat = true;
  sim::GossipLinkModel link;
  link.bytes_per_ms = 200;
  link.loss_detect = 50ms;
  Swarm s(310, 4, n, o, link);
  s.net.kill_at_byte(s.ids[2], 3000);
  s.start();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 120s));
  for (std::size_t i = 0; i < 4; ++i) {
    if (!s.net.alive(s.ids[i])) continue;
    const auto* p = s.at(i);
    ASSERT_EQ(p->status(), OpStatus::done) << p->failure();
    ASSERT_EQ(p->members().size(), 3u);
    std::vector<float> want;
    for (const auto& id : p->members()) {
      const auto k =
          static_cast<std::size_t>(std::find(s.ids.begin(), s.ids.end(), id) - s.ids.begin());
      want.insert(want.end(), s.inputs[k].begin(), s.inputs[k].end());
    }
    EXPECT_EQ(vec(p->result()), want) << "member " << i;
  }
}

// A piece that does not decode is refused before it is passed on: its sender is suspected, and
// the others end without it.
TEST(RingAllGather, AGarbledPieceGetsItsSenderSuspected) {
  const std::size_t N = 3;
  std::vector<NodeId> ids(N);
  for (std::size_t i = 0; i < N; ++i) ids[i][0] = static_cast<std::uint8_t>(i + 1);
  for (int c : {0, 2, 3}) {
    auto o = options(c);
    auto r = RingAllGather::create(op_of(3), ids[1], ids, std::vector<float>(1024 * 2, 0.5f), o,
                                   dht::Time(0))
                 .value();
    r->take_outgoing();
    Header h;
    h.kind = MsgKind::chunk;
    h.op = op_of(3);
    h.phase = Phase::all_gather;
    h.index = 0;
    h.chunk = 1;
    h.count = 1024;
    h.codec = o.codec.kind;
    std::span<std::uint8_t> payload;
    Bytes b = encode_message(h, o.codec.encoded_size(1024), &payload);
    std::memset(payload.data(), 0xff, payload.size());  // NaN values; top-k: indices past the chunk
    auto m = decode_message(b.span());
    ASSERT_TRUE(m);
    r->on_message(ids[0], *m, dht::Time(1));
    EXPECT_EQ(r->suspects().count(ids[0]), 1u) << "codec " << c;
    // Nothing of it was passed on: no chunk of the first attempt (tag 0) left after it, only
    // aborts and the new attempt's own pieces.
    for (const auto& out : r->take_outgoing()) {
      auto sent = decode_message(out.data.span());
      ASSERT_TRUE(sent);
      EXPECT_FALSE(sent->h.kind == MsgKind::chunk && sent->h.tag == 0) << "codec " << c;
    }
  }
}

TEST(RingAllGather, RefusesPiecesTheCodecCannotCut) {
  std::vector<NodeId> ids(2);
  ids[1][0] = 1;
  auto o = options(2);
  o.piece_values = 1000;  // not a multiple of the 512-value top-k chunk
  EXPECT_FALSE(RingAllGather::create(op_of(1), ids[0], ids, std::vector<float>(10), o, {}));
  o = options(1);
  o.piece_values = 300;  // not a multiple of E3M0's 256-value block
  EXPECT_FALSE(RingAllGather::create(op_of(1), ids[0], ids, std::vector<float>(10), o, {}));
  o = options(2);
  o.codec.topk.k = 0;
  EXPECT_FALSE(RingAllGather::create(op_of(1), ids[0], ids, std::vector<float>(10), o, {}));
}

TEST(RingAllGather, ANonFiniteInputFailsItsMember) {
  std::vector<NodeId> ids(2);
  ids[1][0] = 1;
  std::vector<float> x(2048, 0.1f);
  x[1500] = std::numeric_limits<float>::infinity();
  for (int c : {0, 1, 2}) {
    auto r = RingAllGather::create(op_of(2), ids[0], ids, x, options(c), dht::Time(0)).value();
    // The window sends the first pieces; the bad one fails the op when it is encoded.
    for (int k = 0; k < 4 && !r->finished(); ++k) r->on_delivered(ids[1], dht::Time(k + 1));
    EXPECT_EQ(r->status(), OpStatus::failed) << "codec " << c;
  }
}

// Error feedback: what a member keeps plus what it sent is what it had.
TEST(GatherCodec, FeedbackSubtractsExactlyWhatWasSent) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> e(1024 * 3 + 200);
  for (auto& v : e) v = g(rng);
  for (int c : {1, 2, 3}) {
    const auto codec = codec_of(c);
    auto kept = e;
    ASSERT_EQ(codec.feedback(kept, 1024), optim::CodecError::ok);
    std::vector<float> sent(e.size()), scratch;
    std::vector<std::uint8_t> bytes;
    for (std::size_t lo = 0; lo < e.size(); lo += 1024) {
      const std::size_t len = std::min<std::size_t>(1024, e.size() - lo);
      bytes.resize(codec.encoded_size(len));
      ASSERT_EQ(codec.encode(std::span(e).subspan(lo, len), bytes, scratch), optim::CodecError::ok);
      ASSERT_EQ(codec.decode(bytes, std::span(sent).subspan(lo, len)), optim::CodecError::ok);
    }
    double worst = 0;
    for (std::size_t i = 0; i < e.size(); ++i)
      worst = std::max(worst, std::abs(double(kept[i]) + sent[i] - e[i]) /
                                  std::max(1e-30, std::abs(double(e[i]))));
    EXPECT_LE(worst, 1e-6) << "codec " << c;
    // Top-k sent 8 of each 512: the rest is kept whole.
    if (c == 2) {
      std::size_t unchanged = 0;
      for (std::size_t i = 0; i < e.size(); ++i) unchanged += kept[i] == e[i];
      EXPECT_EQ(unchanged, e.size() - 8 * 7);  // 7 chunks (the last one short)
    }
  }
}

}  // namespace
}  // namespace grove::gossip
