// DHT lookup benchmark on the simulated network (sim::DhtNetwork, virtual time): how lookups
// scale with the swarm size. For every N in 16, 32, ..., 512, 1000 (up to --max):
//   1. N nodes join one by one, each bootstrapping from one random earlier node (200 ms apart),
//      then the swarm settles for 60 s; links: 40 ms one-way latency, +-10 ms jitter, 1 % loss;
//   2. --records signed records are put from random nodes;
//   3. --lookups find_node lookups for random targets from random nodes, one after another,
//      each checked against an oracle (the true k closest alive nodes other than the requester);
//   4. --lookups get()s of random records of step 2 from random nodes.
// Printed per N: hops (LookupResult::hops) mean and p95, and hops / log2 N (the baseline log2 N
// of the same row); lookup latency in virtual ms; requests per lookup (LookupResult::queried);
// the exact-k-closest rate; the GET success rate; lookups/gets that did not finish within 60 s
// of virtual time; and the row's wall-clock seconds. Deterministic for a given --seed.
//
//   dht_lookup_bench [--max N] [--lookups L] [--records R] [--seed S] [--loss-pct P]
// (--loss-pct changes the 1 % message loss, to see what loss costs.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bench/args.hpp"
#include "sim/dht_network.hpp"

namespace {
using namespace grove;
using dht::Time;
using sim::DhtNetwork;

struct Options {
  std::size_t max_nodes = 1000;
  std::size_t lookups = 200;
  std::size_t records = 50;
  std::uint64_t seed = 1;
  double loss = 0.01;
};

struct Row {
  std::size_t n = 0;
  std::vector<double> hops, latency_ms, queried;
  std::size_t exact = 0, lookups_done = 0, lookups_unfinished = 0;
  std::size_t gets_ok = 0, gets = 0, gets_unfinished = 0;
  std::size_t puts_acked = 0;
  double wall_s = 0;
};

constexpr Time kLimit{60'000};  // virtual time one operation may take

dht::DhtOptions sim_options() {
  dht::DhtOptions o;  // as the swarm tests (tests/dht/swarm_util.hpp)
  o.refresh_interval = Time(std::chrono::minutes(5));
  return o;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

/// Nearest-rank 95th percentile.
double p95(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(v.size())));
  return v[std::max<std::size_t>(rank, 1) - 1];
}

/// The k alive nodes closest to target, other than `except` (oracle).
std::set<dht::NodeId> true_closest(DhtNetwork& net, const dht::Key& target, std::size_t k,
                                   std::size_t except) {
  std::vector<dht::NodeId> ids;
  for (auto i : net.alive_nodes())
    if (i != except) ids.push_back(net.node(i).id());
  const std::size_t m = std::min(k, ids.size());
  std::partial_sort(
      ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(m), ids.end(),
      [&](const dht::NodeId& a, const dht::NodeId& b) { return dht::closer(target, a, b); });
  return {ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(m)};
}

Row run_row(std::size_t n, const Options& opt) {
  const auto wall_start = std::chrono::steady_clock::now();
  Row row;
  row.n = n;
  const std::uint64_t seed = opt.seed * 0x9E3779B97F4A7C15ull + n;
  sim::LinkModel model;
  model.latency = Time(40);
  model.jitter = Time(10);
  model.loss = opt.loss;
  const dht::DhtOptions dopts = sim_options();
  DhtNetwork net(seed, model, dopts);
  std::mt19937_64 rng(seed ^ 0xB5AD4ECEDA1CE2A9ull);
  auto random_node = [&] {
    const auto alive = net.alive_nodes();
    return alive[rng() % alive.size()];
  };

  // 1. Join one by one through a random earlier node, then settle.
  for (std::size_t j = 0; j < n; ++j) {
    const auto existing = net.alive_nodes();
    const std::size_t i = net.add_node();
    std::vector<std::string> boot;
    if (!existing.empty()) boot.push_back(net.address(existing[rng() % existing.size()]));
    net.call(i, [&](dht::DhtNode& d) { d.bootstrap(boot, net.now()); });
    net.run_for(Time(200));
  }
  net.run_for(Time(60'000));

  // 2. Records.
  std::vector<std::pair<dht::Key, std::vector<std::uint8_t>>> records;
  for (std::size_t r = 0; r < opt.records; ++r) {
    const dht::Key key = dht::key_of("bench-record-" + std::to_string(r));
    std::vector<std::uint8_t> value(64);
    for (auto& b : value) b = static_cast<std::uint8_t>(rng());
    std::optional<dht::PutResult> out;
    net.call(random_node(), [&](dht::DhtNode& d) {
      d.put_signed(key, "", 1, net.now() + Time(std::chrono::hours(1)), value, net.now(),
                   [&](dht::PutResult p) { out = p; });
    });
    net.run_until([&] { return out.has_value(); }, kLimit);
    if (out && out->acked > 0) ++row.puts_acked;
    records.emplace_back(key, std::move(value));
  }

  // 3. find_node lookups.
  for (std::size_t l = 0; l < opt.lookups; ++l) {
    const std::size_t from = random_node();
    const dht::Key target = dht::random_key(rng);
    const Time start = net.now();
    std::optional<dht::LookupResult> out;
    Time end{0};
    net.call(from, [&](dht::DhtNode& d) {
      d.find_node(target, net.now(), [&](dht::LookupResult r) {
        out = std::move(r);
        end = net.now();
      });
    });
    net.run_until([&] { return out.has_value(); }, kLimit);
    if (!out) {
      ++row.lookups_unfinished;
      continue;
    }
    ++row.lookups_done;
    row.hops.push_back(static_cast<double>(out->hops));
    row.latency_ms.push_back(static_cast<double>((end - start).count()));
    row.queried.push_back(static_cast<double>(out->queried));
    std::set<dht::NodeId> got;
    for (const auto& c : out->closest) got.insert(c.id);
    if (got == true_closest(net, target, dopts.k, from)) ++row.exact;
  }

  // 4. GETs of the records.
  for (std::size_t g = 0; g < opt.lookups && !records.empty(); ++g) {
    const auto& [key, value] = records[rng() % records.size()];
    std::optional<dht::GetResult> out;
    net.call(random_node(), [&](dht::DhtNode& d) {
      d.get(key, net.now(), [&](dht::GetResult r) { out = std::move(r); });
    });
    net.run_until([&] { return out.has_value(); }, kLimit);
    ++row.gets;
    if (!out) {
      ++row.gets_unfinished;
      continue;
    }
    const auto& v = value;
    if (std::any_of(out->records.begin(), out->records.end(),
                    [&](const dht::Record& r) { return r.key == key && r.value == v; }))
      ++row.gets_ok;
  }
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return row;
}

double pct(std::size_t a, std::size_t b) {
  return b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0;
}

void print_row(const Row& r) {
  const double lg = std::log2(static_cast<double>(r.n));
  const double hops = mean(r.hops);
  std::printf("%5zu %6.2f %6.2f %5.0f %9.3f %8.0f %8.0f %9.1f %7.1f %7.1f %9zu/%zu %6.1f\n", r.n,
              lg, hops, p95(r.hops), hops / lg, mean(r.latency_ms), p95(r.latency_ms),
              mean(r.queried), pct(r.exact, r.lookups_done), pct(r.gets_ok, r.gets),
              r.lookups_unfinished, r.gets_unfinished, r.wall_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  bench::Args args(argc, argv, "[--max N] [--lookups L] [--records R] [--seed S] [--loss-pct P]");
  while (args.next()) {
    if (args.is("--loss-pct")) {
      opt.loss = args.number(0.0, 100.0) / 100;
    } else if (args.is("--max")) {
      opt.max_nodes = args.number<std::size_t>();
    } else if (args.is("--lookups")) {
      opt.lookups = args.number<std::size_t>();
    } else if (args.is("--records")) {
      opt.records = args.number<std::size_t>();
    } else if (args.is("--seed")) {
      opt.seed = args.number<std::uint64_t>();
    } else {
      args.unknown();
    }
  }
  const dht::DhtOptions d = sim_options();
  std::printf(
      "DHT lookups in a simulated swarm (virtual time): k=%zu alpha=%zu rpc_timeout=%lld ms, "
      "links 40 ms +-10 ms, %g%% loss;\njoin via 1 random node every 200 ms, settle 60 s; %zu "
      "records put; %zu find_node lookups and %zu gets per row, sequential; seed %llu\n\n",
      d.k, d.alpha, static_cast<long long>(d.rpc_timeout.count()), opt.loss * 100, opt.records,
      opt.lookups, opt.lookups, static_cast<unsigned long long>(opt.seed));
  std::printf("%5s %6s %6s %5s %9s %8s %8s %9s %7s %7s %11s %6s\n", "N", "log2N", "hops", "p95",
              "hops/lgN", "lat ms", "p95 ms", "msgs/lkp", "exact%", "get ok%", "unfinished",
              "wall s");
  for (std::size_t n : {16, 32, 64, 128, 256, 512, 1000}) {
    if (n > opt.max_nodes) break;
    print_row(run_row(n, opt));
  }
  std::printf(
      "\nhops: longest chain of replies that led to a closer node; hops/lgN: mean hops / log2 N;\n"
      "msgs/lkp: requests sent per lookup (queried); exact%%: result == the true k closest "
      "alive nodes\nother than the requester; unfinished: lookups/gets with no result after "
      "60 s of virtual time.\n");
  return 0;
}
