// ConsistencyJudge on its own: member records in, mismatches and repairs out.
#include "gossip/consistency.hpp"

#include <gtest/gtest.h>

#include "gossip/progress.hpp"

namespace grove::gossip {
namespace {

NodeId id(std::uint8_t b) {
  NodeId i{};
  i[0] = b;
  return i;
}

Digest hash(std::uint8_t b) {
  Digest d{};
  d[0] = b;
  return d;
}

dht::MemberInfo record(std::uint8_t who, std::uint64_t round, std::uint8_t h) {
  dht::MemberInfo m;
  m.id = id(who);
  m.run_id = "run";
  m.payload = encode_progress({round, hash(h)});
  return m;
}

TEST(ConsistencyJudge, TheSameHashEverywhereIsNoMismatch) {
  ConsistencyJudge j(id(1), "run");
  j.expect(5, hash(7), {id(1), id(2), id(3)});
  j.on_member(record(2, 5, 7));
  j.on_member(record(3, 5, 7));
  EXPECT_EQ(j.mismatches(), 0u);
  EXPECT_FALSE(j.take_repair());
}

TEST(ConsistencyJudge, AMajorityAgainstUsRepairsFromItsMembers) {
  ConsistencyJudge j(id(1), "run");
  j.expect(5, hash(7), {id(1), id(2), id(3), id(4)});
  j.on_member(record(2, 5, 9));
  EXPECT_EQ(j.mismatches(), 1u);
  EXPECT_FALSE(j.repair_pending());  // 1 against 1 of 4: no majority, not everyone yet
  j.on_member(record(3, 5, 9));      // 2 of 4: still no strict majority
  EXPECT_FALSE(j.repair_pending());
  j.on_member(record(4, 5, 9));  // 3 of 4
  auto r = j.take_repair();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->round, 5u);
  EXPECT_EQ(r->donors, (std::set<NodeId>{id(2), id(3), id(4)}));
  EXPECT_EQ(j.mismatches(), 3u);
}

TEST(ConsistencyJudge, OnceEveryoneHasPublishedTiesGoToTheLowestHash) {
  // Two against two: every member reaches the same verdict, the lowest hash.
  ConsistencyJudge high(id(1), "run");
  high.expect(3, hash(9), {id(1), id(2), id(3), id(4)});
  high.on_member(record(2, 3, 9));
  high.on_member(record(3, 3, 4));
  high.on_member(record(4, 3, 4));
  auto r = high.take_repair();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->donors, (std::set<NodeId>{id(3), id(4)}));

  ConsistencyJudge low(id(3), "run");
  low.expect(3, hash(4), {id(1), id(2), id(3), id(4)});
  low.on_member(record(1, 3, 9));
  low.on_member(record(2, 3, 9));
  low.on_member(record(4, 3, 4));
  EXPECT_FALSE(low.take_repair());
}

TEST(ConsistencyJudge, IgnoresOtherRunsRoundsAndStrangers) {
  ConsistencyJudge j(id(1), "run");
  j.expect(5, hash(7), {id(1), id(2)});
  auto other = record(2, 5, 9);
  other.run_id = "other";
  j.on_member(other);
  j.on_member(record(2, 6, 9));  // another round
  j.on_member(record(8, 5, 9));  // not in the group
  j.on_member(record(1, 5, 9));  // ourselves
  EXPECT_EQ(j.mismatches(), 0u);
  j.on_member(record(2, 5, 9));
  j.on_member(record(2, 5, 9));  // counted once
  EXPECT_EQ(j.mismatches(), 1u);
}

}  // namespace
}  // namespace grove::gossip
