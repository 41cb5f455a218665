// The node's reachability and relay decisions (node/reach_upkeep.hpp), sans-IO.
#include "node/reach_upkeep.hpp"

#include <gtest/gtest.h>

namespace grove::node {
namespace {

using ms = std::chrono::milliseconds;
using transport::Reachability;

transport::NodeId id(std::uint8_t b) {
  transport::NodeId i{};
  i[0] = b;
  return i;
}

transport::ReachCheck::Verdict verdict(std::size_t helpers, std::vector<std::string> verified) {
  transport::ReachCheck::Verdict v;
  v.helpers = helpers;
  v.verified = std::move(verified);
  return v;
}

dht::MemberInfo member(std::uint8_t b, Reachability r, std::string address) {
  dht::MemberInfo m;
  m.id = id(b);
  m.reach = r;
  m.addresses = {std::move(address)};
  return m;
}

TEST(ReachUpkeep, AJoinerChecksAtOnceAndAdvertisesWhatWasReached) {
  ReachUpkeep u({"10.0.0.1:7000", "[fd00::1]:7000"}, 1, true, ms(0));
  EXPECT_EQ(u.next_check(), ms(0));
  EXPECT_EQ(u.reach(), Reachability::unchecked);
  EXPECT_EQ(u.dht_address(), "10.0.0.1:7000");
  auto c = u.begin_check({id(1), id(2), id(2), id(3), id(4), id(5), id(6)}, ms(0));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->helpers.size(), 4u);  // at most four, each once
  EXPECT_EQ(c->addresses.size(), 2u);
  EXPECT_FALSE(u.next_check());  // under way
  EXPECT_FALSE(u.begin_check({id(1)}, ms(1)));
  EXPECT_TRUE(u.on_verdict(verdict(3, {"[fd00::1]:7000"}), ms(8000)));
  EXPECT_EQ(u.reach(), Reachability::reachable);
  EXPECT_EQ(u.addresses(), std::vector<std::string>{"[fd00::1]:7000"});
  EXPECT_EQ(u.dialback(), u.addresses());
  EXPECT_EQ(u.next_check(), ms(8000 + 600'000));  // re-checked every 10 minutes
  EXPECT_FALSE(u.next_renewal());                 // reachable: no relays
}

TEST(ReachUpkeep, NobodyToAskKeepsTheCandidatesAndRetries) {
  ReachUpkeep u({"10.0.0.1:7000"}, 1, false, ms(0));
  EXPECT_EQ(u.next_check(), ms(10'000));  // the first node: once others have joined
  EXPECT_FALSE(u.begin_check({}, ms(10'000)));
  EXPECT_EQ(u.reach(), Reachability::unchecked);
  EXPECT_EQ(u.next_check(), ms(21'000));
  // A verdict stands when a later check finds nobody to answer.
  ASSERT_TRUE(u.begin_check({id(1)}, ms(21'000)));
  u.on_verdict(verdict(1, {"10.0.0.1:7000"}), ms(22'000));
  ASSERT_TRUE(u.begin_check({id(1)}, ms(622'000)));
  EXPECT_FALSE(u.on_verdict(verdict(0, {}), ms(630'000)));
  EXPECT_EQ(u.reach(), Reachability::reachable);
  EXPECT_EQ(u.next_check(), ms(630'000 + 11'000));
}

TEST(ReachUpkeep, UnreachableNodeKeepsTwoRelaysAndAdvertisesThem) {
  ReachUpkeep u({"192.168.1.2:7000"}, 7, true, ms(0));
  ASSERT_TRUE(u.begin_check({id(1), id(2)}, ms(0)));
  EXPECT_TRUE(u.on_verdict(verdict(2, {}), ms(8000)));
  EXPECT_EQ(u.reach(), Reachability::unreachable);
  EXPECT_TRUE(u.addresses().empty());
  EXPECT_EQ(u.dht_address(), "");
  EXPECT_TRUE(u.dialback().empty());
  EXPECT_EQ(u.next_renewal(), ms(8000));  // at once
  const std::vector<dht::MemberInfo> live = {
      member(9, Reachability::unreachable, "10.0.0.9:1"),  // cannot relay
      member(3, Reachability::unchecked, "10.0.0.3:1"),    // checked ones first
      member(4, Reachability::reachable, "10.0.0.4:1"),
      member(5, Reachability::reachable, "relay:ab@x:1"),  // a relay address: not a relay
      member(6, Reachability::reachable, "10.0.0.6:1"),
  };
  auto pick = u.begin_renewal(live, id(1), ms(8000));
  ASSERT_EQ(pick.size(), 2u);
  for (const auto& p : pick) EXPECT_TRUE(p.first == id(4) || p.first == id(6));
  EXPECT_FALSE(u.next_renewal());  // under way
  // One holds, one refuses: the refuser is not asked again for 5 minutes.
  EXPECT_TRUE(u.on_renewal({pick[0]}, {pick[1].first}, ms(9000)));
  ASSERT_EQ(u.addresses().size(), 1u);
  EXPECT_TRUE(u.addresses()[0].starts_with("relay:"));
  EXPECT_EQ(u.next_renewal(), ms(8000 + 5000));  // renewals every 5 s while it had none
  pick = u.begin_renewal(live, id(1), ms(13'000));
  ASSERT_EQ(pick.size(), 2u);
  EXPECT_EQ(pick[0], u.relays()[0]);  // the one we hold first
  EXPECT_NE(pick[1].first, pick[0].first);
  EXPECT_TRUE(pick[1].first == id(3));  // the refuser is skipped; an unchecked one is next
  EXPECT_EQ(u.next_renewal(), std::nullopt);
  EXPECT_FALSE(u.on_renewal({pick[0]}, {}, ms(14'000)));  // the same relays: nothing changes
  EXPECT_EQ(u.next_renewal(), ms(13'000 + 15'000));
}

TEST(ReachUpkeep, APortMappingIsCheckedAsSoonAsHelpersAnswerAgain) {
  ReachUpkeep u({"192.168.1.2:7000"}, 1, true, ms(0));
  ASSERT_TRUE(u.begin_check({id(1)}, ms(0)));
  u.set_mapped("203.0.113.5:7000", ms(1000));  // during the check: right after it
  EXPECT_EQ(u.candidates().front(), "203.0.113.5:7000");
  u.on_verdict(verdict(1, {}), ms(2000));
  EXPECT_EQ(u.next_check(), ms(2000 + 11'000));
  ASSERT_TRUE(u.begin_check({id(1)}, ms(13'000)));
  u.on_verdict(verdict(1, {"203.0.113.5:7000"}), ms(14'000));
  EXPECT_EQ(u.reach(), Reachability::reachable);
  u.set_mapped("", ms(20'000));  // the mapping went: checked 11 s after the last check
  EXPECT_EQ(u.candidates(), std::vector<std::string>{"192.168.1.2:7000"});
  EXPECT_EQ(u.next_check(), ms(13'000 + 11'000));
  u.stop();
  EXPECT_FALSE(u.next_check());
}

}  // namespace
}  // namespace grove::node
