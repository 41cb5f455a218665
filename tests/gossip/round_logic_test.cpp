// The round engine's logic on an in-memory record store (tests/gossip/fake_store.hpp): no DHT
// swarm, no routing, no network model. The test is the engine's whole driver: it runs the
// operations' messages between the members directly, the outer steps and snapshots at once, and
// answers state requests from the donor's StateServer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "dht/membership.hpp"
#include "gossip/progress.hpp"
#include "gossip/round.hpp"
#include "tests/gossip/fake_store.hpp"

namespace grove::gossip {
namespace {

using std::chrono::milliseconds;
using Clock = milliseconds;
constexpr std::size_t kValues = 64;

RoundOptions options(OuterMode mode) {
  RoundOptions o;
  o.mode = mode;
  o.match.window = milliseconds(1000);
  o.match.min_lead = milliseconds(200);
  o.match.settle = milliseconds(200);
  o.match.read_timeout = milliseconds(2000);
  o.mode_poll = milliseconds(500);
  o.exchange.chunk_timeout = milliseconds(2000);
  o.allreduce.chunk_timeout = milliseconds(2000);
  o.allreduce.heartbeat = milliseconds(300);
  o.offers_wait = milliseconds(3000);
  o.threads = 1;
  return o;
}

dht::MembershipOptions membership_options() {
  dht::MembershipOptions m;
  m.poll_every = milliseconds(300);
  m.publish_every = milliseconds(500);
  m.ttl = milliseconds(3000);
  return m;
}

struct Member {
  Member(std::shared_ptr<test::Board> board, std::size_t index, const RoundOptions& opts)
      : store(std::move(board)),
        members(store, "logic", membership_options()),
        engine(store, members, "logic", {"m" + std::to_string(index)}, opts, server) {
    dht::MemberInfo self;
    self.run_id = "logic";
    self.addresses = {"m" + std::to_string(index)};
    self.status = "training";
    members.set_self(self);
  }
  test::FakeStore store;
  dht::Membership members;
  std::shared_ptr<StateServer> server = std::make_shared<StateServer>();
  RoundEngine engine;
  std::map<OpId, std::unique_ptr<Protocol>> ops;
  std::map<OpId, std::vector<std::pair<NodeId, Bytes>>> early;  // for ops not started here yet
  std::vector<RoundReport> reports;
  std::vector<std::size_t> retired;  // the sizes of the arrays the engine handed over to free
  std::size_t retired_ops = 0;       // the finished operations it handed over
};

struct Logic {
  std::shared_ptr<test::Board> board = std::make_shared<test::Board>();
  std::vector<std::unique_ptr<Member>> m;
  Clock now{1'000'000};
  std::uint32_t snapshot_chunk = 0;  ///< cut served states into chunks of this size (0: the job's)
  /// Return true to fail a state request instead of answering it.
  std::function<bool(const StateDownload::Request&)> fail_state;
  std::size_t state_requests = 0, manifest_requests = 0;
  std::set<std::size_t> mute;  ///< members whose operations are never started
  bool cut = false;            ///< every operation's messages are lost (a partition)

  explicit Logic(std::size_t n, OuterMode mode = OuterMode::noloco) : Logic(n, options(mode)) {}
  Logic(std::size_t n, const RoundOptions& opts) {
    for (std::size_t i = 0; i < n; ++i) m.push_back(std::make_unique<Member>(board, i, opts));
  }

  Member* by_id(const NodeId& id) {
    for (auto& x : m)
      if (x->store.id() == id) return x.get();
    return nullptr;
  }

  void tick() {
    now += milliseconds(10);
    for (std::size_t i = 0; i < m.size(); ++i) {
      Member& x = *m[i];
      x.store.deliver(now);
      x.members.on_timer(now);
      x.engine.on_timer(now);
      for (auto& op : x.engine.take_ops()) {
        if (mute.contains(i)) continue;  // its operation never runs
        auto& p = x.ops[op.op] = op.make(now);
        for (auto& [from, bytes] : x.early[op.op])
          p->on_message(from, *decode_message(bytes.span()), now);
        x.early.erase(op.op);
      }
      for (auto& job : x.engine.take_step_jobs()) {
        job.run();
        x.engine.on_step_done(job.seq, now);
      }
      for (auto& job : x.engine.take_snapshot_jobs())
        x.engine.on_snapshot(job.seq,
                             *StateSnapshot::of(job.run_id, job.round, job.blob,
                                                snapshot_chunk ? snapshot_chunk : job.chunk_bytes),
                             now);
      for (auto& req : x.engine.take_state_requests()) {
        // (Probes of the members that check a downloaded state are answered, not counted.)
        const auto chunk = decode_state_request(req.body);
        const std::size_t donor =
            req.address.size() > 1 ? std::stoul(req.address.substr(1)) : m.size();
        state_requests += static_cast<bool>(chunk);
        manifest_requests += chunk && !chunk->index;
        if (donor >= m.size() || (chunk && fail_state && fail_state(req)))
          x.engine.on_state_failure(req.id, now);
        else if (auto body = m[donor]->server->answer(req.body))
          x.engine.on_state_response(req.id, *body, now);
        else
          x.engine.on_state_failure(req.id, now);
      }
      for (auto& [op, p] : x.ops) {
        p->on_timer(now);
        for (auto& out : p->take_outgoing()) {
          Member* to = by_id(out.to);
          auto msg = decode_message(out.data.span());
          ASSERT_TRUE(msg);
          if (!to || cut) {
            p->on_peer_failed(out.to, now);
          } else if (auto it = to->ops.find(msg->h.op); it != to->ops.end()) {
            it->second->on_message(x.store.id(), *msg, now);
            p->on_delivered(out.to, now);
          } else {
            to->early[msg->h.op].emplace_back(x.store.id(), std::move(out.data));
            p->on_delivered(out.to, now);
          }
        }
      }
      for (auto it = x.ops.begin(); it != x.ops.end();) {
        if (!it->second->finished()) {
          ++it;
          continue;
        }
        x.engine.on_op_finished(std::move(it->second), now);
        it = x.ops.erase(it);
      }
      for (auto& r : x.engine.take_reports()) x.reports.push_back(std::move(r));
      auto retired = x.engine.take_retired();
      for (const auto& a : retired.arrays) x.retired.push_back(a.size());
      x.retired_ops += retired.ops.size();
    }
  }

  bool run_until(const std::function<bool()>& done, milliseconds limit) {
    const Clock end = now + limit;
    while (now < end) {
      if (done()) return true;
      tick();
    }
    return done();
  }

  void submit(std::size_t i, float value) {
    m[i]->engine.submit(std::vector<float>(kValues, value), now);
  }
};

optim::OuterState initial() {
  optim::OuterState s;
  s.phi.assign(kValues, 1.0f);
  return s;
}

// Every member starts; true once each sees all of them.
bool start_all(Logic& l) {
  for (auto& x : l.m) x->engine.start(initial(), l.now);
  return l.run_until(
      [&] {
        for (auto& x : l.m)
          if (x->members.size() != l.m.size()) return false;
        return true;
      },
      milliseconds(3000));
}

// Once every member is idle, member i submits θ = thetas[i]; true once each has reported one
// more round.
bool round_of_all(Logic& l, const std::vector<float>& thetas) {
  if (!l.run_until(
          [&] {
            for (auto& x : l.m)
              if (!x->engine.idle()) return false;
            return true;
          },
          milliseconds(20'000)))
    return false;
  std::vector<std::size_t> before;
  for (std::size_t i = 0; i < l.m.size(); ++i) {
    before.push_back(l.m[i]->reports.size());
    l.submit(i, thetas[i]);
  }
  return l.run_until(
      [&] {
        for (std::size_t i = 0; i < l.m.size(); ++i)
          if (l.m[i]->reports.size() <= before[i]) return false;
        return true;
      },
      milliseconds(20'000));
}

// Member 0 starts, knows it is alone (no patience) and ends one round on its own.
void first_round_alone(Logic& l, float theta) {
  l.m[0]->engine.start(initial(), l.now);
  l.m[0]->engine.set_patience(milliseconds(0));
  ASSERT_TRUE(l.run_until([&] { return l.m[0]->engine.idle(); }, milliseconds(1000)));
  l.submit(0, theta);
  ASSERT_TRUE(l.run_until([&] { return !l.m[0]->reports.empty(); }, milliseconds(10'000)));
}

TEST(RoundLogic, ALoneMemberStepsLocallyAndPublishesItsRoundAndOffer) {
  Logic l(1);
  ASSERT_NO_FATAL_FAILURE(first_round_alone(l, 0.5f));
  const RoundReport& r = l.m[0]->reports.front();
  EXPECT_EQ(r.kind, RoundReport::Kind::round);
  EXPECT_TRUE(r.local_only);
  EXPECT_EQ(l.m[0]->engine.state().round, 1u);
  // Alone, it keeps its inner phase as it is (no outer step on its own pseudo-gradient).
  for (float v : l.m[0]->engine.state().phi.to_vector()) ASSERT_EQ(v, 0.5f);
  // Its member record (via the membership on the same store) carries the new round and hash,
  // and its state offer names the round: both read back from the store.
  ASSERT_TRUE(l.run_until(
      [&] {
        const auto self = progress_of(l.m[0]->members.self());
        return self.round == 1 && self.weights_hash == r.weights_hash;
      },
      milliseconds(2000)));
  const auto offered = [&] {
    bool found = false;
    for (const auto& rec : l.board->at(state_key("logic"), l.now))
      if (auto o = decode_offer(rec.value)) found |= o->round == 1 && o->address == "m0";
    return found;
  };
  EXPECT_TRUE(offered());
  // No new round for longer than the offer's TTL (a large model's round over a slow line): the
  // offer is rewritten while its snapshot is served, so a joiner always finds one.
  l.run_until([] { return false; }, RoundOptions{}.offer_ttl * 3 / 2);
  EXPECT_TRUE(offered());
}

void two_members_average(OuterMode mode) {
  Logic l(2, mode);
  ASSERT_TRUE(start_all(l));
  for (std::size_t round = 0; round < 3; ++round) ASSERT_TRUE(round_of_all(l, {0.9f, 1.1f}));
  for (auto& x : l.m) {
    ASSERT_EQ(x->reports.size(), 3u);
    for (const auto& r : x->reports) {
      EXPECT_EQ(r.mode, mode);
      EXPECT_FALSE(r.local_only) << r.note;
      EXPECT_EQ(r.averaged_with.size(), 1u);
    }
  }
  const auto& a = l.m[0]->engine.state().phi;
  const auto& b = l.m[1]->engine.state().phi;
  if (mode == OuterMode::diloco) {
    EXPECT_EQ(a, b);  // one all-reduce result, one step: the same bits
  } else {
    // Gossip keeps each member's own φ, pulled toward its partner's: far closer than the inner
    // phases' θ (0.2 apart every round).
    EXPECT_NE(a, b);
    EXPECT_LT(std::abs(a[0] - b[0]), 0.01f);
  }
}

TEST(RoundLogic, TwoMembersPairAndAverageThroughTheStore) {
  two_members_average(OuterMode::noloco);
}

TEST(RoundLogic, TwoMembersAllReduceToTheSameSlowWeights) {
  two_members_average(OuterMode::diloco);
}

// A NoLoCo pair exchanges its proposals: the mean takes θ's place, and θ (model-sized) goes to
// the driver to free off its strand (at 500M freeing its pages held the DHT strand for 3.5 s).
TEST(RoundLogic, TheThetaAMeanReplacesIsHandedToTheDriverToFree) {
  auto o = options(OuterMode::noloco);
  o.noloco.nesterov = true;  // grove-node's rule (the node's default)
  Logic l(2, o);
  ASSERT_TRUE(start_all(l));
  for (std::size_t round = 0; round < 3; ++round) ASSERT_TRUE(round_of_all(l, {0.9f, 1.1f}));
  for (auto& x : l.m) {
    for (const auto& r : x->reports) ASSERT_FALSE(r.local_only) << r.note;
    EXPECT_EQ(std::count(x->retired.begin(), x->retired.end(), kValues), 3);
    EXPECT_EQ(x->retired_ops, 3u);
  }
}

// An exchange nobody completed leaves our proposal and momentum unused: the driver frees them.
TEST(RoundLogic, AnExchangeNobodyCompletedHandsItsTensorsToTheDriver) {
  auto o = options(OuterMode::noloco);
  o.noloco.nesterov = true;
  Logic l(2, o);
  ASSERT_TRUE(start_all(l));
  ASSERT_TRUE(l.run_until([&] { return l.m[0]->engine.idle() && l.m[1]->engine.idle(); },
                          milliseconds(20'000)));
  l.mute.insert(1);  // member 1 forms the group but never sends a byte
  l.submit(0, 0.9f);
  l.submit(1, 1.1f);
  ASSERT_TRUE(l.run_until([&] { return !l.m[0]->reports.empty(); }, milliseconds(60'000)));
  EXPECT_TRUE(l.m[0]->reports.front().local_only);
  const auto& got = l.m[0]->retired;
  EXPECT_EQ(std::count(got.begin(), got.end(), kValues), 2) << "the proposal and the momentum";
  EXPECT_EQ(l.m[0]->retired_ops, 1u);
}

// A DiLoCo member's finished all-reduce still holds its input (model-sized): the driver frees
// it, off its strand.
TEST(RoundLogic, AFinishedAllReduceIsHandedToTheDriverToFree) {
  Logic l(2, OuterMode::diloco);
  ASSERT_TRUE(start_all(l));
  for (std::size_t round = 0; round < 3; ++round) ASSERT_TRUE(round_of_all(l, {0.9f, 1.1f}));
  for (auto& x : l.m) {
    for (const auto& r : x->reports) ASSERT_FALSE(r.local_only) << r.note;
    EXPECT_EQ(x->retired_ops, 3u);
  }
}

// A DiLoCo all-reduce that fails for every member (each lost the others): each catches up, sees
// that nobody is ahead of its round (every member's record says it is catching up too), and
// goes on with its own slow weights within the records' settle time, not after waiting two
// rounds for a state nobody will make. The members still hold one φ and average the next round.
TEST(RoundLogic, WhenEveryMembersAllReduceFailsNobodyWaitsForAState) {
  auto o = options(OuterMode::diloco);
  o.offers_wait = milliseconds(300'000);
  Logic l(3, o);
  ASSERT_TRUE(start_all(l));
  ASSERT_TRUE(round_of_all(l, {0.9f, 1.0f, 1.1f}));
  l.cut = true;
  ASSERT_TRUE(l.run_until(
      [&] {
        for (auto& x : l.m)
          if (!x->engine.idle()) return false;
        return true;
      },
      milliseconds(20'000)));
  const Clock cut_at = l.now;
  for (std::size_t i = 0; i < 3; ++i) l.submit(i, 0.8f + 0.1f * static_cast<float>(i));
  ASSERT_TRUE(l.run_until(
      [&] {
        for (auto& x : l.m)
          if (x->reports.size() < 2) return false;
        return true;
      },
      milliseconds(60'000)))
      << "a member waited for a state nobody makes";
  EXPECT_LT(l.now - cut_at, milliseconds(40'000));
  for (auto& x : l.m)
    EXPECT_NE(x->reports.back().note.find("no member is ahead"), std::string::npos)
        << x->reports.back().note;
  l.cut = false;
  ASSERT_TRUE(round_of_all(l, {0.9f, 1.0f, 1.1f}));
  const auto phi = l.m[0]->engine.state().phi.to_vector();
  for (auto& x : l.m) {
    EXPECT_FALSE(x->reports.back().local_only) << x->reports.back().note;
    EXPECT_EQ(x->engine.state().phi.to_vector(), phi);
  }
}

// NoLoCo in groups of four (RoundOptions::noloco_group): each member averages with the three
// others every round.
TEST(RoundLogic, NoLoCoMembersAverageInGroupsOfTheRunsSize) {
  auto o = options(OuterMode::noloco);
  o.noloco_group = 4;
  Logic l(4, o);
  ASSERT_TRUE(start_all(l));
  for (std::size_t round = 0; round < 2; ++round)
    ASSERT_TRUE(round_of_all(l, {0.8f, 0.9f, 1.0f, 1.1f}));
  for (auto& x : l.m)
    for (const auto& r : x->reports) {
      EXPECT_FALSE(r.local_only) << r.note;
      EXPECT_EQ(r.group.size(), 4u);
      EXPECT_EQ(r.averaged_with.size(), 3u) << r.note;
    }
}

// NoLoCo's look-ahead: the next inner phase starts from φ + λ·m, and overlap mixes θ with that
// point; without a look-ahead (or in DiLoCo rounds) from φ.
TEST(RoundLogic, WithALookAheadTheNextPhaseStartsWhereTheMomentumHeads) {
  auto o = options(OuterMode::noloco);
  o.noloco.lookahead = 0.5f;
  Logic l(2, o);
  ASSERT_TRUE(start_all(l));
  for (std::size_t round = 0; round < 2; ++round) ASSERT_TRUE(round_of_all(l, {0.7f, 0.9f}));
  ASSERT_FALSE(l.m[0]->reports.back().local_only) << l.m[0]->reports.back().note;
  const auto& e = l.m[0]->engine;
  const auto phi = e.state().phi.to_vector(), m = e.state().momentum.to_vector();
  ASSERT_NE(m[0], 0.0f);
  std::vector<float> start(kValues), mixed(kValues, 2.0f);
  e.start_part(start, 0);
  e.mix_part(std::span(mixed).subspan(8), 8, 0.25f);
  for (std::size_t i = 0; i < kValues; ++i) {
    ASSERT_FLOAT_EQ(start[i], phi[i] + 0.5f * m[i]) << i;
    if (i >= 8) {
      ASSERT_FLOAT_EQ(mixed[i], 0.25f * 2.0f + 0.75f * start[i]) << i;
    }
  }
  // Without one: from φ itself.
  Logic plain(1);
  ASSERT_NO_FATAL_FAILURE(first_round_alone(plain, 0.5f));
  plain.m[0]->engine.start_part(start, 0);
  for (float v : start) ASSERT_EQ(v, 0.5f);
}

// A DiLoCo member whose partner has no trainer (its record says "idle") does not wait the group
// wait (120 s) for it: it keeps its inner phase alone at once.
TEST(RoundLogic, AMemberWithoutItsTrainerIsNotWaitedFor) {
  Logic l(2, OuterMode::diloco);
  ASSERT_TRUE(start_all(l));
  ASSERT_TRUE(l.run_until([&] { return l.m[0]->engine.idle() && l.m[1]->engine.idle(); },
                          milliseconds(20'000)));
  l.m[1]->engine.set_idle(true);
  ASSERT_TRUE(l.run_until(
      [&] {
        for (const auto& info : l.m[0]->members.live(l.now))
          if (info.id == l.m[1]->store.id()) return info.status == "idle";
        return false;
      },
      milliseconds(5000)));
  // (The node's controller counts the members that train, node/controller.cpp, and sets no
  // patience for later windows when it is the only one.)
  l.m[0]->engine.set_patience(milliseconds(0));
  const Clock t0 = l.now;
  l.submit(0, 0.5f);
  ASSERT_TRUE(l.run_until([&] { return !l.m[0]->reports.empty(); }, milliseconds(200'000)));
  EXPECT_LT(l.now - t0, milliseconds(10'000));
  EXPECT_TRUE(l.m[0]->reports.front().local_only);
  for (float v : l.m[0]->engine.state().phi.to_vector()) ASSERT_EQ(v, 0.5f);
  // Back with a trainer: "training" again.
  l.m[1]->engine.set_idle(false);
  ASSERT_TRUE(l.run_until(
      [&] {
        for (const auto& info : l.m[0]->members.live(l.now))
          if (info.id == l.m[1]->store.id()) return info.status == "training";
        return false;
      },
      milliseconds(5000)));
}

TEST(RoundLogic, AModeRecordInTheStoreSwitchesTheSchedule) {
  Logic l(1);
  l.m[0]->engine.start(initial(), l.now);
  EXPECT_EQ(l.m[0]->engine.mode_of(5), OuterMode::noloco);
  // Another member's signed request, written straight into the store.
  test::FakeStore other(l.board);
  other.write(mode_key("logic"), mode_subkey(4), 1, l.now + milliseconds(60'000),
              encode_mode({other.id(), "logic", OuterMode::diloco, 4}), l.now);
  ASSERT_TRUE(l.run_until([&] { return l.m[0]->engine.mode_of(5) == OuterMode::diloco; },
                          milliseconds(3000)));
  EXPECT_EQ(l.m[0]->engine.mode_of(3), OuterMode::noloco);
  EXPECT_EQ(l.m[0]->engine.mode_schedule().size(), 1u);
}

TEST(RoundLogic, AJoinerDownloadsTheDonorsStateFromItsOffer) {
  Logic l(2);
  ASSERT_NO_FATAL_FAILURE(first_round_alone(l, 0.25f));
  l.m[1]->engine.join(l.now, kValues);
  ASSERT_TRUE(l.run_until([&] { return !l.m[1]->reports.empty(); }, milliseconds(20'000)));
  const RoundReport& r = l.m[1]->reports.front();
  ASSERT_EQ(r.kind, RoundReport::Kind::synced) << r.note;
  EXPECT_EQ(l.m[1]->engine.state().round, l.m[0]->engine.state().round);
  EXPECT_EQ(l.m[1]->engine.state().phi, l.m[0]->engine.state().phi);
}

// A join attempt that failed part-way hands its verified chunks to the next attempt, which
// fetches only the rest (not the manifest, not a verified chunk again).
TEST(RoundLogic, AJoinAttemptResumesFromTheChunksOfTheLastOne) {
  Logic l(2);
  l.snapshot_chunk = 64;  // the state (φ and momentum of 64 values) in about 9 chunks
  ASSERT_NO_FATAL_FAILURE(first_round_alone(l, 0.25f));
  std::size_t answered = 0;
  l.fail_state = [&](const StateDownload::Request& r) {
    return decode_state_request(r.body)->index && ++answered > 4;  // the donor fails after 4
  };
  l.m[1]->engine.join(l.now, kValues);
  ASSERT_TRUE(l.run_until([&] { return !l.m[1]->reports.empty(); }, milliseconds(20'000)));
  ASSERT_EQ(l.m[1]->reports.back().kind, RoundReport::Kind::sync_failed);
  ASSERT_EQ(l.manifest_requests, 1u);
  l.fail_state = nullptr;
  l.state_requests = l.manifest_requests = 0;
  l.m[1]->reports.clear();
  l.m[1]->engine.join(l.now, kValues);  // the controller's next attempt
  ASSERT_TRUE(l.run_until(
      [&] {
        return !l.m[1]->reports.empty() &&
               l.m[1]->reports.back().kind != RoundReport::Kind::sync_progress;
      },
      milliseconds(20'000)));
  ASSERT_EQ(l.m[1]->reports.back().kind, RoundReport::Kind::synced) << l.m[1]->reports.back().note;
  EXPECT_EQ(l.m[1]->engine.state().phi, l.m[0]->engine.state().phi);
  EXPECT_EQ(l.manifest_requests, 0u);
  const auto chunks = (l.m[0]->server->latest()->size() + 63) / 64;
  ASSERT_GT(chunks, 5u);
  EXPECT_EQ(l.state_requests, chunks - 4);
}

// A donor that no longer holds the snapshot its offer names (it moved on to a newer round; its
// new offer is on its way) refuses it: the joiner reads the offers again within the same attempt
// instead of failing it.
TEST(RoundLogic, AJoinerRefusedAStaleSnapshotReadsTheOffersAgain) {
  Logic l(2);
  ASSERT_NO_FATAL_FAILURE(first_round_alone(l, 0.25f));
  int refused = 0;
  l.fail_state = [&](const StateDownload::Request& r) {
    return !decode_state_request(r.body)->index && ++refused <= 3;
  };
  l.m[1]->engine.join(l.now, kValues);
  ASSERT_TRUE(l.run_until(
      [&] {
        return !l.m[1]->reports.empty() &&
               l.m[1]->reports.back().kind != RoundReport::Kind::sync_progress;
      },
      milliseconds(20'000)));
  EXPECT_EQ(l.m[1]->reports.back().kind, RoundReport::Kind::synced) << l.m[1]->reports.back().note;
  for (const auto& r : l.m[1]->reports) EXPECT_NE(r.kind, RoundReport::Kind::sync_failed);
  EXPECT_EQ(refused, 4);  // three refused, the fourth answered
  EXPECT_EQ(l.m[1]->engine.state().phi, l.m[0]->engine.state().phi);
}

TEST(RoundLogic, AJoinerWithoutOffersReportsTheFailure) {
  Logic l(1);
  l.m[0]->engine.join(l.now, kValues);
  ASSERT_TRUE(l.run_until([&] { return !l.m[0]->reports.empty(); }, milliseconds(20'000)));
  EXPECT_EQ(l.m[0]->reports.front().kind, RoundReport::Kind::sync_failed);
  EXPECT_FALSE(l.m[0]->engine.has_state());
}

}  // namespace
}  // namespace grove::gossip
