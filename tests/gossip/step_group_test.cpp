// StepGroup (gossip/step_group.hpp): nodes that start together end in one group; every call's
// members agree on its view; a member that dies (the sequencer too) is dropped and the survivors
// go on together; a joiner enters at a later call; a member left out rejoins.
//
// The harness: StepGroups exchanging real wire messages with 1 ms of latency in virtual time,
// and a model of a call's ring operation: it completes when every live member of its view has
// begun it with that view (a dead one is dropped after `suspect_ms`; a member that never comes
// is dropped the same way, and the call fails for those left when they are no strict majority).
#include "gossip/step_group.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>

namespace grove::gossip {
namespace {

NodeId id_of(int i) {
  NodeId id{};
  id[0] = static_cast<std::uint8_t>(i);
  return id;
}

struct Harness {
  struct Member {
    std::unique_ptr<StepGroup> g;
    bool alive = true;
    bool calling = true;         // its trainer makes calls
    std::optional<CallView> in;  // the call it is in
    Time begun{0};
    std::vector<CallView> done;  // completed calls
    int failed = 0, failed_begins = 0;
  };
  struct Flight {
    Time at;
    NodeId from, to;
    Bytes data;
  };
  StepGroupOptions opts;
  Time now{0};
  Time suspect_ms{200};
  std::map<NodeId, Member> members;
  std::deque<Flight> flights;
  // Every call as each participant saw it: call → view → participants.
  std::map<std::uint64_t, std::map<std::vector<NodeId>, std::set<NodeId>>> seen;

  Harness() {
    opts.join_wait = Time(300);
    opts.join_retry = Time(200);
    opts.announce_timeout = Time(2000);
  }

  void add(int i, const std::vector<int>& known) {
    const NodeId id = id_of(i);
    members[id].g = std::make_unique<StepGroup>(OpId{}, id, opts);
    std::vector<NodeId> c;
    for (int k : known) c.push_back(id_of(k));
    members[id].g->set_candidates(c, now);
  }

  void pump() {
    for (auto& [id, m] : members) {
      if (!m.alive) continue;
      for (auto& o : m.g->take_outgoing())
        flights.push_back({now + Time(1), id, o.to, std::move(o.data)});
    }
  }

  void step() {
    now += Time(1);
    while (!flights.empty() && flights.front().at <= now) {
      auto f = std::move(flights.front());
      flights.pop_front();
      auto it = members.find(f.to);
      if (it == members.end() || !it->second.alive) continue;
      auto msg = decode_message(f.data.span());
      ASSERT_TRUE(msg.has_value());
      it->second.g->on_message(f.from, *msg, now);
    }
    for (auto& [id, m] : members) {
      if (!m.alive) continue;
      if (auto d = m.g->next_deadline(); d && *d <= now) m.g->on_timer(now);
      if (m.calling && !m.in) {
        if (auto cv = m.g->begin(now)) {
          m.in = *cv;
          m.begun = now;
          seen[cv->call][cv->members].insert(id);
        } else if (!m.g->failed_begin().empty()) {
          ++m.failed_begins;
        }
      }
    }
    resolve();
    pump();
  }

  // A call completes when every live member of its view is in it; one waited on for
  // suspect_ms is dropped.
  void resolve() {
    std::map<std::pair<std::uint64_t, std::vector<NodeId>>, std::vector<NodeId>> calls;
    for (auto& [id, m] : members)
      if (m.alive && m.in) calls[{m.in->call, m.in->members}].push_back(id);
    for (auto& [key, in] : calls) {
      const auto& view = key.second;
      Time first = now;
      for (auto& id : in) first = std::min(first, members[id].begun);
      bool all = true;
      for (auto& v : view)
        if (std::find(in.begin(), in.end(), v) == in.end()) all = false;
      if (!all && now < first + suspect_ms) continue;
      // Strict majority (a pair's survivor keeps its own result).
      const bool ok = all || view.size() == 2 || in.size() * 2 > view.size();
      for (auto& id : in) {
        auto& m = members[id];
        if (ok)
          m.done.push_back(*m.in);
        else
          ++m.failed;
        m.in.reset();
        m.g->end(ok, in, now);
      }
    }
  }

  void run_until(int ms) {
    while (now < Time(ms)) step();
  }

  // No call was seen with two different views by members of both.
  void expect_consistent() {
    for (auto& [call, views] : seen) {
      if (views.size() < 2) continue;
      for (auto a = views.begin(); a != views.end(); ++a)
        for (auto b = std::next(a); b != views.end(); ++b)
          for (auto& x : a->second)
            EXPECT_FALSE(std::binary_search(b->first.begin(), b->first.end(), x) &&
                         b->first.size() > 1 && a->first.size() > 1 &&
                         std::any_of(b->second.begin(), b->second.end(),
                                     [&](const NodeId& y) {
                                       return std::binary_search(a->first.begin(), a->first.end(),
                                                                 y);
                                     }))
                << "call " << call << ": two views shared by members of both";
    }
  }

  std::size_t last_view_size(int i) {
    auto& d = members[id_of(i)].done;
    return d.empty() ? 0 : d.back().members.size();
  }
};

TEST(StepGroup, NodesThatStartTogetherEndInOneGroup) {
  Harness h;
  h.add(3, {1, 2});
  h.add(1, {2, 3});
  h.add(2, {1, 3});
  h.run_until(3000);
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(h.last_view_size(i), 3u) << i;
    EXPECT_EQ(h.members[id_of(i)].failed, 0);
    EXPECT_EQ(h.members[id_of(i)].failed_begins, 0);
  }
  // In the group, every member makes the same calls with the same ranks.
  const auto& a = h.members[id_of(1)].done.back();
  const auto& b = h.members[id_of(2)].done.back();
  EXPECT_EQ(a.call, b.call);
  EXPECT_EQ(a.rank, 0u);
  EXPECT_EQ(b.rank, 1u);
  h.expect_consistent();
}

// A node that has called alone for a long time (it knew nobody) and then learns of a smaller and
// a larger id: it leaves the smaller one time to admit it before it admits the larger one itself,
// so the three end in one group (the smallest's), not in two that never merge.
TEST(StepGroup, ANodeLongAloneLetsASmallerOneAdmitItFirst) {
  Harness h;
  h.add(2, {});
  h.run_until(2000);
  ASSERT_EQ(h.last_view_size(2), 1u);
  h.add(1, {2, 3});
  h.add(3, {1, 2});
  h.members[id_of(2)].g->set_candidates({id_of(1), id_of(3)}, h.now);
  h.run_until(5000);
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(h.last_view_size(i), 3u) << i;
    // No pair formed first: each one's first call with others was with both.
    const auto& d = h.members[id_of(i)].done;
    const auto first =
        std::find_if(d.begin(), d.end(), [](const CallView& v) { return v.members.size() > 1; });
    ASSERT_NE(first, d.end()) << i;
    EXPECT_EQ(first->members.size(), 3u) << i;
    EXPECT_EQ(h.members[id_of(i)].failed, 0) << i;
  }
  h.expect_consistent();
}

TEST(StepGroup, AMemberThatDiesIsDroppedAndTheOthersGoOn) {
  for (int dead : {1, 2}) {  // the sequencer, then another member
    Harness h;
    for (int i = 1; i <= 4; ++i) h.add(i, {1, 2, 3, 4});
    h.run_until(2000);
    ASSERT_EQ(h.last_view_size(1), 4u);
    h.members[id_of(dead)].alive = false;
    const auto before = h.members[id_of(3)].done.size();
    h.run_until(4000);
    EXPECT_GT(h.members[id_of(3)].done.size(), before + 10) << "dead " << dead;
    for (int i = 1; i <= 4; ++i) {
      if (i == dead) continue;
      EXPECT_EQ(h.last_view_size(i), 3u) << "dead " << dead << " node " << i;
      EXPECT_EQ(h.members[id_of(i)].failed, 0);
      EXPECT_EQ(h.members[id_of(i)].failed_begins, 0);
    }
    h.expect_consistent();
  }
}

TEST(StepGroup, AJoinerEntersAtALaterCall) {
  Harness h;
  h.add(2, {3});
  h.add(3, {2});
  h.run_until(1500);
  ASSERT_EQ(h.last_view_size(2), 2u);
  h.add(1, {2, 3});  // the smallest id: it becomes the sequencer once in
  h.run_until(3000);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(h.last_view_size(i), 3u) << i;
  const auto& j = h.members[id_of(1)].done;
  const auto& o = h.members[id_of(2)].done;
  EXPECT_EQ(j.back().call, o.back().call);
  EXPECT_EQ(j.back().rank, 0u);
  h.expect_consistent();
}

TEST(StepGroup, AMemberLeftOutRejoins) {
  Harness h;
  for (int i = 1; i <= 3; ++i) h.add(i, {1, 2, 3});
  h.run_until(1500);
  ASSERT_EQ(h.last_view_size(3), 3u);
  // Node 3's trainer stops calling for a while: the others drop it (survivors 1, 2) ...
  h.members[id_of(3)].calling = false;
  h.run_until(2500);
  EXPECT_EQ(h.last_view_size(1), 2u);
  // ... and when it calls again, its old view's call finds nobody: it fails, rejoins, and is in.
  h.members[id_of(3)].calling = true;
  h.run_until(5000);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(h.last_view_size(i), 3u) << i;
  EXPECT_GE(h.members[id_of(3)].failed + h.members[id_of(3)].failed_begins, 1);
  EXPECT_EQ(h.members[id_of(1)].failed, 0);
  h.expect_consistent();
}

TEST(StepGroup, OnlyTheSequencersAnnouncementCounts) {
  StepGroupOptions o;
  StepGroup g(OpId{}, id_of(2), o);
  // Alone, node 2 calls; an announcement from a stranger for its next call is ignored.
  auto cv = g.begin(Time(0));
  ASSERT_TRUE(cv);
  EXPECT_EQ(cv->members.size(), 1u);
  Header hd;
  hd.kind = MsgKind::announce;
  hd.count = cv->call + 1;
  hd.view = {id_of(2), id_of(9)};
  auto bytes = encode_message(hd, 0);
  auto m = decode_message(bytes.span());
  ASSERT_TRUE(m);
  g.on_message(id_of(9), *m, Time(1));
  g.end(true, {id_of(2)}, Time(2));
  auto next = g.begin(Time(3));
  ASSERT_TRUE(next);
  EXPECT_EQ(next->members.size(), 1u);
  // A welcome that does not name this node is ignored too.
  hd.kind = MsgKind::welcome;
  hd.view = {id_of(8), id_of(9)};
  bytes = encode_message(hd, 0);
  g.on_message(id_of(9), *decode_message(bytes.span()), Time(4));
  g.end(true, {id_of(2)}, Time(5));
  EXPECT_EQ(g.begin(Time(6))->members.size(), 1u);
}

TEST(StepGroup, GroupMessagesRoundTripTheWire) {
  Header hd;
  hd.kind = MsgKind::welcome;
  hd.count = 77;
  hd.view = {id_of(1), id_of(2), id_of(5)};
  const auto bytes = encode_message(hd, 0);
  const auto m = decode_message(bytes.span());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->h.kind, MsgKind::welcome);
  EXPECT_EQ(m->h.count, 77u);
  EXPECT_EQ(m->h.view, hd.view);
  EXPECT_TRUE(m->h.suspects.empty());
  hd.kind = MsgKind::join;
  hd.view.clear();
  EXPECT_EQ(decode_message(encode_message(hd, 0).span())->h.kind, MsgKind::join);
  // A view longer than the limit is refused.
  hd.kind = MsgKind::announce;
  hd.view.assign(300, id_of(1));
  EXPECT_FALSE(decode_message(encode_message(hd, 0).span()));
}

}  // namespace
}  // namespace grove::gossip
