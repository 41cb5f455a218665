// Experiment 3: the DHT under churn.
//
// N nodes (default 1000) join one by one through a random earlier node and settle; R signed
// records are stored (their owners re-put them every 10 minutes, as grove-node does with its
// records). Then, for --minutes of virtual time, a share of the nodes (--replace, default 20%)
// is replaced every --period (10 min): spread evenly over the period, a random live node
// crashes (it goes silent: its peers learn only by timeouts) and a new node joins through a
// random live one. Meanwhile one find_node lookup for a random key and one get of a random
// record start every --every seconds from random live nodes. A lookup succeeds when it returns
// the live node closest to the key (and is "exact" when its k closest are the true k closest);
// a get succeeds when it returns the record. The same run without churn is the baseline.
// Links: the world model (sim/net_model.hpp: four regions, cloud, lab and home lines, 0.1%
// loss), or --rtt-ms/--loss for a uniform one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "sim/dht_network.hpp"
#include "sim/experiments.hpp"
#include "sim/net_model.hpp"

namespace grove::sim {

namespace {

using dht::Time;

struct Options {
  std::size_t nodes = 1000, records = 100;
  double minutes = 60, period_min = 10, replace = 0.2, every_s = 2;
  std::uint64_t seed = 1;
  std::optional<NetModel> net;
};

struct Minute {
  std::size_t lookups = 0, closest = 0, exact = 0, gets = 0, got = 0, unfinished = 0;
  std::vector<double> latency_ms;
  std::size_t alive = 0, replaced = 0;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::max<std::size_t>(rank, 1) - 1];
}

std::vector<Minute> run(const Options& o, bool churn) {
  dht::DhtOptions dopts;
  LinkModel link;
  link.jitter = Time(static_cast<std::int64_t>(o.net->jitter_ms));
  link.loss = o.net->loss;
  link.dead_refuses = false;
  DhtNetwork net(o.seed, link, dopts);
  std::vector<NetModel::Placement> place;
  std::mt19937_64 rng(o.seed * 7 + 3);
  net.set_latency(
      [&](std::size_t a, std::size_t b) { return o.net->one_way(place.at(a), place.at(b)); });
  const auto random_alive = [&](std::optional<std::size_t> except = std::nullopt) {
    const auto alive = net.alive_nodes();
    for (;;) {
      const std::size_t i = alive[rng() % alive.size()];
      if (!except || i != *except || alive.size() == 1) return i;
    }
  };
  const auto add = [&] {
    const auto existing = net.alive_nodes();
    place.push_back(o.net->place(rng));
    const std::size_t i = net.add_node();
    std::vector<std::string> boot;
    if (!existing.empty()) boot.push_back(net.address(existing[rng() % existing.size()]));
    net.call(i, [&](dht::DhtNode& d) { d.bootstrap(boot, net.now()); });
    return i;
  };
  for (std::size_t j = 0; j < o.nodes; ++j) {
    add();
    net.run_for(Time(100));
  }
  net.run_for(Time(60'000));

  // Records, each with an owner that re-puts it every 10 minutes while it lives (a replaced
  // owner's record is taken over by a new node, as a restarted member publishes its own).
  struct Rec {
    dht::Key key;
    std::vector<std::uint8_t> value;
    std::size_t owner;
  };
  std::vector<Rec> recs;
  const Time ttl = Time(std::chrono::minutes(30));
  const auto put = [&](Rec& r) {
    net.call(r.owner, [&](dht::DhtNode& d) {
      d.put_signed(r.key, "", static_cast<std::uint64_t>(net.now().count()), net.now() + ttl,
                   r.value, net.now());
    });
  };
  for (std::size_t k = 0; k < o.records; ++k) {
    Rec r{dht::key_of("sim-record-" + std::to_string(k)), std::vector<std::uint8_t>(64),
          random_alive()};
    for (auto& b : r.value) b = static_cast<std::uint8_t>(rng());
    put(r);
    recs.push_back(std::move(r));
  }
  net.run_for(Time(30'000));

  const Time t0 = net.now();
  const Time period = Time(static_cast<std::int64_t>(o.period_min * 60'000));
  const auto per_period = static_cast<std::size_t>(std::llround(o.replace * double(o.nodes)));
  const Time churn_gap = per_period ? Time(period.count() / std::int64_t(per_period)) : Time::max();
  const Time every = Time(static_cast<std::int64_t>(o.every_s * 1000));
  const Time end = t0 + Time(static_cast<std::int64_t>(o.minutes * 60'000));
  const Time limit = dopts.lookup_deadline + Time(10'000);
  std::vector<Minute> minutes(static_cast<std::size_t>(std::ceil(o.minutes)));
  const auto minute_of = [&](Time t) {
    return std::min(minutes.size() - 1, static_cast<std::size_t>((t - t0).count() / 60'000));
  };
  struct Pending {
    Time started;
    bool lookup;
    dht::Key target;
    std::size_t from;
  };
  auto pending = std::make_shared<std::map<std::uint64_t, Pending>>();
  std::uint64_t next_id = 0;
  Time next_churn = t0 + churn_gap, next_probe = t0, next_republish = t0 + Time(600'000);
  while (net.now() < end) {
    const Time step = std::min({next_churn, next_probe, next_republish, end});
    net.run_until(step);
    if (churn && net.now() >= next_churn) {
      next_churn += churn_gap;
      const std::size_t victim = random_alive();
      net.kill(victim);
      const std::size_t fresh = add();
      ++minutes[minute_of(net.now())].replaced;
      for (auto& r : recs)
        if (r.owner == victim) {
          r.owner = fresh;  // a new owner publishes it again (after joining)
          put(r);
        }
    } else if (!churn && net.now() >= next_churn) {
      next_churn += churn_gap;
    }
    if (net.now() >= next_republish) {
      next_republish += Time(600'000);
      for (auto& r : recs) put(r);
    }
    if (net.now() >= next_probe) {
      next_probe += every;
      auto& m = minutes[minute_of(net.now())];
      m.alive = net.alive_nodes().size();
      // A lookup for a random key.
      {
        const std::uint64_t id = next_id++;
        const std::size_t from = random_alive();
        const dht::Key target = dht::random_key(rng);
        (*pending)[id] = Pending{net.now(), true, target, from};
        net.call(from, [&, id, target, from](dht::DhtNode& d) {
          d.find_node(target, net.now(), [&, id, target, from, pending](dht::LookupResult r) {
            auto it = pending->find(id);
            if (it == pending->end()) return;
            auto& mm = minutes[minute_of(it->second.started)];
            ++mm.lookups;
            mm.latency_ms.push_back(double((net.now() - it->second.started).count()));
            // The oracle: the live nodes closest to the key (the requester excluded).
            std::vector<dht::NodeId> ids;
            for (auto i : net.alive_nodes())
              if (i != from) ids.push_back(net.node(i).id());
            const std::size_t k = std::min(dopts.k, ids.size());
            std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(),
                              [&](const dht::NodeId& a, const dht::NodeId& b) {
                                return dht::closer(target, a, b);
                              });
            std::set<dht::NodeId> got;
            for (const auto& c : r.closest) got.insert(c.id);
            if (k && got.contains(ids[0])) ++mm.closest;
            if (got == std::set<dht::NodeId>(ids.begin(), ids.begin() + std::ptrdiff_t(k)))
              ++mm.exact;
            pending->erase(it);
          });
        });
      }
      // A get of a random record.
      {
        const std::uint64_t id = next_id++;
        const std::size_t from = random_alive();
        const Rec& rec = recs[rng() % recs.size()];
        (*pending)[id] = Pending{net.now(), false, rec.key, from};
        const auto value = rec.value;
        const auto key = rec.key;
        net.call(from, [&, id, key, value](dht::DhtNode& d) {
          d.get(key, net.now(), [&, id, key, value, pending](dht::GetResult r) {
            auto it = pending->find(id);
            if (it == pending->end()) return;
            auto& mm = minutes[minute_of(it->second.started)];
            ++mm.gets;
            if (std::any_of(r.records.begin(), r.records.end(),
                            [&](const dht::Record& x) { return x.key == key && x.value == value; }))
              ++mm.got;
            pending->erase(it);
          });
        });
      }
      // Operations whose node died, or that ran past every deadline, count as failures.
      for (auto it = pending->begin(); it != pending->end();) {
        if (net.now() - it->second.started > limit || !net.alive(it->second.from)) {
          auto& mm = minutes[minute_of(it->second.started)];
          ++mm.unfinished;
          ++(it->second.lookup ? mm.lookups : mm.gets);
          it = pending->erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  return minutes;
}

}  // namespace

int run_dht_churn(const Args& a, const std::string& out) {
  Options o;
  o.nodes = a.count("nodes", 1000);
  o.records = a.count("records", 100);
  o.minutes = a.num("minutes", 60);
  o.period_min = a.num("period-min", 10);
  o.replace = a.num("replace", 0.2);
  o.every_s = a.num("every-s", 2);
  o.seed = a.count("seed", 1);
  const double rtt = a.num("rtt-ms", 0), loss = a.num("loss", 0.01);
  o.net = rtt > 0 ? NetModel::uniform(rtt, 1000, loss) : NetModel::world();
  if (o.nodes < 2 || o.records < 1 || o.minutes < 1 || o.period_min <= 0 || o.replace < 0 ||
      o.replace > 1 || o.every_s <= 0)
    throw std::invalid_argument(
        "dht-churn: need nodes >= 2, records >= 1, minutes >= 1, period-min > 0, "
        "0 <= replace <= 1, every-s > 0");
  std::printf("dht-churn: %zu nodes, %s links, %.0f%% replaced every %.0f min, %.0f min\n", o.nodes,
              rtt > 0 ? "uniform" : "world-model", 100 * o.replace, o.period_min, o.minutes);
  Csv csv(out + "/dht_churn.csv",
          {"series", "minute", "alive", "replaced", "lookups", "success", "exact_k", "gets",
           "get_success", "unfinished", "latency_p50_ms", "latency_p95_ms"});
  for (const bool churn : {false, true}) {
    const auto wall0 = std::chrono::steady_clock::now();
    const auto ms = run(o, churn);
    const std::string series = churn ? "churn" : "no churn";
    std::size_t L = 0, C = 0, E = 0, G = 0, GOT = 0, U = 0;
    std::vector<double> lat;
    for (std::size_t m = 0; m < ms.size(); ++m) {
      const auto& x = ms[m];
      L += x.lookups, C += x.closest, E += x.exact, G += x.gets, GOT += x.got, U += x.unfinished;
      lat.insert(lat.end(), x.latency_ms.begin(), x.latency_ms.end());
      const auto frac = [](std::size_t a, std::size_t b) {
        return b ? double(a) / double(b) : NAN;
      };
      csv.row({series, std::to_string(m + 1), std::to_string(x.alive), std::to_string(x.replaced),
               std::to_string(x.lookups), fmt(frac(x.closest, x.lookups)),
               fmt(frac(x.exact, x.lookups)), std::to_string(x.gets), fmt(frac(x.got, x.gets)),
               std::to_string(x.unfinished), fmt(quantile(x.latency_ms, 0.5)),
               fmt(quantile(x.latency_ms, 0.95))});
    }
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    std::printf(
        "%-9s lookups %zu: closest found %.2f%%, exact k %.2f%%, latency p50 %.0f ms p95 %.0f "
        "ms; gets %zu: found %.2f%%; unfinished %zu (%.0f s wall)\n",
        series.c_str(), L, L ? 100.0 * C / L : 0, L ? 100.0 * E / L : 0, quantile(lat, 0.5),
        quantile(lat, 0.95), G, G ? 100.0 * GOT / G : 0, U, wall);
    std::fflush(stdout);
  }
  std::printf("csv: %s\n", csv.path().c_str());
  plot("dht-churn", csv.path(), out + "/dht_churn.png");
  return 0;
}

}  // namespace grove::sim
