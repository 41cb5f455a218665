// Builds simulated DHT swarms for the tests: nodes join one after another through random
// earlier nodes, then the swarm settles. Includes the oracle for "the true k closest".
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "sim/dht_network.hpp"

namespace grove::dht::test {

using namespace std::chrono_literals;
using sim::DhtNetwork;
using sim::LinkModel;

inline DhtOptions sim_options() {
  DhtOptions o;
  o.refresh_interval = Time(std::chrono::minutes(5));
  return o;
}

/// Adds `n` nodes; each bootstraps from up to `contacts` random nodes already present.
inline void grow(DhtNetwork& net, std::size_t n, std::mt19937_64& rng, std::size_t contacts = 1,
                 Time gap = Time(200)) {
  for (std::size_t j = 0; j < n; ++j) {
    const auto existing = net.alive_nodes();
    const std::size_t i = net.add_node();
    std::vector<std::string> boot;
    for (std::size_t c = 0; c < contacts && !existing.empty(); ++c)
      boot.push_back(net.address(existing[rng() % existing.size()]));
    net.call(i, [&](DhtNode& d) { d.bootstrap(boot, net.now()); });
    net.run_for(gap);
  }
}

/// The k alive nodes closest to target, other than `except` (oracle).
inline std::set<NodeId> true_closest(DhtNetwork& net, const Key& target, std::size_t k,
                                     std::optional<std::size_t> except = std::nullopt) {
  std::vector<NodeId> ids;
  for (auto i : net.alive_nodes())
    if (i != except) ids.push_back(net.node(i).id());
  std::sort(ids.begin(), ids.end(),
            [&](const NodeId& a, const NodeId& b) { return closer(target, a, b); });
  ids.resize(std::min(k, ids.size()));
  return {ids.begin(), ids.end()};
}

/// Runs a lookup from node `from` to completion and returns its result.
inline std::optional<LookupResult> lookup(DhtNetwork& net, std::size_t from, const Key& target) {
  std::optional<LookupResult> out;
  net.call(from,
           [&](DhtNode& d) { d.find_node(target, net.now(), [&](LookupResult r) { out = r; }); });
  net.run_until([&] { return out.has_value(); }, Time(60'000));
  return out;
}

inline std::optional<GetResult> get(DhtNetwork& net, std::size_t from, const Key& key,
                                    GetOptions go = {}) {
  std::optional<GetResult> out;
  net.call(from, [&](DhtNode& d) {
    d.get(
        key, net.now(), [&](GetResult r) { out = std::move(r); }, go);
  });
  net.run_until([&] { return out.has_value(); }, Time(60'000));
  return out;
}

inline std::optional<PutResult> put(DhtNetwork& net, std::size_t from, const Key& key,
                                    std::string subkey, std::uint64_t seq, Time ttl,
                                    std::vector<std::uint8_t> value) {
  std::optional<PutResult> out;
  net.call(from, [&](DhtNode& d) {
    d.put_signed(key, std::move(subkey), seq, net.now() + ttl, std::move(value), net.now(),
                 [&](PutResult r) { out = r; });
  });
  net.run_until([&] { return out.has_value(); }, Time(60'000));
  return out;
}

}  // namespace grove::dht::test
