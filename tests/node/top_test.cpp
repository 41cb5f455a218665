// TopModel (node/top.hpp): what `grove-node top` shows from successive swarm_status answers.
#include "node/top.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace grove::node {
namespace {

MemberStatus member(const std::string& id, const std::string& status = "training") {
  MemberStatus m;
  m.node = id;
  m.status = status;
  m.address = "10.0.0.1:7400";
  m.step = 100;
  m.round = 2;
  m.loss = 2.5;
  m.eval_loss = 2.6;
  m.loss_floor = 2.0;
  m.tokens_per_s = 1000;
  m.last_sync_ms = 1500;
  return m;
}

const TopRow& row(const TopModel& t, const std::string& id) {
  for (const auto& r : t.rows())
    if (r.m.node == id) return r;
  throw std::runtime_error("no row " + id);
}

// Bytes in and out a second come from the byte counters of answers seconds apart; the MB of
// the last sync from the counters between two round changes.
TEST(Top, RatesAndTheLastRoundsBytesComeFromTheCounters) {
  TopModel t;
  auto a = member("aaaa");
  a.bytes_sent = 1'000'000;
  a.bytes_received = 2'000'000;
  t.update({a}, 10.0);
  EXPECT_TRUE(std::isnan(row(t, "aaaa").out_bps)) << "one answer: no rate yet";
  a.bytes_sent = 3'000'000;
  a.bytes_received = 6'000'000;
  t.update({a}, 12.0);
  EXPECT_DOUBLE_EQ(row(t, "aaaa").out_bps, 1e6);
  EXPECT_DOUBLE_EQ(row(t, "aaaa").in_bps, 2e6);
  EXPECT_TRUE(std::isnan(row(t, "aaaa").last_round_mb));
  a.round = 3;  // a round ended: 6 MB since the first answer (round 2)
  t.update({a}, 13.0);
  EXPECT_DOUBLE_EQ(row(t, "aaaa").last_round_mb, 6.0);
  // A counter that went back (the node restarted) gives no rate, not a huge one.
  a.bytes_sent = 10;
  t.update({a}, 14.0);
  EXPECT_TRUE(std::isnan(row(t, "aaaa").out_bps));
}

// A member missing from an answer is listed as gone for a minute, then dropped; the states
// are named for people (an averaging round is "syncing", a state download shows its share).
TEST(Top, MembersThatGoAwayAreListedAsGoneThenDropped) {
  TopModel t;
  auto b = member("bbbb", "joining");
  b.sync_bytes = 250;
  b.sync_total = 1000;
  t.update({member("aaaa", "averaging"), b, member("cccc", "checkpointing")}, 0.0);
  EXPECT_EQ(row(t, "aaaa").state, "syncing");
  EXPECT_EQ(row(t, "bbbb").state, "joining 25%");
  EXPECT_EQ(row(t, "cccc").state, "checkpointing");
  t.update({member("aaaa")}, 1.0);
  EXPECT_EQ(row(t, "aaaa").state, "training");
  EXPECT_EQ(row(t, "bbbb").state, "gone");
  EXPECT_TRUE(row(t, "cccc").gone);
  t.update({member("aaaa")}, 30.0);
  EXPECT_EQ(t.rows().size(), 3u);
  t.update({member("aaaa")}, 62.0);
  EXPECT_EQ(t.rows().size(), 1u);
  t.update({member("aaaa"), member("bbbb")}, 63.0);  // back: listed again
  EXPECT_EQ(row(t, "bbbb").state, "training");
}

// However many node ids the answers invent (a peer's lies), the rows kept stay bounded.
TEST(Top, InventedMembersStayBounded) {
  TopModel t;
  for (int a = 0; a < 5; ++a) {
    std::vector<MemberStatus> answer;
    for (std::size_t i = 0; i < kMaxStatusMembers; ++i)
      answer.push_back(member(std::to_string(a) + "-" + std::to_string(i)));
    t.update(answer, static_cast<double>(a));
  }
  EXPECT_LE(t.rows().size(), 2 * kMaxStatusMembers);
  EXPECT_GE(t.rows().size(), kMaxStatusMembers);
}

// Sorting by a column (absent values last, ties by node id), reversing it, and the selection
// following its node, not its position.
TEST(Top, SortsAndKeepsTheSelectedNode) {
  TopModel t;
  auto a = member("aaaa"), b = member("bbbb"), c = member("cccc");
  a.loss = 3.0;
  b.loss = NAN;
  c.loss = 1.0;
  t.update({a, b, c}, 0.0);
  ASSERT_EQ(t.rows().front().m.node, "aaaa");
  t.select(1);
  EXPECT_EQ(t.rows()[*t.selected()].m.node, "bbbb");
  while (t.sort() != TopModel::Sort::loss) t.sort_next(1);
  EXPECT_EQ(t.rows()[0].m.node, "cccc");
  EXPECT_EQ(t.rows()[1].m.node, "aaaa");
  EXPECT_EQ(t.rows()[2].m.node, "bbbb");  // no loss: last
  EXPECT_EQ(t.rows()[*t.selected()].m.node, "bbbb");
  t.reverse();
  EXPECT_EQ(t.rows()[0].m.node, "aaaa");
  EXPECT_EQ(t.rows()[2].m.node, "bbbb");  // still last
  t.select(-10);                          // clamped
  EXPECT_EQ(*t.selected(), 0u);
  t.sort_next(-1);  // back to step (all equal): by node
  EXPECT_EQ(t.rows()[0].m.node, "aaaa");
}

// What a peer sends never reaches the terminal raw: escape sequences, control characters and
// bytes above ASCII become '?', every line fits the screen, and the highlighted line is the
// selected member's.
TEST(Top, TheScreenIsPrintableAndFitsTheTerminal) {
  TopModel t;
  auto evil = member("\x1b]0;pwned\x07");
  evil.status = "training\x1b[2J";
  evil.address = "\xff\xfe\r\n10.0.0.9:1";
  evil.algorithm = std::string(1000, 'x');
  evil.loss = 1e300;
  t.update({member("aaaa"), evil}, 0.0);
  t.update({member("aaaa"), evil}, 1.0);
  for (const std::size_t width : {40u, 80u, 200u}) {
    int highlight = -2;
    const auto lines = t.screen(width, 12, "127.0.0.1:7400", highlight);
    EXPECT_LE(lines.size(), 12u);
    ASSERT_GE(highlight, 0);
    EXPECT_NE(lines[static_cast<std::size_t>(highlight)].find(
                  t.rows()[*t.selected()].m.node.substr(0, 4)),
              std::string::npos);
    for (const auto& l : lines) {
      EXPECT_LE(l.size(), width);
      for (char c : l) {
        const auto u = static_cast<unsigned char>(c);
        EXPECT_TRUE(u >= 0x20 && u < 0x7f) << "byte " << int(u) << " in: " << l;
      }
    }
  }
  for (char c : t.table()) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE(c == '\n' || (u >= 0x20 && u < 0x7f)) << int(u);
  }
}

// The swarm's mean loss and sync time over the answers, as sparklines scaled to their range.
TEST(Top, SparklinesFollowTheSwarmsMeans) {
  EXPECT_EQ(sparkline({0, 1, 2, 3, 4, 5, 6, 7}, 8), ".:-=+*##");
  EXPECT_EQ(sparkline({1, 1}, 4), "  ==");
  EXPECT_EQ(sparkline({NAN, 2, 4}, 3), " .#");
  TopModel t;
  auto a = member("aaaa"), b = member("bbbb");
  a.loss = 2.0;
  b.loss = 4.0;
  b.status = "unreachable";  // (its record only: not counted)
  t.update({a, b}, 0.0);
  a.loss = 1.0;
  t.update({a, b}, 1.0);
  ASSERT_EQ(t.loss_history().size(), 2u);
  EXPECT_DOUBLE_EQ(t.loss_history()[0], 2.0);
  EXPECT_DOUBLE_EQ(t.loss_history()[1], 1.0);
  EXPECT_DOUBLE_EQ(t.sync_history()[1], 1500.0);
}

}  // namespace
}  // namespace grove::node
