// Whole-swarm properties on the deterministic simulated network (sim/dht_network).
#include "tests/dht/swarm_util.hpp"

namespace grove::dht::test {
namespace {

TEST(Swarm, FindNodeReturnsTrueClosest) {
  DhtNetwork net(1, LinkModel{Time(20), Time(5), 0.0}, sim_options());
  std::mt19937_64 rng(7);
  grow(net, 200, rng);
  net.run_for(Time(60'000));
  const std::size_t k = net.node(0).options().k;
  int exact = 0, total = 0;
  std::size_t hops = 0;
  for (int t = 0; t < 1000; ++t) {
    const Key target = random_key(rng);
    const auto nodes = net.alive_nodes();
    const std::size_t from = nodes[rng() % nodes.size()];
    auto r = lookup(net, from, target);
    ASSERT_TRUE(r);
    std::set<NodeId> got;
    for (auto& c : r->closest) got.insert(c.id);
    ++total;
    exact += got == true_closest(net, target, k, from);
    hops += r->hops;
  }
  RecordProperty("exact", exact);
  std::printf("find_node exact k-closest: %d/%d, mean hops %.2f\n", exact, total,
              double(hops) / total);
  EXPECT_GE(exact, total * 999 / 1000);
}

}  // namespace
}  // namespace grove::dht::test

namespace grove::dht::test {
namespace {

std::vector<std::uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

// 200 nodes hold 100 records; 20% of the nodes are replaced, one every 2 s, while GETs run.
TEST(Swarm, GetSucceedsWhileTwentyPercentReplaced) {
  DhtNetwork net(2, LinkModel{Time(20), Time(5), 0.0}, sim_options());
  std::mt19937_64 rng(11);
  grow(net, 200, rng);
  net.run_for(Time(30'000));
  std::vector<Key> keys;
  for (int i = 0; i < 100; ++i) {
    keys.push_back(key_of("record-" + std::to_string(i)));
    const auto nodes = net.alive_nodes();
    auto r = put(net, nodes[rng() % nodes.size()], keys.back(), "", 1, Time(3'600'000),
                 bytes_of("value-" + std::to_string(i)));
    ASSERT_TRUE(r);
    ASSERT_GE(r->acked, 10u);
  }
  int ok = 0, total = 0;
  for (int round = 0; round < 40; ++round) {
    // Replace one node: a random one leaves, a new one joins through a random live node.
    auto nodes = net.alive_nodes();
    net.kill(nodes[rng() % nodes.size()]);
    grow(net, 1, rng, 1, Time(1000));
    for (int g = 0; g < 5; ++g) {
      nodes = net.alive_nodes();
      const int idx = static_cast<int>(rng() % keys.size());
      auto r = get(net, nodes[rng() % nodes.size()], keys[idx]);
      ++total;
      const bool good = r && r->records.size() == 1 &&
                        r->records[0].value == bytes_of("value-" + std::to_string(idx));
      ok += good;
    }
    net.run_for(Time(1000));
  }
  std::printf("GET under churn: %d/%d\n", ok, total);
  EXPECT_GE(ok * 100, total * 99);
}

// 16 nodes started at (almost) the same time with the same 3-address bootstrap list end up in
// one DHT (every node knows every other) — in 100 seeded trials out of 100.
TEST(Swarm, ColdStartFormsOneDht) {
  int formed = 0;
  for (int trial = 0; trial < 100; ++trial) {
    LinkModel m{Time(20), Time(10), 0.01};
    m.dead_refuses = true;
    DhtNetwork net(1000 + trial, m, sim_options());
    std::mt19937_64 rng(trial);
    for (int i = 0; i < 16; ++i) net.add_node();
    const std::vector<std::string> boot = {net.address(0), net.address(1), net.address(2)};
    // Start in random order within half a second.
    std::vector<std::size_t> order(16);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (auto i : order) {
      net.call(i, [&](DhtNode& d) { d.bootstrap(boot, net.now()); });
      net.run_for(Time(rng() % 40));
    }
    const bool ok = net.run_until(
        [&] {
          for (std::size_t i = 0; i < 16; ++i)
            if (net.node(i).table().size() != 15) return false;
          return true;
        },
        Time(120'000));
    formed += ok;
    if (!ok) {
      for (std::size_t i = 0; i < 16; ++i)
        std::printf("trial %d node %zu table %zu\n", trial, i, net.node(i).table().size());
    }
  }
  std::printf("cold start formed one DHT: %d/100\n", formed);
  EXPECT_EQ(formed, 100);
}

// A record put by a node that is still alone (a bootstrap node's state offer) is stored on
// that node only. As the swarm grows around it, the nodes nearest to the key must come to hold
// it (Kademlia's hand-over to newcomers), well before the 5-minute republish: otherwise joiners,
// whose lookups end at the nodes nearest to the key, find nothing. The key is chosen on the far
// side of the ID space from the writer, so that the writer is not itself among the k nearest.
TEST(Swarm, RecordPutWhileAloneIsFoundByLaterJoiners) {
  DhtNetwork net(5, LinkModel{Time(20), Time(5), 0.0}, sim_options());
  const Time t0 = net.now();
  const std::size_t first = net.add_node();
  net.call(first, [&](DhtNode& d) { d.bootstrap({}, net.now()); });
  Key key = net.node(first).id();
  key[0] ^= 0x80;
  auto r = put(net, first, key, "offer", 1, Time(3'600'000), bytes_of("state of round 0"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->acked, 0u);
  EXPECT_TRUE(r->local);
  std::mt19937_64 rng(21);
  grow(net, 80, rng);  // 16 s: far less than the republish interval
  const std::size_t k = net.node(first).options().k;
  ASSERT_FALSE(true_closest(net, key, k).contains(net.node(first).id()));
  int found = 0;
  for (auto i : net.alive_nodes()) {
    if (i == first) continue;
    auto g = get(net, i, key, GetOptions{1});
    ASSERT_TRUE(g);
    found += !g->records.empty();
  }
  std::size_t holders = 0;
  for (auto i : net.alive_nodes()) holders += !net.node(i).storage().all(key, net.now()).empty();
  std::printf("found by %d of 80 joiners; %zu nodes hold it after %.0f s\n", found, holders,
              std::chrono::duration<double>(net.now() - t0).count());
  EXPECT_EQ(found, 80);
  EXPECT_LE(holders, 3 * k);  // one copy per newcomer near the key, not one per holder
}

// Two halves cut apart for 3 minutes write under one key on both sides; after the cut heals,
// every node's GET sees both sides' records and the routing tables reconnect.
TEST(Swarm, PartitionHealsAndViewsMerge) {
  DhtNetwork net(3, LinkModel{Time(20), Time(5), 0.0}, sim_options());
  std::mt19937_64 rng(5);
  grow(net, 100, rng);
  net.run_for(Time(30'000));
  net.set_partition([](std::size_t i) { return static_cast<int>(i % 2); });
  const Key run = key_of("run/partition");
  net.run_for(Time(60'000));
  for (std::size_t i = 0; i < 20; ++i) {
    auto r =
        put(net, i, run, "member", 1, Time(3'600'000), bytes_of("side " + std::to_string(i % 2)));
    ASSERT_TRUE(r);
    EXPECT_GT(r->acked, 0u);
  }
  // During the cut each side sees only its own writers.
  auto during = get(net, 0, run);
  ASSERT_TRUE(during);
  EXPECT_EQ(during->records.size(), 10u);
  net.run_for(Time(120'000));
  net.set_partition(nullptr);
  net.run_for(Time(120'000));
  int complete = 0;
  for (auto i : net.alive_nodes()) {
    auto r = get(net, i, run);
    complete += r && r->records.size() == 20;
  }
  std::printf("after healing: %d/100 nodes see all 20 writers\n", complete);
  EXPECT_EQ(complete, 100);
  // Tables reconnect across the former cut.
  int cross = 0;
  for (auto i : net.alive_nodes())
    for (auto& e : net.node(i).table().entries()) {
      const auto s = e.contact.address;
      const std::size_t j = std::stoul(s.substr(4));
      cross += (j % 2) != (i % 2);
    }
  EXPECT_GT(cross, 100 * 5);
}

}  // namespace
}  // namespace grove::dht::test

namespace grove::dht::test {
namespace {

// A key every member reads often (the members' dictionary): quorum reads from the nearest
// holders make those few nodes serve every reader; spread reads draw their holders among the k
// nearest, so the busiest node serves far less, and every read still finds every record.
TEST(Swarm, SpreadGetsShareTheHoldersLoad) {
  DhtNetwork net(5, LinkModel{Time(20), Time(5), 0.0}, sim_options());
  std::mt19937_64 rng(13);
  grow(net, 100, rng);
  net.run_for(Time(30'000));
  const Key key = key_of("much-read");
  for (std::size_t i = 0; i < 30; ++i) {
    auto r = put(net, i, key, "m", 1, Time(3'600'000), std::vector<std::uint8_t>(600, 7));
    ASSERT_TRUE(r);
    ASSERT_GE(r->acked, 10u);
  }
  auto busiest = [&](bool spread, std::size_t& complete) {
    std::vector<std::uint64_t> before(net.size());
    for (std::size_t i = 0; i < net.size(); ++i) before[i] = net.bytes_sent(i);
    complete = 0;
    for (int g = 0; g < 200; ++g) {
      auto r = get(net, rng() % net.size(), key, GetOptions{4, spread});
      complete += r && r->records.size() == 30;
    }
    std::uint64_t most = 0;
    for (std::size_t i = 0; i < net.size(); ++i)
      most = std::max(most, net.bytes_sent(i) - before[i]);
    return most;
  };
  std::size_t nearest_complete = 0, spread_complete = 0;
  const auto nearest = busiest(false, nearest_complete);
  const auto spread = busiest(true, spread_complete);
  std::printf(
      "busiest node over 200 reads: nearest holders %llu bytes, spread %llu bytes; "
      "complete reads %zu / %zu\n",
      static_cast<unsigned long long>(nearest), static_cast<unsigned long long>(spread),
      nearest_complete, spread_complete);
  EXPECT_GE(nearest_complete, 198u);
  EXPECT_GE(spread_complete, 198u);
  EXPECT_LT(spread * 2, nearest);
}

// Fewer nodes than the quorum: a spread read that asked some of them for contacts only asks
// them again for the records.
TEST(Swarm, SpreadGetInATinySwarmStillReadsEveryHolder) {
  DhtNetwork net(6, LinkModel{Time(20), Time(5), 0.0}, sim_options());
  std::mt19937_64 rng(17);
  grow(net, 3, rng, 2);
  net.run_for(Time(10'000));
  const Key key = key_of("tiny");
  for (std::size_t i = 0; i < 3; ++i)
    ASSERT_TRUE(put(net, i, key, "m", 1, Time(3'600'000), std::vector<std::uint8_t>(10, 1)));
  for (int g = 0; g < 50; ++g) {
    auto r = get(net, g % 3, key, GetOptions{4, true});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->records.size(), 3u);
    EXPECT_GE(r->responders, 2u);  // the two other nodes (our own copy is not a response)
  }
}

}  // namespace
}  // namespace grove::dht::test
