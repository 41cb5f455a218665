// The node's policy (node/controller.hpp) on its own: events and times in, actions out.
#include "node/controller.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace grove::node {
namespace {

using K = Action::Kind;
using ms = std::chrono::milliseconds;
using Report = gossip::RoundReport;

std::vector<K> kinds(Controller& c) {
  std::vector<K> out;
  for (const auto& a : c.take_actions()) out.push_back(a.kind);
  return out;
}

// A round that averaged with a partner (`paired`), or with nobody.
Report report(Report::Kind k, bool paired = true) {
  Report r;
  r.kind = k;
  if (k == Report::Kind::round && paired) r.averaged_with.push_back(gossip::NodeId{1});
  return r;
}

const std::vector<float> kFinite(8, 1.0f);

// A bootstrapped node through its first inner phase: its θ is submitted (a round in flight).
// Returns the actions of the submit.
std::vector<K> into_round(Controller& c) {
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.on_inner_done(ms(1000), 2, ms(1000));
  c.take_actions();
  c.on_theta(kFinite, ms(1000));
  return kinds(c);
}

TEST(Controller, BootstrapTrainsSubmitsAndRestartsFromPhi) {
  Controller c({});
  c.begin(StartKind::bootstrap, false, ms(0));
  const auto first = c.take_actions();
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].kind, K::start_fresh);
  EXPECT_EQ(first[1].kind, K::load_phi);
  EXPECT_EQ(first[1].source, Action::Source::fresh);
  EXPECT_EQ(first[2].kind, K::train);
  EXPECT_TRUE(c.training());
  c.on_inner_done(ms(5000), 3, ms(5000));
  EXPECT_EQ(kinds(c), (std::vector{K::set_patience, K::check}));
  c.on_theta(kFinite, ms(5000));
  EXPECT_EQ(kinds(c), (std::vector{K::submit}));  // no overlap: no phase while the round runs
  EXPECT_TRUE(c.in_round());
  c.on_report(report(Report::Kind::round), ms(6000));
  EXPECT_EQ(kinds(c), (std::vector{K::load_phi, K::checkpoint, K::train}));
  EXPECT_FALSE(c.in_round());
}

TEST(Controller, PatienceFollowsTheLastRoundWithinBounds) {
  ControllerOptions o;
  o.window = ms(2000);
  o.patience_cap = ms(60'000);
  o.settle = ms(15'000);
  Controller c(o);
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.on_inner_done(ms(1000), 2, ms(1000));  // short phase: two windows at least
  EXPECT_EQ(c.patience(), ms(4000));
  c.on_theta(kFinite, ms(1000));
  c.on_report(report(Report::Kind::round), ms(2000));
  c.on_inner_done(ms(90'000), 2, ms(92'000));  // long phase: capped
  EXPECT_EQ(c.patience(), ms(60'000));
  c.on_theta(kFinite, ms(92'000));
  c.on_report(report(Report::Kind::round), ms(93'000));
  c.on_inner_done(ms(7000), 1, ms(100'000));  // alone, once the view had time to fill
  EXPECT_EQ(c.patience(), ms(0));
  c.on_theta(kFinite, ms(100'000));
  c.on_report(report(Report::Kind::round), ms(104'000));
  c.on_inner_done(ms(5000), 2, ms(109'000));  // the round: 4 s averaging + the 5 s phase
  EXPECT_EQ(c.patience(), ms(11'250));        // and a quarter more
}

// A node beside others whose rounds find nobody (their rounds are longer than its own) doubles
// its patience each time, up to the cap, and goes back to one round once it has paired.
TEST(Controller, PatienceDoublesWhileRoundsFindNobody) {
  ControllerOptions o;
  o.window = ms(2000);
  o.patience_cap = ms(60'000);
  Controller c(o);
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  Time t = ms(0);
  std::vector<Time> seen;
  for (int i = 0; i < 6; ++i) {
    t += ms(5000);
    c.on_inner_done(ms(5000), 3, t);
    seen.push_back(c.patience());
    c.on_theta(kFinite, t);
    c.on_report(report(Report::Kind::round, false), t);  // nobody was ready
  }
  EXPECT_EQ(seen, (std::vector<Time>{ms(6250), ms(12'500), ms(25'000), ms(50'000), ms(60'000),
                                     ms(60'000)}));
  c.on_inner_done(ms(5000), 3, t + ms(5000));
  c.on_theta(kFinite, t + ms(5000));
  c.on_report(report(Report::Kind::round), t + ms(6000));  // paired at last
  c.on_inner_done(ms(5000), 3, t + ms(11'000));
  EXPECT_EQ(c.patience(), ms(7500));  // one round again (1 s averaging + the 5 s phase) + 1/4
}

TEST(Controller, AloneBeforeTheViewSettledStillWaits) {
  ControllerOptions o;
  o.window = ms(2000);
  Controller c(o);
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.on_inner_done(ms(5000), 1, ms(5000));
  EXPECT_EQ(c.patience(), ms(6250));
}

TEST(Controller, JoinRetriesThenGivesUp) {
  ControllerOptions o;
  o.join_attempts = 3;
  Controller c(o);
  c.begin(StartKind::join, true, ms(0));
  auto a = c.take_actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, K::join);
  EXPECT_EQ(a[0].attempt, 1);
  c.on_report(report(Report::Kind::sync_failed), ms(10));
  a = c.take_actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].attempt, 2);
  // No answer at all within join_wait counts as a failed attempt too.
  ASSERT_TRUE(c.next_deadline());
  c.on_timer(*c.next_deadline());
  a = c.take_actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].attempt, 3);
  c.on_report(report(Report::Kind::sync_failed), ms(200'000));
  a = c.take_actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, K::exit);
  EXPECT_EQ(a[0].code, 1);
  EXPECT_TRUE(c.done());
}

// A join whose download keeps verifying more of the state is never cut off (a large state over
// a slow link); one that stops progressing fails join_wait after its last progress.
TEST(Controller, AJoinThatProgressesIsNotCutOff) {
  ControllerOptions o;
  o.join_wait = ms(120'000);
  Controller c(o);
  c.begin(StartKind::join, true, ms(0));
  EXPECT_EQ(kinds(c), (std::vector{K::join}));
  EXPECT_EQ(c.next_deadline(), ms(120'000));
  for (std::int64_t t = 60'000; t <= 1'800'000; t += 60'000) {  // half an hour of progress
    c.on_report(report(Report::Kind::sync_progress), ms(t));
    c.on_timer(ms(t));
    EXPECT_TRUE(c.take_actions().empty());
    EXPECT_EQ(c.next_deadline(), ms(t + 120'000));
  }
  c.on_timer(ms(1'920'000));  // then nothing for join_wait: the next attempt
  const auto a = c.take_actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, K::join);
  EXPECT_EQ(a[0].attempt, 2);
}

// Attempts that got more of the state than any before them (a donor gone, a snapshot replaced,
// a machine that stalled) do not count: a joiner gives up only after join_attempts in a row that
// got nothing new. An attempt that resumes a partial download reports its chunks at once; that
// is not progress of its own.
TEST(Controller, OnlyJoinAttemptsThatGotNothingCount) {
  ControllerOptions o;
  o.join_attempts = 3;
  Controller c(o);
  c.begin(StartKind::join, true, ms(0));
  std::int64_t t = 0;
  const auto progress = [&](std::uint64_t bytes) {
    auto r = report(Report::Kind::sync_progress);
    r.sync_bytes = bytes;
    c.on_report(r, ms(t += 1000));
  };
  for (int attempt = 1; attempt <= 5; ++attempt) {
    auto a = c.take_actions();
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(a[0].kind, K::join);
    EXPECT_EQ(a[0].attempt, attempt);
    progress(1000 * attempt);
    c.on_report(report(Report::Kind::sync_failed), ms(t += 1000));
  }
  for (int attempt = 6; attempt <= 8; ++attempt) {  // three that get nothing new
    auto a = c.take_actions();
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(a[0].kind, K::join) << "attempt " << attempt;
    EXPECT_EQ(a[0].attempt, attempt);
    progress(5000);  // the partial of attempt 5, resumed
    c.on_report(report(Report::Kind::sync_failed), ms(t += 1000));
  }
  const auto a = c.take_actions();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, K::exit);
  EXPECT_EQ(a[0].code, 1);
}

// A round that takes an hour (a large model over a slow link) is waited for: the node neither
// leaves nor sets a deadline on it; its operations end it.
TEST(Controller, ALongRoundIsNeverAReasonToLeave) {
  Controller c({});
  EXPECT_EQ(into_round(c), (std::vector{K::submit}));
  EXPECT_FALSE(c.next_deadline());
  c.on_timer(ms(3'600'000));
  EXPECT_TRUE(c.take_actions().empty());
  EXPECT_FALSE(c.leaving());
  c.on_report(report(Report::Kind::sync_progress), ms(3'600'500));  // a catch-up's: no decision
  EXPECT_TRUE(c.take_actions().empty());
  EXPECT_TRUE(c.in_round());
  c.on_report(report(Report::Kind::round), ms(3'601'000));
  EXPECT_EQ(kinds(c), (std::vector{K::load_phi, K::checkpoint, K::train}));
}

TEST(Controller, JoinSyncedStartsFromTheSwarm) {
  Controller c({});
  c.begin(StartKind::join, true, ms(0));
  c.take_actions();
  c.on_report(report(Report::Kind::synced), ms(100));
  const auto a = c.take_actions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, K::load_phi);
  EXPECT_EQ(a[0].source, Action::Source::swarm);
  EXPECT_EQ(a[1].kind, K::train);
}

TEST(Controller, ResumeTriesTheSwarmOnceThenItsCheckpoint) {
  Controller alone({});
  alone.begin(StartKind::resume, false, ms(0));
  EXPECT_EQ(kinds(alone), (std::vector{K::start_checkpoint, K::load_phi, K::train}));

  Controller c({});
  c.begin(StartKind::resume, true, ms(0));
  EXPECT_EQ(kinds(c), (std::vector{K::join}));
  c.on_report(report(Report::Kind::sync_failed), ms(10));
  EXPECT_EQ(kinds(c), (std::vector{K::start_checkpoint, K::load_phi, K::train}));
}

TEST(Controller, OverlapMixesAndSubmitsAPhaseThatWaited) {
  ControllerOptions o;
  o.overlap = true;
  o.mix_alpha = 0.25f;
  Controller c(o);
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.on_inner_done(ms(1000), 2, ms(1000));
  EXPECT_EQ(kinds(c), (std::vector{K::set_patience, K::check}));
  c.on_theta(kFinite, ms(1000));
  EXPECT_EQ(kinds(c), (std::vector{K::submit, K::train}));  // the next phase starts at once
  // The round ends during the phase: θ is mixed (the part the round stepped: one streaming
  // fragment here), the phase goes on.
  auto one_fragment = report(Report::Kind::round);
  one_fragment.slice = {4096, 8192};
  c.on_report(one_fragment, ms(1500));
  const auto a = c.take_actions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, K::mix);
  EXPECT_FLOAT_EQ(a[0].alpha, 0.25f);
  EXPECT_EQ(a[0].slice.lo, 4096u);
  EXPECT_EQ(a[0].slice.hi, 8192u);
  EXPECT_EQ(a[1].kind, K::checkpoint);
  c.on_inner_done(ms(1000), 2, ms(2000));
  c.take_actions();
  c.on_theta(kFinite, ms(2000));
  EXPECT_EQ(kinds(c), (std::vector{K::submit, K::train}));
  // The phase ends before the round: it waits, then is mixed, checked and submitted.
  c.on_inner_done(ms(1000), 2, ms(3000));
  EXPECT_EQ(kinds(c), (std::vector<K>{}));
  c.on_report(report(Report::Kind::round), ms(3500));
  EXPECT_EQ(kinds(c), (std::vector{K::mix, K::checkpoint, K::set_patience, K::check}));
  c.on_theta(kFinite, ms(3500));
  EXPECT_EQ(kinds(c), (std::vector{K::submit, K::train}));
  // A catch-up replaces the state: the phase that waited is lost, the next starts from φ.
  c.on_inner_done(ms(1000), 2, ms(4000));
  c.take_actions();
  c.on_report(report(Report::Kind::synced), ms(4500));
  EXPECT_EQ(kinds(c), (std::vector{K::load_phi, K::checkpoint, K::train}));
}

// Under overlap a short inner phase ends long before the round in flight (a large model's
// exchange over a slow line). The patience of the next round is one round of this node's cadence
// (submit to submit), decided when the phase that waited is checked; the round in flight keeps
// its own. Before, the phase's length alone was given at its end, to the round still matching:
// two windows, and a partner whose exchange ended a few seconds later was missed (a 500M pair
// under --overlap averaged 8 of 22 rounds).
TEST(Controller, OverlapPatienceIsTheRoundsCadenceNotThePhase) {
  ControllerOptions o;
  o.overlap = true;
  o.window = ms(5000);
  o.patience_cap = ms(1'800'000);
  Controller c(o);
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.on_inner_done(ms(8000), 2, ms(8000));
  EXPECT_EQ(c.patience(), ms(10'000));  // the first round: two windows
  c.take_actions();
  c.on_theta(kFinite, ms(8000));
  EXPECT_EQ(kinds(c), (std::vector{K::submit, K::train}));
  c.on_inner_done(ms(8000), 2, ms(16'000));  // the round (matching, then 330 s) runs on
  EXPECT_EQ(kinds(c), (std::vector<K>{}));   // its patience is left as it was
  EXPECT_EQ(c.patience(), ms(10'000));
  c.on_report(report(Report::Kind::round), ms(348'000));
  EXPECT_EQ(kinds(c), (std::vector{K::mix, K::checkpoint, K::set_patience, K::check}));
  EXPECT_EQ(c.patience(), ms(425'000));  // submit to now (the round, not the 8 s phase) + 1/4
}

TEST(Controller, NonFinitePhaseIsDroppedAndTheRoundGoesOnWithPhi) {
  Controller c({});
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.on_inner_done(ms(1000), 2, ms(1000));
  c.take_actions();
  std::vector<float> theta(8, 1.0f);
  theta[3] = std::nanf("");
  c.on_theta(theta, ms(1000));
  const auto a = c.take_actions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, K::load_phi);
  EXPECT_EQ(a[1].kind, K::submit);
  EXPECT_EQ(c.dropped(), 1u);
  theta[3] = INFINITY;
  c.on_report(report(Report::Kind::round), ms(2000));
  c.take_actions();
  c.on_inner_done(ms(1000), 2, ms(3000));
  c.take_actions();
  c.on_theta(theta, ms(3000));
  EXPECT_EQ(c.dropped(), 2u);
}

TEST(Controller, CheckpointCadence) {
  ControllerOptions o;
  o.checkpoint_every = 3;
  Controller c(o);
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  int checkpoints = 0;
  for (int r = 0; r < 9; ++r) {
    c.on_inner_done(ms(1000), 2, ms(1000 * (r + 1)));
    c.take_actions();
    c.on_theta(kFinite, ms(1000 * (r + 1)));
    c.take_actions();
    c.on_report(report(Report::Kind::round), ms(1000 * (r + 1) + 500));
    for (const auto& a : c.take_actions()) checkpoints += a.kind == K::checkpoint;
  }
  EXPECT_EQ(checkpoints, 3);
}

// By time: the first new state at once, then once the interval has passed (rounds of 3 s, every
// 10 s: rounds 1, 5, 9); with a count as well, whichever comes first.
TEST(Controller, CheckpointCadenceByTime) {
  for (const std::uint32_t every : {0u, 2u}) {
    ControllerOptions o;
    o.checkpoint_every = every;
    o.checkpoint_interval = ms(10'000);
    Controller c(o);
    c.begin(StartKind::bootstrap, false, ms(0));
    c.take_actions();
    std::vector<int> at;
    for (int r = 1; r <= 9; ++r) {
      const Time t = ms(3000 * r);
      c.on_inner_done(ms(1000), 2, t);
      c.take_actions();
      c.on_theta(kFinite, t);
      c.take_actions();
      c.on_report(report(Report::Kind::round), t);
      for (const auto& a : c.take_actions())
        if (a.kind == K::checkpoint) at.push_back(r);
    }
    if (every == 0)
      EXPECT_EQ(at, (std::vector{1, 5, 9}));
    else
      EXPECT_EQ(at, (std::vector{1, 3, 5, 7, 9}));
  }
  ControllerOptions none;
  none.checkpoint_every = 0;
  EXPECT_THROW(Controller{none}, transport::ConfigError);
}

TEST(Controller, StopWaitsForTheRoundThenLeavesAndExits) {
  ControllerOptions o;
  o.stop_grace = ms(30'000);
  o.leave_wait = ms(5000);
  Controller c(o);
  into_round(c);
  c.stop(ms(2000));
  const auto a = c.take_actions();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, K::set_patience);
  EXPECT_EQ(a[0].time, ms(0));
  EXPECT_EQ(a[1].kind, K::set_group_wait);
  EXPECT_EQ(a[1].time, ms(0));
  EXPECT_EQ(c.next_deadline(), ms(32'000));  // the grace for the round in flight
  c.on_report(report(Report::Kind::round), ms(3000));
  EXPECT_EQ(kinds(c), (std::vector{K::load_phi, K::checkpoint, K::leave, K::checkpoint}));
  EXPECT_TRUE(c.leaving());
  EXPECT_EQ(c.next_deadline(), ms(8000));
  c.on_left(ms(3100));
  const auto e = c.take_actions();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, K::exit);
  EXPECT_EQ(e[0].code, 0);
}

TEST(Controller, StopAfterTheGraceLeavesWithTheRoundInFlight) {
  Controller c({});
  into_round(c);
  c.stop(ms(2000));
  c.take_actions();
  c.on_timer(ms(32'000));
  EXPECT_EQ(kinds(c), (std::vector{K::leave, K::checkpoint}));
  c.on_timer(ms(37'000));  // the member record's removal never confirmed: go anyway
  EXPECT_EQ(kinds(c), (std::vector{K::exit}));
}

// A round that took 100 s to sync (a large model over a slow line) gets twice that after a stop.
TEST(Controller, StopGraceGrowsWithTheLastRoundsSync) {
  Controller c({});
  into_round(c);
  auto r = report(Report::Kind::round);
  r.sync_time = ms(100'000);
  c.on_report(r, ms(102'000));
  c.take_actions();
  c.on_inner_done(ms(1000), 2, ms(103'000));
  c.take_actions();
  c.on_theta(kFinite, ms(103'000));
  c.take_actions();
  c.stop(ms(110'000));
  c.take_actions();
  EXPECT_EQ(c.next_deadline(), ms(310'000));
  c.on_timer(ms(200'000));
  EXPECT_TRUE(kinds(c).empty());  // still waiting for the round
  c.on_timer(ms(310'000));
  EXPECT_EQ(kinds(c), (std::vector{K::leave, K::checkpoint}));
}

TEST(Controller, StopDuringAPhaseAbandonsItAndLeavesAtOnce) {
  Controller c({});
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.stop(ms(500));
  EXPECT_EQ(kinds(c), (std::vector{K::set_patience, K::set_group_wait, K::leave, K::checkpoint}));
  c.on_inner_done(ms(1000), 2, ms(1000));  // (a driver reports no abandoned phase; ignored)
  EXPECT_TRUE(c.take_actions().empty());
}

TEST(Controller, StopWhileJoiningExitsWithAnError) {
  Controller c({});
  c.begin(StartKind::join, true, ms(0));
  c.take_actions();
  c.stop(ms(10));
  const auto a = c.take_actions();
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.back().kind, K::exit);
  EXPECT_EQ(a.back().code, 1);
}

TEST(Controller, AResumedNodeStoppedWhileJoiningLeavesWithItsCheckpoint) {
  Controller c({});
  c.begin(StartKind::resume, true, ms(0));
  c.take_actions();
  c.stop(ms(10));
  const auto a = kinds(c);
  ASSERT_GE(a.size(), 4u);
  EXPECT_EQ(a[2], K::start_checkpoint);
  EXPECT_EQ(a[a.size() - 2], K::leave);
  c.on_left(ms(20));
  const auto e = c.take_actions();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].code, 0);
}

TEST(Controller, AStopWhileLeavingIsTakenOnce) {
  Controller c({});
  c.begin(StartKind::bootstrap, false, ms(0));
  c.take_actions();
  c.finish(ms(1));  // leaving (a step budget), then a signal
  EXPECT_TRUE(c.leaving());
  c.take_actions();
  c.stop(ms(2));
  EXPECT_TRUE(c.stopping());  // the driver does not ask again
  EXPECT_TRUE(c.take_actions().empty());
}

TEST(Controller, FinishSubmitsTheLastPhaseThenLeaves) {
  for (const bool overlap : {false, true}) {
    ControllerOptions o;
    o.overlap = overlap;
    Controller c(o);
    c.begin(StartKind::bootstrap, false, ms(0));
    c.take_actions();
    c.on_inner_done(ms(1000), 2, ms(1000));
    c.take_actions();
    c.on_theta(kFinite, ms(1000));
    c.take_actions();
    c.finish(ms(1000));  // the step budget is spent (a `train` found it so)
    EXPECT_TRUE(c.take_actions().empty()) << overlap;
    c.on_report(report(Report::Kind::round), ms(2000));
    auto a = kinds(c);
    ASSERT_GE(a.size(), 2u);
    EXPECT_EQ(a[a.size() - 2], K::leave) << overlap;
    EXPECT_EQ(a.back(), K::checkpoint) << overlap;
  }
}

TEST(Controller, RefusesBadOptions) {
  ControllerOptions o;
  o.join_attempts = 0;
  EXPECT_THROW(Controller{o}, transport::ConfigError);
  o = {};
  o.mix_alpha = 1.5f;
  EXPECT_THROW(Controller{o}, transport::ConfigError);
}

}  // namespace
}  // namespace grove::node
