// RingAllReduce on the simulated network: the mean, bit-identical results, and members that die
// at any byte offset or hang mid-transfer.
#include "gossip/allreduce.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tests/gossip/ring_swarm.hpp"

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;
using sim::GossipNetwork;
using testing::op_of;
using testing::vec;
using Swarm = testing::RingSwarm<RingAllReduce, AllReduceOptions>;

// Mean of the inputs of `members`, in double.
std::vector<double> exact_mean(const Swarm& s, const std::vector<NodeId>& members) {
  std::vector<double> m(s.inputs[0].size(), 0.0);
  for (const auto& id : members) {
    const auto i = std::find(s.ids.begin(), s.ids.end(), id) - s.ids.begin();
    for (std::size_t k = 0; k < m.size(); ++k) m[k] += s.inputs[static_cast<std::size_t>(i)][k];
  }
  for (auto& v : m) v /= static_cast<double>(members.size());
  return m;
}

double max_abs_err(const std::vector<float>& a, const std::vector<double>& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]));
  return w;
}

class RingSizes : public ::testing::TestWithParam<std::tuple<int, WireCodec>> {};

TEST_P(RingSizes, EveryMemberGetsTheSameMean) {
  const auto [members, codec] = GetParam();
  AllReduceOptions o;
  o.codec = codec;
  o.chunk_values = 256;
  const std::size_t n = 256 * 3 * static_cast<std::size_t>(members) + 77;  // ragged segments
  Swarm s(members * 10 + static_cast<int>(codec), static_cast<std::size_t>(members), n, o);
  s.start();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
  const auto mean = exact_mean(s, s.ids);
  // fp16/bf16 round each hop's partial sum: the error grows with the hops (values ~0.01).
  const double tol =
      codec == WireCodec::fp32 ? 1e-8 : (codec == WireCodec::fp16 ? 2e-5 : 2e-4) * members;
  for (std::size_t i = 0; i < s.ids.size(); ++i) {
    ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
    EXPECT_EQ(vec(s.at(i)->result()), vec(s.at(0)->result())) << "member " << i << " differs";
    EXPECT_EQ(s.at(i)->members().size(), s.ids.size());
    EXPECT_EQ(s.at(i)->stats().attempts, 1u);
  }
  EXPECT_LE(max_abs_err(vec(s.at(0)->result()), mean), tol);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingSizes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(WireCodec::fp32, WireCodec::fp16,
                                                              WireCodec::bf16)));

// grove.all_sum: the sum, not the mean; every member the same bits.
TEST(RingAllReduce, SumsWhenAskedTo) {
  for (int members : {1, 3, 4}) {
    AllReduceOptions o;
    o.codec = WireCodec::fp32;
    o.chunk_values = 256;
    o.mean = false;
    const std::size_t n = 256 * 5 + 33;
    Swarm s(500 + members, static_cast<std::size_t>(members), n, o);
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    auto sum = exact_mean(s, s.ids);
    for (auto& v : sum) v *= members;
    for (std::size_t i = 0; i < s.ids.size(); ++i) {
      ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
      EXPECT_EQ(vec(s.at(i)->result()), vec(s.at(0)->result())) << "member " << i;
    }
    EXPECT_LE(max_abs_err(vec(s.at(0)->result()), sum), 1e-7 * members) << members;
  }
  AllReduceOptions bad;
  bad.mean = false;
  bad.residual = true;
  EXPECT_FALSE(
      RingAllReduce::create(op_of(1), NodeId{}, {NodeId{}}, optim::Floats{}, bad, Time(0)));
}

TEST(RingAllReduce, SendsTheBandwidthOptimalAmount) {
  // Each member sends 2(N-1)/N of the tensor's wire bytes (plus headers and control messages).
  AllReduceOptions o;
  o.chunk_values = 1024;
  const std::size_t N = 4, n = 1024 * 64;
  Swarm s(7, N, n, o);
  s.start();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
  const double ideal = 2.0 * (N - 1) / N * static_cast<double>(encoded_size(o.codec, n));
  for (std::size_t i = 0; i < N; ++i) {
    const double sent = static_cast<double>(s.net.bytes_sent(s.ids[i]));
    EXPECT_GE(sent, ideal);
    EXPECT_LE(sent, ideal * 1.02) << "member " << i;
  }
}

// Small chunks and short timers: a member killed mid-op is suspected within seconds.
AllReduceOptions kill_options() {
  AllReduceOptions o;
  o.chunk_values = 256;
  o.chunk_timeout = 2000ms;
  o.heartbeat = 500ms;
  o.linger = 3000ms;
  return o;
}

// Σ over `members` of input − (residual + result): what the op lost, value by value, against the
// inputs' sum of magnitudes (0 when every encoding kept what it left out).
double conservation_error(Swarm& s, const std::vector<NodeId>& members, std::size_t self) {
  const auto result = vec(s.at(self)->result());
  double worst = 0, scale = 0;
  for (std::size_t k = 0; k < result.size(); ++k) {
    double in = 0, kept = 0;
    for (const auto& id : members) {
      const auto i =
          static_cast<std::size_t>(std::find(s.ids.begin(), s.ids.end(), id) - s.ids.begin());
      in += s.inputs[i][k];
      kept += s.at(i)->residual().data()[k] + static_cast<double>(result[k]);
      scale = std::max(scale, std::abs(static_cast<double>(s.inputs[i][k])));
    }
    worst = std::max(worst, std::abs(in - kept));
  }
  return worst / scale;
}

// E3M0 carries the ring's partial sums only with error feedback (`residual`): each member keeps
// what its one encoding of each value left out, so the members' residuals and N × the result add
// up to the sum of the inputs; the results are bit-identical, and each member sends 2 (N − 1)/N
// of the 4-bit tensor (against the all-gather's N − 1 times it).
TEST(RingAllReduce, E3M0PartialSumsKeepWhatTheirEncodingsLeaveOut) {
  for (std::size_t N : {2u, 3u, 5u}) {
    SCOPED_TRACE(std::to_string(N) + " members");
    AllReduceOptions o;
    o.codec = WireCodec::e3m0;
    o.chunk_values = 1024;
    o.residual = true;
    const std::size_t n = 1024 * 16 * N + 77;
    Swarm s(31 + N, N, n, o);
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    double left_out = 0;
    for (std::size_t i = 0; i < N; ++i) {
      ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
      EXPECT_EQ(vec(s.at(i)->result()), vec(s.at(0)->result())) << "member " << i;
      left_out = std::max(left_out, s.at(i)->residual_norm());
      const double ideal = 2.0 * (N - 1) / N * static_cast<double>(encoded_size(o.codec, n));
      EXPECT_LE(static_cast<double>(s.net.bytes_sent(s.ids[i])), ideal * 1.1) << "member " << i;
    }
    EXPECT_GT(left_out, 0.0);  // (4 bits a value leave something out)
    EXPECT_LT(conservation_error(s, s.ids, 0), 1e-5);
  }
  AllReduceOptions plain;
  plain.codec = WireCodec::e3m0;
  EXPECT_FALSE(RingAllReduce::create(OpId{}, NodeId{}, {NodeId{}},
                                     optim::Floats(std::vector<float>(8)), plain, dht::Time(0)));
}

// A member dying at any byte: the survivors redo the op among themselves, every value's residual
// is written again by the attempt that completes, and what they keep still adds up to their
// inputs.
TEST(RingAllReduce, E3M0SurvivorsKeepWhatTheirEncodingsLeaveOut) {
  AllReduceOptions o = kill_options();
  o.codec = WireCodec::e3m0;
  o.residual = true;
  const std::size_t N = 5, n = 256 * 2 * N + 100;
  std::mt19937_64 rng(77);
  int excluded = 0;
  for (int trial = 0; trial < 30; ++trial) {
    sim::GossipLinkModel link;
    link.bytes_per_ms = 500;
    link.loss_detect = 50ms;
    Swarm s(3000 + trial, N, n, o, link);
    s.net.kill_at_byte(s.ids[rng() % N], rng() % n);
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 120s)) << "trial " << trial;
    std::size_t ref = N;
    for (std::size_t i = 0; i < N; ++i) {
      if (!s.net.alive(s.ids[i])) continue;
      ASSERT_EQ(s.at(i)->status(), OpStatus::done)
          << "trial " << trial << ": " << s.at(i)->failure();
      if (ref == N) ref = i;
      EXPECT_EQ(vec(s.at(i)->result()), vec(s.at(ref)->result())) << "trial " << trial;
    }
    ASSERT_LT(ref, N);
    const auto members = s.at(ref)->members();
    excluded += members.size() < N;
    EXPECT_LT(conservation_error(s, members, ref), 1e-5) << "trial " << trial;
  }
  EXPECT_GT(excluded, 15);
}

TEST(RingAllReduce, SurvivorsAreBitIdenticalWhenAMemberDiesAtAnyByte) {
  const AllReduceOptions o = kill_options();
  const std::size_t N = 8, n = 256 * 2 * N + 100;
  std::mt19937_64 rng(2024);
  int excluded = 0;
  for (int trial = 0; trial < 100; ++trial) {
    // A lossless run sends about 2(N-1)/N * 2n bytes per member; die anywhere in it.
    const std::uint64_t offset = rng() % (4 * n);
    const std::size_t victim = rng() % N;
    sim::GossipLinkModel link;
    link.bytes_per_ms = 2000;  // slow enough that the transfer spans many milliseconds
    link.loss_detect = trial % 2 ? 50ms : dht::Time::max() / 4;  // reset, or silence
    Swarm s(1000 + trial, N, n, o, link);
    GossipNetwork* net = &s.net;
    net->kill_at_byte(s.ids[victim], offset);
    s.start();
    ASSERT_TRUE(net->run_until([&] { return s.all_finished(); }, 120s)) << "trial " << trial;
    const RingAllReduce* ref = nullptr;
    for (std::size_t i = 0; i < N; ++i) {
      if (!net->alive(s.ids[i])) continue;
      const auto* p = s.at(i);
      ASSERT_EQ(p->status(), OpStatus::done)
          << "trial " << trial << " member " << i << ": " << p->failure();
      if (!ref) ref = p;
      EXPECT_EQ(p->members().size(), ref->members().size()) << "trial " << trial << " member " << i;
      EXPECT_TRUE(vec(p->result()) == vec(ref->result())) << "trial " << trial << " member " << i;
    }
    ASSERT_NE(ref, nullptr);
    if (ref->members().size() < N) ++excluded;
    EXPECT_LE(max_abs_err(vec(ref->result()), exact_mean(s, ref->members())), 2e-5 * N);
  }
  EXPECT_GT(excluded, 50);  // most offsets fall before the end: the victim is left out
}

TEST(RingAllReduce, AHangingMemberIsLeftOutWithinTheChunkTimeout) {
  AllReduceOptions o;
  o.chunk_values = 256;
  o.chunk_timeout = 2000ms;
  o.heartbeat = 500ms;
  sim::GossipLinkModel link;
  link.bytes_per_ms = 100;  // ~0.3 s of transfer per member
  const std::size_t N = 5, n = 256 * 8 * N;
  Swarm s(55, N, n, o, link);
  s.start();
  s.net.run_until(dht::Time(50));
  s.net.hang(s.ids[2]);
  const auto hung_at = s.net.now();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
  std::vector<float> ref;
  for (std::size_t i = 0; i < N; ++i) {
    if (i == 2) continue;
    ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
    EXPECT_EQ(s.at(i)->members().size(), N - 1);
    if (ref.empty()) ref = vec(s.at(i)->result());
    EXPECT_EQ(vec(s.at(i)->result()), ref);
  }
  // Detection takes one chunk timeout; the retry among 4 then moves 2·(3/4)·n fp16 values
  // at 100 B/ms (~0.3 s per member).
  EXPECT_LE(s.net.now() - hung_at, o.chunk_timeout + 1000ms);
}

// Members start the op when each has read the window's records (a large model's node later
// still): a predecessor that starts a few seconds late is given start_grace more before it is
// suspected, so a pair does not split into two members averaging alone. Once heard, the chunk
// timeout alone applies again.
TEST(RingAllReduce, APredecessorStartingLateIsGivenTheStartGrace) {
  for (const auto grace : {0ms, 3000ms}) {
    AllReduceOptions o;
    o.chunk_values = 256;
    o.chunk_timeout = 2000ms;
    o.heartbeat = 500ms;
    o.start_grace = grace;
    Swarm s(57, 2, 256 * 4, o);
    s.net.attach(s.ids[0],
                 RingAllReduce::create(s.op, s.ids[0], s.ids, s.inputs[0], o, s.net.now()).value());
    s.net.run_until(dht::Time(3500));  // the other member reads its match 3.5 s later
    s.net.attach(s.ids[1],
                 RingAllReduce::create(s.op, s.ids[1], s.ids, s.inputs[1], o, s.net.now()).value());
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    const std::size_t together = grace > 0ms ? 2 : 1;
    EXPECT_EQ(s.at(0)->members().size(), together) << "grace " << grace.count();
    if (grace > 0ms) {
      ASSERT_EQ(s.at(1)->status(), OpStatus::done);
      EXPECT_EQ(vec(s.at(0)->result()), vec(s.at(1)->result()));
    }
  }
}

TEST(RingAllReduce, ExcludedMemberFailsInsteadOfDiverging) {
  AllReduceOptions o;
  o.chunk_values = 256;
  const std::size_t N = 3;
  Swarm s(9, N, 256 * 6, o);
  s.start();
  // Member 0 hears that the others suspect it.
  Header h;
  h.kind = MsgKind::abort;
  h.op = s.op;
  h.suspects = {s.ids[0]};
  const Bytes b = encode_message(h, 0);
  auto m = decode_message(b.span());
  ASSERT_TRUE(m);
  s.at(0)->on_message(s.ids[1], *m, s.net.now());
  EXPECT_EQ(s.at(0)->status(), OpStatus::failed);
  EXPECT_NE(s.at(0)->failure().find("excluded"), std::string::npos);
}

TEST(RingAllReduce, AMalformedChunkGetsItsSenderSuspected) {
  AllReduceOptions o;
  o.chunk_values = 256;
  const std::size_t N = 3;
  const OpId op = op_of(1);
  std::vector<NodeId> ids(N);
  for (std::size_t i = 0; i < N; ++i) ids[i][0] = static_cast<std::uint8_t>(i + 1);
  auto r_core =
      RingAllReduce::create(op, ids[1], ids, std::vector<float>(256 * 3, 1.0f), o, dht::Time(0))
          .value();
  auto& r = *r_core;
  // From the predecessor (ids[0]): a chunk whose count does not match the segment.
  Header h;
  h.kind = MsgKind::chunk;
  h.op = op;
  h.phase = Phase::reduce_scatter;
  h.index = 0;
  h.count = 5;
  h.codec = o.codec;
  const Bytes b = encode_message(h, encoded_size(o.codec, 5));
  auto m = decode_message(b.span());
  ASSERT_TRUE(m);
  r.take_outgoing();
  r.on_message(ids[0], *m, dht::Time(1));
  EXPECT_EQ(r.suspects().count(ids[0]), 1u);
  EXPECT_EQ(r.members().size(), 2u);
  // A NaN smuggled in fp32 is refused the same way.
  AllReduceOptions o32;
  o32.codec = WireCodec::fp32;
  o32.chunk_values = 256;
  auto r2_core =
      RingAllReduce::create(op, ids[1], ids, std::vector<float>(256 * 3, 1.0f), o32, dht::Time(0))
          .value();
  auto& r2 = *r2_core;
  h.codec = WireCodec::fp32;
  h.count = 256;
  std::span<std::uint8_t> payload;
  Bytes nan = encode_message(h, 1024, &payload);
  const float q = std::nanf("");
  for (std::size_t i = 0; i < 256; ++i) std::memcpy(payload.data() + 4 * i, &q, 4);
  auto mn = decode_message(nan.span());
  ASSERT_TRUE(mn);
  r2.on_message(ids[0], *mn, dht::Time(1));
  EXPECT_EQ(r2.suspects().count(ids[0]), 1u);
}

TEST(RingAllReduce, AMemberLeftAloneOutOfThreeFailsButOneOfAPairGoesOn) {
  AllReduceOptions o;
  o.chunk_values = 256;
  for (std::size_t N : {2u, 3u}) {
    std::vector<NodeId> ids(N);
    for (std::size_t i = 0; i < N; ++i) ids[i][0] = static_cast<std::uint8_t>(i + 1);
    auto r_core =
        RingAllReduce::create(op_of(4), ids[0], ids, std::vector<float>(512, 1.0f), o, dht::Time(0))
            .value();
    auto& r = *r_core;
    for (std::size_t i = 1; i < N; ++i) r.on_peer_failed(ids[i], dht::Time(1));
    if (N == 2) {
      EXPECT_EQ(r.status(), OpStatus::done);
      EXPECT_EQ(vec(r.result()), std::vector<float>(512, 1.0f));
    } else {
      EXPECT_EQ(r.status(), OpStatus::failed);
    }
  }
  // E3M0 with error feedback: alone after its first chunks went out, the member keeps its input
  // exactly and nothing is left out (the first attempt's residual is forgotten).
  AllReduceOptions e = o;
  e.codec = WireCodec::e3m0;
  e.residual = true;
  const std::vector<NodeId> pair{NodeId{1}, NodeId{2}};
  std::vector<float> x(512);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.3f + 0.01f * static_cast<float>(i % 7);
  auto r = RingAllReduce::create(op_of(4), pair[0], pair, x, e, dht::Time(0)).value();
  r->on_peer_failed(pair[1], dht::Time(1));
  ASSERT_EQ(r->status(), OpStatus::done);
  EXPECT_EQ(vec(r->result()), x);
  EXPECT_EQ(vec(r->residual()), std::vector<float>(512, 0.0f));
  EXPECT_EQ(r->residual_norm(), 0.0);
}

// Members whose views of the group differ suspect each other in turn; if both halves could go
// on, each would end the round with its own slow weights. Only a strict majority goes on.
TEST(RingAllReduce, HalfTheGroupGoneFailsAMajorityGoesOn) {
  AllReduceOptions o;
  o.chunk_values = 256;
  for (const auto& [N, lost] : std::vector<std::pair<std::size_t, std::size_t>>{
           {4, 1}, {4, 2}, {5, 2}, {5, 3}, {8, 3}, {8, 4}}) {
    SCOPED_TRACE(std::to_string(lost) + " of " + std::to_string(N) + " lost");
    std::vector<NodeId> ids(N);
    for (std::size_t i = 0; i < N; ++i) ids[i][0] = static_cast<std::uint8_t>(i + 1);
    auto r_core =
        RingAllReduce::create(op_of(5), ids[0], ids, std::vector<float>(512, 1.0f), o, dht::Time(0))
            .value();
    auto& r = *r_core;
    for (std::size_t i = 1; i <= lost; ++i) r.on_peer_failed(ids[i], dht::Time(1));
    if (2 * (N - lost) > N) {
      EXPECT_EQ(r.status(), OpStatus::running);
      EXPECT_EQ(r.members().size(), N - lost);
    } else {
      EXPECT_EQ(r.status(), OpStatus::failed);
      EXPECT_NE(r.failure().find("not a majority"), std::string::npos) << r.failure();
    }
  }
}

TEST(RingAllReduce, GivesUpAtTheTotalTimeout) {
  AllReduceOptions o;
  o.chunk_values = 256;
  o.total_timeout = 5000ms;
  std::vector<NodeId> ids(2);
  ids[1][0] = 1;
  auto r_core =
      RingAllReduce::create(op_of(3), ids[0], ids, std::vector<float>(512, 1.0f), o, dht::Time(0))
          .value();
  auto& r = *r_core;
  // Heartbeats keep arriving from the peer but no data ever does.
  Header h;
  h.kind = MsgKind::heartbeat;
  h.op = op_of(3);
  const Bytes b = encode_message(h, 0);
  auto m = decode_message(b.span());
  for (dht::Time t{0}; t < 6000ms; t += 500ms) {
    r.on_message(ids[1], *m, t);
    r.on_timer(t);
    ASSERT_TRUE(r.next_deadline() || r.finished());
  }
  EXPECT_EQ(r.status(), OpStatus::failed);
}

// The input is not scanned up front: a non-finite value fails the op when its chunk is encoded,
// whether it lies in this member's own segment or in one it adds to a partial sum, and the other
// members leave the failed member out and finish among themselves.
TEST(RingAllReduce, ANonFiniteInputFailsItsMemberAndTheOthersFinish) {
  for (const bool own_segment : {true, false}) {
    AllReduceOptions o;
    o.chunk_values = 256;
    o.chunk_timeout = 2000ms;
    o.heartbeat = 500ms;
    o.linger = 3000ms;
    Swarm s(own_segment ? 31 : 32, 3, 256 * 9, o);
    // Member 1 starts the chain of segment 1; segment 2 reaches it as a partial sum.
    const std::size_t seg = own_segment ? 1 : 2;
    s.inputs[1][seg * 256 * 3 + 5] = std::numeric_limits<float>::quiet_NaN();
    s.start();
    ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, 60s));
    EXPECT_EQ(s.at(1)->status(), OpStatus::failed);
    EXPECT_EQ(s.at(1)->failure(), "local input is not finite");
    ASSERT_EQ(s.at(0)->status(), OpStatus::done) << s.at(0)->failure();
    ASSERT_EQ(s.at(2)->status(), OpStatus::done) << s.at(2)->failure();
    EXPECT_EQ(vec(s.at(0)->result()), vec(s.at(2)->result()));
    EXPECT_EQ(s.at(0)->members().size(), 2u);
    for (float v : s.at(0)->result()) ASSERT_TRUE(std::isfinite(v));
  }
}

// A member's own segment starts the reduce-scatter a window at a time (a 1B-parameter tensor
// stands here as 200 chunks of 256 values): before any message has left only the window is made,
// each one that leaves lets one more be made, and the ring still ends with one mean everywhere.
TEST(RingAllReduce, MakesAWindowOfItsOwnChunksAheadOfTheLink) {
  AllReduceOptions o;
  o.codec = WireCodec::fp32;
  o.chunk_values = 256;
  o.window = 4;
  std::vector<NodeId> ids(2);
  ids[0][0] = 1;
  ids[1][0] = 2;
  auto r = RingAllReduce::create(op_of(9), ids[0], ids, std::vector<float>(256 * 400, 0.5f), o,
                                 dht::Time(0))
               .value();
  EXPECT_EQ(r->take_outgoing().size(), 4u);
  EXPECT_TRUE(r->take_outgoing().empty());
  r->on_delivered(ids[1], dht::Time(1));
  EXPECT_EQ(r->take_outgoing().size(), 1u);
  r->on_delivered(ids[0], dht::Time(1));  // (not its successor)
  EXPECT_TRUE(r->take_outgoing().empty());

  Swarm s(91, 3, 256 * 600, o);
  s.start();
  ASSERT_TRUE(s.net.run_until([&] { return s.all_finished(); }, std::chrono::seconds(60)));
  const auto mean = exact_mean(s, s.ids);
  for (std::size_t i = 0; i < s.ids.size(); ++i) {
    ASSERT_EQ(s.at(i)->status(), OpStatus::done) << s.at(i)->failure();
    EXPECT_EQ(vec(s.at(i)->result()), vec(s.at(0)->result()));
  }
  EXPECT_LE(max_abs_err(vec(s.at(0)->result()), mean), 1e-8);
}

}  // namespace
}  // namespace grove::gossip
