#include "dht/routing_table.hpp"

#include <gtest/gtest.h>

namespace grove::dht {
namespace {

Contact in_bucket(const NodeId& self, int b, std::mt19937_64& rng, int n) {
  return {random_key_in_bucket(self, b, rng), "h:" + std::to_string(n)};
}

TEST(RoutingTable, BucketsHoldKAndReplacementsTakeOver) {
  std::mt19937_64 rng(3);
  const NodeId self = random_key(rng);
  RoutingTable t(self, RoutingOptions{});
  std::vector<Contact> live;
  for (int i = 0; i < 20; ++i) {
    live.push_back(in_bucket(self, 0, rng, i));
    EXPECT_FALSE(t.heard_from(live.back(), Time(1000 + i)));
  }
  EXPECT_EQ(t.size(), 20u);
  // A 21st contact waits as a replacement; the oldest entry is not stale yet: no ping asked.
  Contact extra = in_bucket(self, 0, rng, 99);
  EXPECT_FALSE(t.heard_from(extra, Time(2000)));
  EXPECT_EQ(t.size(), 20u);
  EXPECT_EQ(t.replacement_count(), 1u);
  EXPECT_FALSE(t.contains(extra.id));
  // Much later a newcomer makes the table ask for a ping of the stale oldest entry.
  Contact extra2 = in_bucket(self, 0, rng, 100);
  auto ping = t.heard_from(extra2, Time(1000 + 61'000));
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->id, live[0].id);
  // Two failures of an entry with replacements waiting evict it; the newest replacement enters.
  t.failed(live[5].id);
  EXPECT_TRUE(t.contains(live[5].id));
  t.failed(live[5].id);
  EXPECT_FALSE(t.contains(live[5].id));
  EXPECT_TRUE(t.contains(extra2.id));
  EXPECT_EQ(t.size(), 20u);
  // The evicted contact is dormant: offered for a later revival ping.
  auto dormant = t.take_dormant(5);
  ASSERT_EQ(dormant.size(), 1u);
  EXPECT_EQ(dormant[0].id, live[5].id);
  // Ourselves and address-less contacts never enter.
  t.heard_from({self, "me:1"}, Time(5000));
  t.heard_from({random_key_in_bucket(self, 3, rng), ""}, Time(5000));
  EXPECT_EQ(t.size(), 20u);
}

TEST(RoutingTable, ClosestIsSortedAndPrefersHealthy) {
  std::mt19937_64 rng(4);
  const NodeId self = random_key(rng);
  RoutingTable t(self, RoutingOptions{});
  std::vector<Contact> all;
  for (int i = 0; i < 300; ++i) {
    all.push_back({random_key(rng), "h:" + std::to_string(i)});
    t.heard_from(all.back(), Time(i));
  }
  const Key target = random_key(rng);
  auto c = t.closest(target, 20);
  ASSERT_EQ(c.size(), 20u);
  for (std::size_t i = 1; i < c.size(); ++i) EXPECT_TRUE(closer(target, c[i - 1].id, c[i].id));
  // Every entry not returned is farther than the last returned one.
  for (const auto& e : t.entries()) {
    bool in = false;
    for (auto& x : c) in |= x.id == e.contact.id;
    if (!in) {
      EXPECT_TRUE(closer(target, c.back().id, e.contact.id));
    }
  }
  // A failing entry drops behind healthy ones.
  t.failed(c[0].id);
  auto c2 = t.closest(target, 20);
  for (auto& x : c2) EXPECT_NE(x.id, c[0].id);
}

}  // namespace
}  // namespace grove::dht
