// Matchmaking through a simulated DHT swarm: consistent groups, random partners, odd nodes in
// threes, no waiting for slow nodes, no stale partners.
#include "gossip/matchmaking.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <msgpack.hpp>
#include <optional>
#include <set>

#include "tests/dht/swarm_util.hpp"
#include "tests/gossip/fake_store.hpp"

namespace grove::gossip {
namespace {

using dht::test::grow;
using dht::test::sim_options;
using sim::DhtNetwork;
using sim::LinkModel;

NodeId id_n(int i) {
  NodeId id{};
  id[0] = static_cast<std::uint8_t>(i);
  id[1] = static_cast<std::uint8_t>(i >> 8);
  return id;
}

TEST(Matchmaking, GroupsArePairsPlusOneTrioAndChangeEveryWindow) {
  for (int n : {1, 2, 3, 7, 10}) {
    std::vector<NodeId> ids;
    for (int i = 0; i < n; ++i) ids.push_back(id_n(i));
    const auto g = make_groups("run", 5, ids);
    std::set<NodeId> seen;
    std::size_t trios = 0;
    for (const auto& grp : g) {
      EXPECT_TRUE(grp.size() == 2 || grp.size() == 3 || n == 1);
      trios += grp.size() == 3;
      for (const auto& id : grp) EXPECT_TRUE(seen.insert(id).second);
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
    EXPECT_EQ(trios, n > 1 && n % 2 ? 1u : 0u);
    auto shuffled = ids;
    std::reverse(shuffled.begin(), shuffled.end());
    EXPECT_EQ(make_groups("run", 5, shuffled), g);  // input order does not matter
  }
  std::vector<NodeId> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(id_n(i));
  std::set<std::vector<std::vector<NodeId>>> distinct;
  for (std::uint64_t w = 0; w < 10; ++w) distinct.insert(make_groups("run", w, ids));
  EXPECT_GE(distinct.size(), 9u);
  EXPECT_NE(make_groups("run", 1, ids), make_groups("other-run", 1, ids));
  EXPECT_EQ(group_op("run", 1, {id_n(1), id_n(2)}), group_op("run", 1, {id_n(2), id_n(1)}));
  EXPECT_NE(group_op("run", 1, {id_n(1), id_n(2)}), group_op("run", 2, {id_n(1), id_n(2)}));
}

TEST(Matchmaking, DiLoCoGroupsTakeEveryoneOrBoundedGroups) {
  std::vector<NodeId> ids;
  for (int i = 0; i < 11; ++i) ids.push_back(id_n(i));
  const auto all = make_groups("run", 3, ids, 0);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].size(), 11u);
  for (std::size_t k : {4u, 5u, 8u}) {
    const auto g = make_groups("run", 3, ids, k);
    std::size_t total = 0;
    for (const auto& grp : g) {
      total += grp.size();
      EXPECT_GE(grp.size(), 2u);
      EXPECT_LE(grp.size(), k + (k + 1) / 2) << "k " << k;
    }
    EXPECT_EQ(total, 11u);
  }
  EXPECT_EQ(make_groups("run", 3, {id_n(1)}, 0).size(), 1u);
  EXPECT_TRUE(make_groups("run", 3, {}, 0).empty());
}

// A reader that missed one ready record of a large window must still agree with the others on
// nearly every pair: with one hash order over everyone, every pair after the missing member
// would shift (about half of them on average).
TEST(Matchmaking, OneMissingRecordChangesOnlyItsRun) {
  for (const std::size_t n : {16u, 100u, 1000u, 4000u}) {
    std::vector<NodeId> ids;
    for (std::size_t i = 0; i < n; ++i) ids.push_back(id_n(static_cast<int>(i + 1)));
    const auto all = make_groups("run-b", 77, ids, 2);
    std::map<NodeId, std::vector<NodeId>> group_of;
    std::size_t members = 0;
    for (const auto& g : all) {
      EXPECT_TRUE(g.size() == 2 || g.size() == 3) << g.size();
      members += g.size();
      for (const auto& id : g) group_of[id] = g;
    }
    EXPECT_EQ(members, n);
    std::size_t worst = 0;
    for (std::size_t miss = 0; miss < n; miss += n / 8) {
      auto fewer = ids;
      fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(miss));
      std::size_t changed = 0;
      for (const auto& g : make_groups("run-b", 77, fewer, 2))
        for (const auto& id : g) changed += group_of[id] != g;
      worst = std::max(worst, changed);
    }
    std::printf("n = %zu: at most %zu members change groups when one record is missing\n", n,
                worst);
    if (n >= 1000) {
      EXPECT_LE(worst, 40u);  // its run (8 members on average), or two runs merged
    }
  }
}

TEST(Matchmaking, ReadyRecordRoundTripsAndRejectsTruncation) {
  ReadyInfo r{{}, {"10.0.0.1:4000"}, "run-x", 42, 1234567, true, true, {}};
  r.phi_hash[0] = 7;
  r.phi_hash[31] = 9;
  auto d = decode_ready(encode_ready(r));
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, r);
  const auto bytes = encode_ready(r);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_ready(std::span(bytes).first(n)));
  // One shape only: a record without its last fields is refused, and says which.
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(7);
  pk.pack_uint8(1);
  pk.pack(r.addresses);
  pk.pack(r.run_id);
  pk.pack(r.round);
  pk.pack(r.window);
  pk.pack(r.group);
  pk.pack(r.average_phi);
  auto old = decode_ready(std::span(reinterpret_cast<const std::uint8_t*>(sb.data()), sb.size()));
  ASSERT_FALSE(old);
  EXPECT_EQ(old.why(), "ready record: expected a list of 12 elements");
}

TEST(Matchmaking, ReadyRecordCarriesTheGroupsDecisionsAndRejectsBadFlags) {
  for (const bool behind : {false, true})
    for (const bool fresh : {false, true}) {
      ReadyInfo r{{}, {"10.0.0.1:4000"}, "run-x", 7, 99, true, false, {}, 12, behind, fresh};
      auto d = decode_ready(encode_ready(r));
      ASSERT_TRUE(d);
      EXPECT_EQ(*d, r);
    }
  // The last field, ‖Δ‖: 0 = 1.5, 1 = nil (none declared), 2 = -1, 3 = a string.
  auto pack = [](std::uint64_t wait_for, bool flag_as_int, int norm = 0) {
    msgpack::sbuffer sb;
    msgpack::packer<msgpack::sbuffer> pk(sb);
    pk.pack_array(12);
    pk.pack_uint8(2);
    pk.pack(std::vector<std::string>{"a:1"});
    pk.pack(std::string("run-x"));
    pk.pack(std::uint64_t{3});
    pk.pack(std::uint64_t{4});
    pk.pack(true);
    pk.pack(false);
    const std::array<char, 32> hash{};
    pk.pack_bin(32);
    pk.pack_bin_body(hash.data(), 32);
    pk.pack(wait_for);
    if (flag_as_int)
      pk.pack(1);
    else
      pk.pack(true);
    pk.pack(false);
    if (norm == 0) pk.pack_double(1.5);
    if (norm == 1) pk.pack_nil();
    if (norm == 2) pk.pack_double(-1.0);
    if (norm == 3) pk.pack(std::string("1.5"));
    return std::vector<std::uint8_t>(sb.data(), sb.data() + sb.size());
  };
  auto ok = decode_ready(pack(5, false));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->wait_for, 5u);
  EXPECT_TRUE(ok->behind);
  EXPECT_FALSE(ok->fresh);
  EXPECT_EQ(ok->delta_norm, 1.5);
  auto none = decode_ready(pack(5, false, 1));
  ASSERT_TRUE(none);
  EXPECT_TRUE(std::isnan(none->delta_norm));
  EXPECT_EQ(decode_ready(pack(5, false, 2)).why(), "ready record field delta_norm: out of range");
  EXPECT_EQ(decode_ready(pack(5, false, 3)).why(), "ready record field delta_norm: not a number");
  // A declared norm and none both round-trip.
  for (const double x : {0.0, 2.75, std::numeric_limits<double>::quiet_NaN()}) {
    ReadyInfo r{{}, {"10.0.0.1:4000"}, "run-x", 7, 99, true, false, {}, 1, false, false, x};
    auto d = decode_ready(encode_ready(r));
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, r);
  }
  EXPECT_EQ(decode_ready(pack(5, true)).why(), "ready record field behind: not a boolean");
  EXPECT_EQ(decode_ready(pack(std::uint64_t{1} << 33, false)).why(),  // beyond 32 bits
            "ready record field wait_for: out of range");
}

// One DiLoCo window (round 4) of `n` members over an 8-node DHT: member i declares itself ready
// through `ready(i, its matchmaker, where its result goes)`; returns the members' ids and results.
using ReadyFn =
    std::function<void(std::size_t, Matchmaker&, DhtNetwork&, std::function<void(MatchResult)>)>;
struct Window {
  std::vector<NodeId> ids;
  std::vector<MatchResult> got;
};
Window diloco_window(std::uint64_t seed, std::size_t n, const ReadyFn& ready) {
  DhtNetwork net{seed, LinkModel{Time(30), Time(10), 0.0}, sim_options()};
  std::mt19937_64 rng{3};
  grow(net, 8, rng, 2);
  net.run_for(Time(5000));
  MatchOptions mo;
  mo.group_size = 0;
  mo.same_round = true;
  std::vector<std::unique_ptr<Matchmaker>> mm;
  std::vector<std::optional<MatchResult>> got(n);
  for (std::size_t i = 0; i < n; ++i) {
    mm.push_back(std::make_unique<Matchmaker>(net.node(i), "run-d", mo));
    net.call(i, [&](dht::DhtNode&) {
      ready(i, *mm[i], net, [&got, i](MatchResult r) { got[i] = std::move(r); });
    });
  }
  EXPECT_TRUE(net.run_until(
      [&] {
        for (std::size_t i = 0; i < n; ++i)
          net.call(i, [&](dht::DhtNode&) { mm[i]->on_timer(net.now()); });
        return std::all_of(got.begin(), got.end(), [](const auto& g) { return g.has_value(); });
      },
      Time(60'000)));
  Window w;
  for (std::size_t i = 0; i < n; ++i) {
    w.ids.push_back(net.node(i).id());
    w.got.push_back(got[i].value_or(MatchResult{}));
  }
  return w;
}

// DiLoCo members decide together from the records they all read: one record asking to wait
// for more members, one saying the swarm is past this round, or all saying "joined into this
// round" is seen alike by every member of the group.
TEST(Matchmaking, DiLoCoGroupDecisionsComeFromTheRecords) {
  struct Case {
    std::vector<std::uint32_t> wait_for;
    std::vector<bool> behind, fresh;
    std::size_t want_wait;
    bool want_behind, want_fresh;
  };
  const std::vector<Case> cases = {
      {{3, 3, 3}, {false, false, false}, {false, false, false}, 3, false, false},
      {{3, 5, 0}, {false, false, false}, {false, false, false}, 5, false, false},
      {{0, 0, 0}, {false, true, false}, {false, false, false}, 0, true, false},
      {{0, 0, 0}, {false, false, false}, {true, true, true}, 0, false, true},
      {{0, 0, 0}, {false, false, false}, {true, false, true}, 0, false, false},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const auto& k = cases[c];
    const auto got = diloco_window(41 + c, 3,
                                   [&](std::size_t i, Matchmaker& m, DhtNetwork& net,
                                       std::function<void(MatchResult)> done) {
                                     m.ready(4, {net.address(i)}, net.now(), std::move(done), false,
                                             {}, k.wait_for[i], k.behind[i], k.fresh[i]);
                                   })
                         .got;
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(got[i].group.size(), 3u);
      EXPECT_EQ(got[i].wait_for, cases[c].want_wait);
      EXPECT_EQ(got[i].behind, cases[c].want_behind);
      EXPECT_EQ(got[i].all_fresh, cases[c].want_fresh);
    }
  }
}

// DiLoCo: a member's ‖Δ‖ counts up to 1.5× the median of its group's declared norms (the upper
// middle of an even count, so that one small norm in a pair or a trio cannot pull it down); a
// member that declares none among members that do is left out; nobody is judged when nobody
// declares one.
TEST(Matchmaking, NormClipIsOneAndAHalfTimesTheGroupsMedianAndUndeclaredNormsAreLeftOut) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_DOUBLE_EQ(norm_clip({1.0, 1.3, 0.7, 40.0}), kMaxNormToMedian * 1.3);
  EXPECT_DOUBLE_EQ(norm_clip({6.6, 51.0, 64.0}),
                   kMaxNormToMedian * 51.0);  // non-IID members stay unclipped
  EXPECT_DOUBLE_EQ(norm_clip({1.0, 4.5}), kMaxNormToMedian * 4.5);
  EXPECT_DOUBLE_EQ(norm_clip({2.0, nan, 1.0, 3.0}), kMaxNormToMedian * 2.0);
  // Two attackers of five cannot move the median.
  EXPECT_DOUBLE_EQ(norm_clip({1.0, 1.1, 0.9, 5e3, 6e3}), kMaxNormToMedian * 1.1);
  EXPECT_TRUE(std::isnan(norm_clip({nan, nan})));
  EXPECT_TRUE(std::isnan(norm_clip({})));

  const auto id = [](std::uint8_t b) {
    NodeId x{};
    x[0] = b;
    return x;
  };
  using V = std::vector<std::pair<NodeId, double>>;
  auto out = undeclared_norms(V{{id(1), 1.0}, {id(2), nan}, {id(3), 1.2}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out.begin()->first, id(2));
  EXPECT_NE(out.begin()->second.find("declared no pseudo-gradient norm while 2"),
            std::string::npos);
  EXPECT_TRUE(undeclared_norms(V{{id(1), nan}, {id(2), nan}}).empty());
  EXPECT_TRUE(undeclared_norms(V{{id(1), 1.0}, {id(2), 9e9}}).empty());
}

// The rule through the records: every member reads the same norms, leaves out the same member
// that declared none, and its group carries the declared norms and the same clip.
TEST(Matchmaking, DiLoCoGroupsCarryTheDeclaredNormsAndLeaveOutAnUndeclaredOne) {
  const std::vector<double> norms = {1.0, 1.2, 30.0, std::numeric_limits<double>::quiet_NaN()};
  const auto w = diloco_window(
      57, norms.size(),
      [&](std::size_t i, Matchmaker& m, DhtNetwork& net, std::function<void(MatchResult)> done) {
        m.ready(4, {net.address(i)}, net.now(), std::move(done), false, {}, 4, false, false,
                norms[i]);
      });
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(w.got[i].norm_excluded);
    EXPECT_EQ(w.got[i].group.size(), 3u);
    EXPECT_EQ(w.got[i].wait_for, 3u);  // the records' 4, net of the member left out
    ASSERT_EQ(w.got[i].delta_norms.size(), 3u);
    for (std::size_t j = 0; j < 3; ++j) EXPECT_EQ(w.got[i].delta_norms.at(w.ids[j]), norms[j]);
    EXPECT_DOUBLE_EQ(w.got[i].clip_norm, kMaxNormToMedian * 1.2);
    ASSERT_EQ(w.got[i].left_out.size(), 1u);
    EXPECT_EQ(w.got[i].left_out[0], w.ids[3]);
  }
  EXPECT_TRUE(w.got[3].norm_excluded);
  EXPECT_EQ(w.got[3].group.size(), 1u);
  EXPECT_NE(w.got[3].note.find("declared no pseudo-gradient norm"), std::string::npos)
      << w.got[3].note;
}

// Trainers on a simulated swarm: each computes for its own round time, then matchmakes, then
// starts the next round as soon as it has its group (the exchange itself is not simulated here).
struct Trainers {
  DhtNetwork net{31, LinkModel{Time(30), Time(10), 0.0}, sim_options()};
  std::mt19937_64 rng{5};
  MatchOptions mo;
  std::vector<std::unique_ptr<Matchmaker>> mm;
  std::vector<Time> round_time, next_ready;
  std::mt19937 jitter{11};  // compute time varies by +-10% from round to round
  std::vector<std::uint64_t> rounds;
  struct Outcome {
    std::size_t node;
    Time ready, got;
    MatchResult r;
  };
  std::vector<Outcome> outcomes;
  std::vector<Time> ready_at;
  std::vector<std::size_t> swarm_size;  ///< what each member's view says (sets its buckets)

  Trainers(std::size_t dht_nodes, std::vector<Time> per_round,
           const std::function<void(MatchOptions&)>& tune = {})
      : round_time(per_round) {
    mo.window = Time(5000);
    mo.min_lead = Time(1000);
    mo.settle = Time(1500);
    mo.read_timeout = Time(5000);
    mo.patience = Time(30'000);  // about one round of the fast nodes
    if (tune) tune(mo);
    grow(net, dht_nodes, rng, 2);
    net.run_for(Time(5000));
    for (std::size_t i = 0; i < per_round.size(); ++i) {
      mm.push_back(std::make_unique<Matchmaker>(net.node(i), "run-m", mo));
      next_ready.push_back(net.now() + per_round[i]);
      rounds.push_back(0);
      ready_at.push_back(Time::max());
      swarm_size.push_back(per_round.size());
    }
  }
  void run(Time d) {
    const Time end = net.now() + d;
    while (net.now() < end) {
      net.run_for(Time(100));
      for (std::size_t i = 0; i < mm.size(); ++i) {
        if (!net.alive(i)) continue;
        if (!mm[i]->busy() && net.now() >= next_ready[i]) {
          ready_at[i] = net.now();
          mm[i]->set_swarm_size(swarm_size[i]);
          net.call(i, [&](dht::DhtNode&) {
            mm[i]->ready(rounds[i], {net.address(i)}, net.now(), [this, i](MatchResult r) {
              outcomes.push_back({i, ready_at[i], net.now(), r});
              ++rounds[i];
              const auto base = round_time[i].count();
              next_ready[i] =
                  net.now() +
                  Time(base * 9 / 10 + static_cast<std::int64_t>(jitter() % (base / 5 + 1)));
            });
          });
        }
        net.call(i, [&](dht::DhtNode&) { mm[i]->on_timer(net.now()); });
      }
    }
  }
  NodeId id(std::size_t i) { return net.node(i).id(); }
  /// Every member's group (sorted) per window, to check that the members of a group agree.
  std::map<std::pair<std::uint64_t, NodeId>, std::vector<NodeId>> groups() {
    std::map<std::pair<std::uint64_t, NodeId>, std::vector<NodeId>> by;
    for (const auto& o : outcomes) {
      auto g = o.r.group;
      std::sort(g.begin(), g.end());
      by[{o.r.window, id(o.node)}] = g;
    }
    return by;
  }
};

TEST(Matchmaking, SwarmPairsConsistentlyAndASlowNodeNeverStallsTheOthers) {
  // Six nodes at 20 s a round, one 3x slower at 60 s, on a 24-node DHT.
  std::vector<Time> per(6, Time(20'000));
  per.push_back(Time(60'000));
  Trainers t(24, per);
  t.run(Time(400'000));
  // Both sides of every group agree (same window, same group).
  const auto by = t.groups();
  std::size_t paired = 0, slow_rounds = 0, slow_paired = 0;
  std::map<std::size_t, std::set<NodeId>> partners;
  // Ready to group: the first window, plus the patience windows, plus the settle and the read.
  const Time bound = t.mo.min_lead + t.mo.window + t.mo.patience + t.mo.settle + t.mo.read_timeout;
  for (const auto& o : t.outcomes) {
    auto g = o.r.group;
    std::sort(g.begin(), g.end());
    for (const auto& member : g) {
      auto it = by.find({o.r.window, member});
      ASSERT_NE(it, by.end()) << "a partner never got a result for this window";
      EXPECT_EQ(it->second, g) << "members of a group disagree";
      if (member != t.id(o.node)) partners[o.node].insert(member);
    }
    paired += g.size() > 1;
    EXPECT_LE(o.got - o.ready, bound) << "node " << o.node << " waited too long";
    if (o.node < 6) {  // the fast nodes never wait for the slow one: one window at most
      EXPECT_LE(o.got - o.ready, t.mo.min_lead + t.mo.window + t.mo.settle + t.mo.read_timeout);
    }
    if (o.node == 6) {
      ++slow_rounds;
      slow_paired += g.size() > 1;
    }
  }
  // The fast nodes keep their pace: 400 s / (20 s + matchmaking) rounds each.
  for (std::size_t i = 0; i < 6; ++i) EXPECT_GE(t.rounds[i], 12u) << "node " << i;
  EXPECT_GE(slow_rounds, 5u);
  EXPECT_GE(slow_paired + 1, slow_rounds) << "the slow node should average regularly";
  EXPECT_GE(paired * 10, t.outcomes.size() * 8);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_GE(partners[i].size(), 3u) << "node " << i;
  Time worst{0};
  for (const auto& o : t.outcomes)
    if (o.node < 6) worst = std::max(worst, o.got - o.ready);
  std::printf(
      "matchmaking: %zu results, %zu paired; slow node paired %zu of %zu rounds; fast "
      "nodes' longest wait %lld ms; fast rounds %llu..%llu\n",
      t.outcomes.size(), paired, slow_paired, slow_rounds, static_cast<long long>(worst.count()),
      static_cast<unsigned long long>(*std::min_element(t.rounds.begin(), t.rounds.end() - 1)),
      static_cast<unsigned long long>(*std::max_element(t.rounds.begin(), t.rounds.end() - 1)));
}

TEST(Matchmaking, BucketsFollowTheSwarmSizeAndChangeEveryWindow) {
  MatchOptions o;  // pairs, 64 members per bucket
  EXPECT_EQ(bucket_count(0, o), 1u);
  EXPECT_EQ(bucket_count(127, o), 1u);
  EXPECT_EQ(bucket_count(128, o), 2u);
  EXPECT_EQ(bucket_count(1023, o), 8u);
  EXPECT_EQ(bucket_count(1024, o), 16u);
  MatchOptions all = o;
  all.group_size = 0;  // DiLoCo's one group of everyone is never split
  EXPECT_EQ(bucket_count(4096, all), 1u);
  MatchOptions rounds = o;
  rounds.same_round = true;
  EXPECT_EQ(bucket_count(4096, rounds), 1u);
  MatchOptions off = o;
  off.bucket_members = 0;
  EXPECT_EQ(bucket_count(4096, off), 1u);
  // One bucket is the key older nodes use; buckets have keys of their own.
  EXPECT_EQ(ready_key("r", 7), dht::key_of("grove/run/r/ready/7"));
  EXPECT_EQ(ready_key("r", 7, 0, 1), ready_key("r", 7));
  EXPECT_NE(ready_key("r", 7, 0, 2), ready_key("r", 7));
  EXPECT_NE(ready_key("r", 7, 0, 2), ready_key("r", 7, 1, 2));
  EXPECT_NE(ready_key("r", 7, 1, 2), ready_key("r", 7, 1, 4));
  // 1024 members over 16 buckets: about 64 each, and a member's bucket changes with the window.
  std::vector<std::size_t> per(16);
  std::size_t moved = 0;
  for (int i = 0; i < 1024; ++i) {
    const auto b = bucket_of("r", 7, id_n(i), 16);
    ASSERT_LT(b, 16u);
    ++per[b];
    moved += b != bucket_of("r", 8, id_n(i), 16);
    EXPECT_EQ(bucket_of("r", 7, id_n(i), 1), 0u);
  }
  for (std::size_t b = 0; b < 16; ++b) {
    EXPECT_GE(per[b], 36u) << "bucket " << b;
    EXPECT_LE(per[b], 92u) << "bucket " << b;
  }
  EXPECT_GE(moved, 900u);  // 15 in 16 expected
}

TEST(Matchmaking, BucketedMembersPairWithinTheirBucketAndDisagreeingViewsStayConsistent) {
  // Sixteen members, 4 per bucket: four buckets a window. Two members' views are short (8
  // members: two buckets) and write and read other keys than the rest.
  Trainers t(32, std::vector<Time>(16, Time(10'000)),
             [](MatchOptions& o) { o.bucket_members = 4; });
  t.swarm_size[3] = t.swarm_size[9] = 8;
  t.run(Time(200'000));
  const auto by = t.groups();
  std::size_t paired = 0, four = 0;
  for (const auto& o : t.outcomes) {
    const std::size_t b = o.node == 3 || o.node == 9 ? 2 : 4;
    EXPECT_EQ(o.r.buckets, b);
    auto g = o.r.group;
    std::sort(g.begin(), g.end());
    paired += g.size() > 1;
    four += b == 4;
    for (const auto& member : g) {
      EXPECT_EQ(bucket_of("run-m", o.r.window, member, b),
                bucket_of("run-m", o.r.window, t.id(o.node), b))
          << "a partner from another bucket";
      auto it = by.find({o.r.window, member});
      ASSERT_NE(it, by.end()) << "a partner never got a result for this window";
      EXPECT_EQ(it->second, g) << "members of a group disagree";
    }
  }
  std::printf("buckets: %zu results (%zu in four buckets), %zu paired\n", t.outcomes.size(), four,
              paired);
  EXPECT_GE(four, 14u * 10);  // 200 s at 10 s a round plus matchmaking
  // Members alone in their bucket try the next window (another bucket): most rounds average.
  EXPECT_GE(paired * 10, t.outcomes.size() * 7)
      << paired << " of " << t.outcomes.size() << " rounds paired";
}

TEST(Matchmaking, NeverPairsWithAMemberOutsideTheLiveView) {
  std::vector<Time> per(4, Time(10'000));
  Trainers t(16, per);
  const NodeId stale = t.id(3);  // its ready records exist, but the view has dropped it
  for (std::size_t i = 0; i < 3; ++i)
    t.mm[i]->set_live_filter([stale](const NodeId& id) { return id != stale; });
  t.run(Time(120'000));
  std::size_t checked = 0;
  for (const auto& o : t.outcomes) {
    if (o.node == 3) continue;
    ++checked;
    EXPECT_EQ(std::count(o.r.group.begin(), o.r.group.end(), stale), 0);
  }
  EXPECT_GE(checked, 15u);
}

TEST(Matchmaking, AloneInAWindowMeansALocalOnlyRound) {
  Trainers t(8, {Time(10'000)});
  t.run(Time(60'000));  // ready at 10 s, first read at 17.5 s, patience 30 s past it
  ASSERT_FALSE(t.outcomes.empty());
  for (const auto& o : t.outcomes) {
    EXPECT_EQ(o.r.group.size(), 1u);
    EXPECT_EQ(o.r.note, "nobody else was ready in this window");
  }
}

// A node left alone while another member is still in a round of its own (its record says it is
// averaging: mid-exchange of a large model over a slow line) keeps trying later windows while
// that lasts and a patience after it, and pairs with that member once it is ready; nobody busy,
// it goes alone after its patience; a member busy for ever is waited for busy_cap at most.
TEST(Matchmaking, AloneWhileAnotherMemberAveragesWaitsForItsNextRound) {
  MatchOptions o;
  o.window = Time(2000);
  o.min_lead = Time(500);
  o.settle = Time(300);
  o.read_timeout = Time(4000);
  o.patience = Time(4000);
  o.busy_cap = Time(40'000);
  struct Outcome {
    std::size_t group = 0;
    Time at{0};
  };
  // `busy_until`: the other member averages until then (its status), and is ready 1 s later (an
  // inner phase shorter than the patience).
  auto run = [&](std::optional<Time> busy_until, bool partner, bool probe) {
    auto board = std::make_shared<test::Board>();
    test::FakeStore sa(board), sb(board);
    Matchmaker a(sa, "run-busy", o), b(sb, "run-busy", o);
    if (probe) a.set_busy_probe([&](Time now) { return !busy_until || now < *busy_until; });
    std::optional<Outcome> got;
    a.ready(0, {"a"}, Time(1000), [&](MatchResult r) { got = Outcome{r.group.size(), sa.now()}; });
    bool b_ready = false;
    const Time b_at = busy_until.value_or(Time(0)) + Time(1000);
    for (Time t(1000); t <= Time(200'000) && !got; t += Time(100)) {
      if (partner && !b_ready && t >= b_at) {
        b.ready(0, {"b"}, t, [](MatchResult) {});
        b_ready = true;
      }
      for (auto* s : {&sa, &sb}) s->deliver(t);
      a.on_timer(t);
      if (b_ready) b.on_timer(t);
      for (auto* s : {&sa, &sb}) s->deliver(t);
    }
    EXPECT_TRUE(got.has_value());
    return got.value_or(Outcome{});
  };
  const Time first_read(2000 + 300);  // ready at 1 s with a 0.5 s lead: the window closing at 2 s
  // The other member ends a 20 s exchange and is ready 1 s later: waited for, and paired.
  const Outcome waited = run(Time(20'000), true, true);
  EXPECT_EQ(waited.group, 2u);
  // Without the probe (the rule before): alone after its patience, long before the other is back.
  const Outcome before = run(Time(20'000), true, false);
  EXPECT_EQ(before.group, 1u);
  EXPECT_LE(before.at, first_read + o.patience + o.window);
  // Nobody busy: alone after its patience, as before.
  const Outcome idle = run(Time(0), false, true);
  EXPECT_EQ(idle.group, 1u);
  EXPECT_LE(idle.at, first_read + o.patience + o.window);
  // Busy for ever: given up on once busy_cap has passed since the first read (and a patience).
  const Outcome capped = run(std::nullopt, false, true);
  EXPECT_EQ(capped.group, 1u);
  EXPECT_GE(capped.at, first_read + o.busy_cap);
  EXPECT_LE(capped.at, first_read + o.busy_cap + o.patience + 2 * o.window);
}

// A member whose ready writes take longer than min_lead (a far or loaded path to the key's
// holders) writes for a later window once it has measured that, so that its record is stored
// before the window closes and every reader sees it.
TEST(Matchmaking, LeadFollowsTheMeasuredWriteTime) {
  auto board = std::make_shared<test::Board>();
  test::FakeStore slow(board), fast(board);
  MatchOptions o;
  o.window = Time(2000);
  o.min_lead = Time(500);
  o.settle = Time(300);
  o.read_timeout = Time(4000);
  o.patience = Time(0);
  Matchmaker ms(slow, "run-l", o), mf(fast, "run-l", o);
  EXPECT_EQ(ms.lead(), o.min_lead);
  const Time write_time(1200);  // the slow member's writes are stored this long after the call
  std::vector<MatchResult> got;
  auto round = [&](std::uint64_t n, Time t) {
    got.clear();
    for (auto* m : {&ms, &mf})
      m->ready(n, {"x"}, t, [&](MatchResult r) { got.push_back(std::move(r)); });
    fast.deliver(t);
    slow.deliver(t + write_time);  // only the slow member's write is due
    const Time read = std::max(*ms.next_deadline(), *mf.next_deadline());
    EXPECT_EQ(*ms.next_deadline(), *mf.next_deadline()) << "both read one window";
    ms.on_timer(read);
    mf.on_timer(read);
    slow.deliver(read);
    fast.deliver(read);
    return read;
  };
  // Ready 600 ms before a close: min_lead alone picks that window, which closes before the slow
  // write is stored (the fake still lets both readers see it; a DHT's readers may not).
  Time read = round(0, Time(1400));
  EXPECT_EQ(read, Time(2000) + o.settle);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].write_late);   // the slow member's own result comes first
  EXPECT_FALSE(got[1].write_late);  // the fast one's
  for (std::uint64_t n = 1; n < 3; ++n) round(n, Time(1400 + 4000 * std::int64_t(n)));
  EXPECT_EQ(ms.lead(), write_time);
  EXPECT_EQ(mf.lead(), o.min_lead);  // each member measures its own writes
  // Now the slow member skips the window it could not make: the next closes 2.6 s after ready.
  got.clear();
  const Time t(13'400);
  ms.ready(3, {"x"}, t, [&](MatchResult r) { got.push_back(std::move(r)); });
  mf.ready(3, {"x"}, t, [&](MatchResult r) { got.push_back(std::move(r)); });
  EXPECT_EQ(*ms.next_deadline(), Time(16'000) + o.settle);
  EXPECT_EQ(*mf.next_deadline(), Time(14'000) + o.settle);
  // Patience (one window here) counts from the first window's read, not from ready(): the slow
  // member, whose lead puts its first window after the one a fast member ready 2.2 s later
  // makes, still waits for it (from ready() the patience was spent before its first read).
  ms.set_patience(o.window);
  mf.set_patience(o.window);
  got.clear();
  ms.ready(4, {"x"}, Time(21'400), [&](MatchResult r) { got.push_back(std::move(r)); });
  slow.deliver(Time(21'400) + write_time);
  ASSERT_EQ(*ms.next_deadline(), Time(24'000) + o.settle);
  mf.ready(4, {"x"}, Time(23'600), [&](MatchResult r) { got.push_back(std::move(r)); });
  fast.deliver(Time(23'600));
  ASSERT_EQ(*mf.next_deadline(), Time(26'000) + o.settle);
  ms.on_timer(Time(24'300));
  slow.deliver(Time(24'300));  // alone in its first window: it writes for the next one
  EXPECT_TRUE(got.empty());
  slow.deliver(Time(24'300) + write_time);
  EXPECT_EQ(*ms.next_deadline(), Time(26'000) + o.settle);
  ms.on_timer(Time(26'300));
  mf.on_timer(Time(26'300));
  slow.deliver(Time(26'300));
  fast.deliver(Time(26'300));
  ASSERT_EQ(got.size(), 2u);
  for (const auto& r : got) EXPECT_EQ(r.group.size(), 2u) << r.note;
  // A lead never passes max_lead, however slow the writes.
  MatchOptions capped = o;
  capped.max_lead = Time(1000);
  test::FakeStore s2(board);
  Matchmaker mc(s2, "run-l", capped);
  for (std::uint64_t n = 0; n < 3; ++n) {
    const Time at(40'000 + 4000 * std::int64_t(n));
    bool done = false;
    mc.ready(n, {"x"}, at, [&](MatchResult) { done = true; });
    s2.deliver(at + Time(3000));  // the write is stored 3 s after the call
    mc.on_timer(std::max(s2.now(), *mc.next_deadline()));
    s2.deliver(s2.now());
    EXPECT_TRUE(done);
  }
  EXPECT_EQ(mc.lead(), capped.max_lead);
}

}  // namespace
}  // namespace grove::gossip
