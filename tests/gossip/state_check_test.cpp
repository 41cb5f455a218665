// Checking a downloaded state with the other members: the probe and its answer on the wire (and
// their bounds), the samples a server reads from its snapshot, and the verdicts: DiLoCo's majority
// of the round's hash, NoLoCo's distance from the others' values, and the swarm of two.
#include "gossip/state_check.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gossip/state_sync.hpp"
#include "gossip/step_work.hpp"
#include "optim/state_format.hpp"

namespace grove::gossip {
namespace {

NodeId node(int i) {
  NodeId id{};
  id[0] = static_cast<std::uint8_t>(i + 1);
  return id;
}

Digest digest(int i) {
  Digest d{};
  d[0] = static_cast<std::uint8_t>(i + 1);
  d[31] = 7;
  return d;
}

std::vector<float> weights(std::size_t n, std::uint32_t seed, float noise = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i)) + noise * g(rng);
  return v;
}

Witness hash_witness(int who, std::uint64_t round, const Digest& h) {
  ProbeAnswer a;
  a.round = round;
  a.hash = h;
  return {node(who), a, {}};
}

Witness sample_witness(int who, std::span<const float> phi, std::uint64_t seed) {
  ProbeAnswer a;
  a.round = 9;
  a.sampled = 9;
  a.values = phi.size();
  for (const auto i : sample_positions(seed, phi.size(), kProbeSamples))
    a.samples.push_back(phi[i]);
  return {node(who), a, {}};
}

TEST(StateCheck, ProbesAndAnswersRoundTripAndAreBounded) {
  const StateProbe p{41, 0xfeedull, kProbeSamples};
  auto back = decode_probe(encode_probe(p));
  ASSERT_TRUE(back) << back.text();
  EXPECT_EQ(back->round, 41u);
  EXPECT_EQ(back->seed, 0xfeedull);
  // A chunk request is no probe, and a probe no chunk request: the server tells them apart.
  EXPECT_FALSE(decode_probe(encode_state_request({digest(0), 3})));
  EXPECT_FALSE(decode_state_request(encode_probe(p)));
  EXPECT_FALSE(decode_probe(encode_probe({1, 2, kProbeSamples + 1})));

  ProbeAnswer a;
  a.round = 41;
  a.hash = digest(2);
  a.sampled = 40;
  a.values = 1000;
  a.samples = {1.5f, -2.0f, 0.0f};
  auto got = decode_probe_answer(encode_probe_answer(a));
  ASSERT_TRUE(got) << got.text();
  EXPECT_EQ(got->hash, a.hash);
  EXPECT_EQ(got->samples, a.samples);
  a.samples[1] = std::nanf("");
  EXPECT_FALSE(decode_probe_answer(encode_probe_answer(a)));
  a.samples[1] = INFINITY;
  EXPECT_FALSE(decode_probe_answer(encode_probe_answer(a)));
  a.samples.assign(kProbeSamples + 1, 1.0f);  // (the encoder sends kProbeSamples at most)
  auto capped = decode_probe_answer(encode_probe_answer(a));
  ASSERT_TRUE(capped);
  EXPECT_EQ(capped->samples.size(), kProbeSamples);
  EXPECT_FALSE(decode_probe_answer(std::vector<std::uint8_t>{0x93, 0x01, 0x02, 0x03}));
}

TEST(StateCheck, AServerAnswersWithItsRoundsHashAndItsSnapshotsValues) {
  optim::OuterState st;
  st.round = 12;
  st.phi = weights(5000, 1);
  st.momentum = std::vector<float>(5000, 0.5f);
  const auto phi = st.phi.to_vector();
  auto server = std::make_shared<StateServer>();
  server->add(std::make_shared<StateSnapshot>("run-c", 12, optim::serialize(st), 4096));
  server->note_hash(12, digest(5));
  for (std::uint64_t r = 100; r < 100 + kHashHistory; ++r) server->note_hash(r, digest(6));
  server->note_hash(11, digest(4));  // (older than the history kept once more are noted)

  const auto ask = [&](std::uint64_t round) {
    auto body = server->answer(encode_probe({round, 77, kProbeSamples}));
    EXPECT_TRUE(body) << body.text();
    auto a = decode_probe_answer(*body);
    EXPECT_TRUE(a) << a.text();
    return *a;
  };
  const auto a = ask(100);
  EXPECT_EQ(a.hash, digest(6));
  EXPECT_EQ(a.sampled, 12u);
  EXPECT_EQ(a.values, 5000u);
  const auto at = sample_positions(77, 5000, kProbeSamples);
  ASSERT_EQ(a.samples.size(), kProbeSamples);
  for (std::size_t k = 0; k < at.size(); ++k) EXPECT_EQ(a.samples[k], phi[at[k]]);
  EXPECT_EQ(ask(12).hash, Digest{});  // pushed out of the history
  EXPECT_EQ(ask(99).hash, Digest{});  // never held

  // The positions are the same on every member and lie within φ.
  EXPECT_EQ(sample_positions(77, 5000, 8), sample_positions(77, 5000, 8));
  EXPECT_NE(sample_positions(78, 5000, 8), sample_positions(77, 5000, 8));
  for (const auto i : sample_positions(5, 3, 100)) EXPECT_LT(i, 3u);
  EXPECT_TRUE(sample_positions(5, 0, 10).empty());
}

StateToJudge diloco(std::uint64_t round, const Digest& h) {
  StateToJudge s;
  s.same_hash = true;
  s.donor = node(1);
  s.round = round;
  s.hash = h;
  return s;
}

TEST(StateCheck, ADiLoCoStateNeedsTheHashOfAStrictMajorityAndSomeoneBesidesItsDonor) {
  const Digest good = digest(1), bad = digest(2);
  // The group's hash, reported by the donor and two others (one member not at the round yet).
  std::vector<Witness> w = {hash_witness(1, 8, good), hash_witness(2, 8, good),
                            hash_witness(3, 8, good), hash_witness(4, 7, digest(3))};
  auto v = judge_state(diloco(8, good), w);
  EXPECT_TRUE(v.accepted) << v.detail;
  EXPECT_NE(v.detail.find("3 of 3"), std::string::npos) << v.detail;
  EXPECT_NE(v.detail.find(dht::short_hex(node(3))), std::string::npos) << v.detail;
  // A donor whose state is not the group's: its hash has one voice (its own) of three.
  w = {hash_witness(1, 8, bad), hash_witness(2, 8, good), hash_witness(3, 8, good)};
  v = judge_state(diloco(8, bad), w);
  EXPECT_FALSE(v.accepted);
  EXPECT_NE(v.detail.find("1 of 3"), std::string::npos) << v.detail;
  // Half is not a majority.
  w = {hash_witness(1, 8, bad), hash_witness(2, 8, good), hash_witness(3, 8, bad),
       hash_witness(4, 8, good)};
  EXPECT_FALSE(judge_state(diloco(8, bad), w).accepted);
  // Nobody but the donor reports the round while another member holds a state (of another
  // round): refused. When no other member that answers holds a state (a swarm of two, a
  // bootstrap node and its first joiners), the donor's word is all there is.
  w = {hash_witness(1, 8, good), hash_witness(2, 6, digest(4)), {node(3), std::nullopt, "gone"}};
  v = judge_state(diloco(8, good), w);
  EXPECT_FALSE(v.accepted);
  EXPECT_NE(v.detail.find("no member but its donor"), std::string::npos) << v.detail;
  EXPECT_NE(v.detail.find("gone"), std::string::npos) << v.detail;
  w = {hash_witness(1, 8, good), hash_witness(2, 8, Digest{}), {node(3), std::nullopt, "gone"}};
  v = judge_state(diloco(8, good), w);
  EXPECT_TRUE(v.accepted) << v.detail;
  EXPECT_NE(v.detail.find("holds no state"), std::string::npos) << v.detail;
  // Only the donor holds the round (it ended rounds alone; the others catch up from it): its
  // values must lie near the other members'.
  const std::size_t n = 5000;
  const std::uint64_t seed = 99;
  const auto ahead = weights(n, 1, 0.01f), close = weights(n, 2, 0.01f);
  std::vector<float> far = ahead;
  for (auto& x : far) x = -3 * x + 1;
  w = {hash_witness(1, 9, good), sample_witness(2, close, seed), sample_witness(3, close, seed)};
  auto lone = diloco(9, good);
  lone.phi = ahead;
  lone.seed = seed;
  v = judge_state(lone, w);
  EXPECT_TRUE(v.accepted) << v.detail;
  EXPECT_NE(v.detail.find("no member but its donor"), std::string::npos) << v.detail;
  lone.phi = far;
  v = judge_state(lone, w);
  EXPECT_FALSE(v.accepted) << v.detail;
  EXPECT_NE(v.detail.find("from the median of 2 other members"), std::string::npos) << v.detail;
  // A donor that reports another hash than the state it served.
  w = {hash_witness(1, 8, bad), hash_witness(2, 8, good), hash_witness(3, 8, good)};
  v = judge_state(diloco(8, good), w);
  EXPECT_FALSE(v.accepted);
  EXPECT_NE(v.detail.find("reports another hash"), std::string::npos) << v.detail;
}

TEST(StateCheck, ANoLoCoStateMustLieNearTheOtherMembers) {
  const std::size_t n = 20'000;
  const std::uint64_t seed = 1234;
  // Honest members: the same model, a little apart (their pairs average them together).
  std::vector<std::vector<float>> member;
  for (int i = 0; i < 4; ++i) member.push_back(weights(n, 10 + i, 0.02f));
  std::vector<Witness> w;
  for (int i = 2; i < 5; ++i) w.push_back(sample_witness(i, member[i - 2], seed));
  const auto judge = [&](const std::vector<float>& phi, std::vector<Witness> ws = {}) {
    StateToJudge s;
    s.donor = node(1);
    s.round = 9;
    s.hash = weights_hash(phi);
    s.phi = phi;
    s.seed = seed;
    return judge_state(s, ws.empty() ? w : ws);
  };
  auto v = judge(member[3]);
  EXPECT_TRUE(v.accepted) << v.detail;
  // Weights the swarm never had: random, zeroed, rescaled, another model's, NaN-free but huge.
  std::vector<float> random(n);
  std::mt19937 rng(99);
  std::normal_distribution<float> g(0, 0.7f);
  for (auto& x : random) x = g(rng);
  std::vector<float> zero(n, 0.0f), scaled = member[3], shifted = member[3];
  for (auto& x : scaled) x *= 3;
  for (auto& x : shifted) x += 1.0f;
  for (const auto* bad : {&random, &zero, &scaled, &shifted}) {
    v = judge(*bad);
    EXPECT_FALSE(v.accepted) << v.detail;
    EXPECT_NE(v.detail.find("from the median of 3 other members"), std::string::npos) << v.detail;
  }
  // A member that holds a state of our size but sent no samples cannot vouch for it: refused.
  // Members that did not answer, hold no state, or one of another size do not count: with none
  // else, the donor's state is taken.
  ProbeAnswer hash_only;
  hash_only.round = 9;
  hash_only.hash = digest(3);
  EXPECT_FALSE(judge(member[3], {{node(2), hash_only, {}}}).accepted);
  EXPECT_TRUE(judge(member[3], {{node(2), std::nullopt, "timed out"}}).accepted);
  EXPECT_TRUE(judge(member[3], {{node(2), ProbeAnswer{}, {}}}).accepted);
  std::vector<float> other_size = weights(n + 1, 3);
  const auto v2 = judge(member[3], {sample_witness(2, other_size, seed)});
  EXPECT_TRUE(v2.accepted) << v2.detail;
  EXPECT_NE(v2.detail.find("no samples of a state of our size"), std::string::npos) << v2.detail;
}

}  // namespace
}  // namespace grove::gossip
