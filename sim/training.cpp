// Experiments 2 and 4: training in a simulated swarm (sim::Swarm: the real DHT, membership,
// matchmaking, exchange, all-reduce and outer optimizers; a Workload's real SGD as the inner
// phase).
//
// spread  For every N and H: N nodes train the workload with NoLoCo and, separately, with DiLoCo
//         for the same number of inner steps per node (--steps), then report the mean loss of
//         the nodes' slow weights, the loss at their mean, and the replica spread (RMS distance
//         of each node's φ from the nodes' mean φ, per value).
// churn   N nodes train; between 20% and 80% of the run, --share of them leave (half gracefully,
//         half by crashing) and as many new nodes join, spread evenly. The mean loss of the live
//         nodes per minute, against the same run without churn.
// scale   The whole swarm at N = 16 ... 1024: nodes join one after another over --join-minutes,
//         then train for --minutes. Per N: how long a join took (DHT bootstrap and state
//         download), the control plane's traffic per node (every DHT byte: member records and
//         polls, ready records and reads, state offers, lookups), how complete the member views
//         are, rounds per minute, the share of rounds averaged with a partner, and the loss.
// Inner steps take --step-ms of virtual time, ±20% per node (heterogeneous machines); links are
// the world model (regions, cloud/lab/home lines, 0.1% loss) unless --rtt-ms is given.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "sim/experiments.hpp"
#include "sim/swarm.hpp"

namespace grove::sim {

namespace {

using dht::Time;
using gossip::OuterMode;

struct Setup {
  std::string workload = "quadratic";
  double step_ms = 100;
  double rtt_ms = 0, loss = 0;
  std::uint64_t seed = 1;
};

Setup read_setup(const Args& a) {
  Setup s;
  s.workload = a.str("workload", "quadratic");
  s.step_ms = a.num("step-ms", 100);
  s.rtt_ms = a.num("rtt-ms", 0);
  s.loss = a.num("loss", 0.0);
  s.seed = a.count("seed", 1);
  if (s.workload != "quadratic" && s.workload != "mlp")
    throw std::invalid_argument("--workload: quadratic or mlp");
  if (s.step_ms <= 0) throw std::invalid_argument("--step-ms must be > 0");
  return s;
}

std::shared_ptr<Workload> workload(const Setup& s, std::uint32_t h) {
  if (s.workload == "mlp") {
    MlpOptions o;
    o.inner_steps = h;
    return make_tiny_mlp(s.seed, o);
  }
  QuadraticOptions o;
  o.inner_steps = h;
  o.lr = 0.1f;  // with gradient noise: small steps, so that H matters
  return make_quadratic(s.seed, o);
}

// An --outer choice: the mode, and DiLoCo-mode rounds' compressed messages (with SparseLoCo's
// own outer step: lr 1.0, no momentum).
struct Outer {
  OuterMode mode = OuterMode::noloco;
  std::optional<gossip::CompressedRounds> compressed;
  bool sparseloco = false;
  std::size_t fragments = 1;     ///< --fragments: a round averages one of that many fragments
  std::size_t noloco_group = 2;  ///< --noloco-group
  optim::NoLoCoConfig noloco = optim::kNoLoCoGrove;  ///< --noloco-variant, --noloco-lookahead
};

// --noloco-variant grove|paper (the node's: optim::kNoLoCoGrove, kNoLoCoPaper), --noloco-group G
// and --noloco-lookahead L: NoLoCo's variant (gossip::RoundOptions).
void read_noloco(const Args& a, Outer& outer) {
  const std::string v = a.str("noloco-variant", "grove");
  if (v != "grove" && v != "paper") throw std::invalid_argument("--noloco-variant: grove or paper");
  outer.noloco = v == "grove" ? optim::kNoLoCoGrove : optim::kNoLoCoPaper;
  outer.noloco_group = static_cast<std::size_t>(a.count("noloco-group", 2));
  outer.noloco.lookahead = static_cast<float>(a.num("noloco-lookahead", 0.0));
  if (outer.noloco_group < 2 || outer.noloco_group > 64 || !(outer.noloco.lookahead >= 0.0f) ||
      outer.noloco.lookahead >= 1.0f)
    throw std::invalid_argument("--noloco-group: 2 to 64; --noloco-lookahead: 0 to 0.999");
}

// --fragments F (dividing H): a round every H/F inner steps averages one fragment of φ. Returns the
// inner steps of a round.
std::uint32_t read_fragments(const Args& a, Outer& outer, std::uint32_t h) {
  outer.fragments = static_cast<std::size_t>(a.count("fragments", 1));
  if (outer.fragments < 1 || outer.fragments > 64 || h % outer.fragments != 0)
    throw std::invalid_argument("--fragments: 1 to 64, dividing --inner-steps");
  return h / static_cast<std::uint32_t>(outer.fragments);
}

Outer parse_outer(const std::string& s) {
  Outer o;
  if (s == "noloco") return o;
  o.mode = OuterMode::diloco;
  if (s == "diloco") return o;
  if (s == "sparseloco") {
    o.compressed = gossip::CompressedRounds::sparseloco();
    o.sparseloco = true;
  } else if (s == "e3m0") {
    o.compressed = gossip::CompressedRounds::e3m0();
  } else {
    throw std::invalid_argument("--outer: noloco, diloco, sparseloco or e3m0");
  }
  return o;
}

SwarmOptions swarm_options(const Setup& s, const Outer& outer, std::shared_ptr<Workload> w) {
  SwarmOptions o = fast_options(outer.mode);
  o.round.compressed = outer.compressed;
  o.round.fragments = outer.fragments;
  o.round.noloco_group = outer.noloco_group;
  o.round.noloco = outer.noloco;
  if (outer.sparseloco) {
    o.round.diloco.lr = 1.0f;
    o.round.diloco.momentum = 0.0f;
  }
  o.workload = std::move(w);
  o.net = s.rtt_ms > 0 ? NetModel::uniform(s.rtt_ms, 1000, s.loss) : NetModel::world();
  // Membership at grove-node's own cadence: large swarms would otherwise spend the simulation
  // re-reading member records.
  o.membership = dht::MembershipOptions{};
  o.round.exchange.chunk_timeout = Time(10'000);
  o.round.allreduce.chunk_timeout = Time(10'000);
  o.round.allreduce.heartbeat = Time(1000);
  return o;
}

NodeSpec node_spec(const Setup& s, std::uint32_t h, std::mt19937_64& rng) {
  const double f = std::uniform_real_distribution<double>(0.8, 1.2)(rng);
  NodeSpec spec;
  spec.inner_time = Time(static_cast<std::int64_t>(s.step_ms * h * f));
  return spec;
}

struct Snapshot {
  std::size_t live = 0;
  double mean_loss = NAN, loss_at_mean = NAN, spread = NAN;
  std::uint64_t round_min = 0, round_max = 0;
};

Snapshot snapshot(Swarm& s) {
  Snapshot r;
  std::vector<std::size_t> ids;
  for (std::size_t i = 0; i < s.size(); ++i)
    // (A node whose outer step is running holds no φ meanwhile: NodeSpec::step_time.)
    if (s.alive(i) && !s.leaving(i) && s.engine(i).has_state() && !s.engine(i).stepping())
      ids.push_back(i);
  r.live = ids.size();
  if (ids.empty()) return r;
  const std::size_t P = s.engine(ids[0]).state().phi.size();
  std::vector<double> mean(P, 0.0);
  double loss = 0;
  r.round_min = UINT64_MAX;
  for (auto i : ids) {
    const auto& phi = s.engine(i).state().phi;
    for (std::size_t k = 0; k < P; ++k) mean[k] += phi[k];
    loss += s.loss(i);
    r.round_min = std::min(r.round_min, s.engine(i).state().round);
    r.round_max = std::max(r.round_max, s.engine(i).state().round);
  }
  for (auto& v : mean) v /= static_cast<double>(ids.size());
  double sq = 0;
  for (auto i : ids) {
    const auto& phi = s.engine(i).state().phi;
    for (std::size_t k = 0; k < P; ++k) sq += (phi[k] - mean[k]) * (phi[k] - mean[k]);
  }
  r.spread = std::sqrt(sq / static_cast<double>(ids.size() * P));
  r.mean_loss = loss / static_cast<double>(ids.size());
  std::vector<float> m(mean.begin(), mean.end());
  r.loss_at_mean = s.options().workload->loss(m);
  return r;
}

// Grows the swarm, then runs until every node has ended `steps` ÷ H more rounds (its inner
// steps since the last node joined) or the virtual limit passes.
Snapshot train(Swarm& s, std::size_t n, const Setup& st, std::uint32_t h, std::uint64_t steps,
               std::mt19937_64& rng) {
  s.bootstrap(node_spec(st, h, rng));
  for (std::size_t i = 1; i < n; ++i) s.join(i - 1, node_spec(st, h, rng));
  s.run_until(
      [&] {
        for (std::size_t i = 0; i < s.size(); ++i)
          if (!s.engine(i).has_state()) return false;
        return true;
      },
      Time(600'000));
  std::vector<std::size_t> base(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) base[i] = s.rounds(i);
  const std::uint64_t rounds = (steps + h - 1) / h;
  const Time limit = Time(static_cast<std::int64_t>(st.step_ms * double(steps) * 20 + 600'000));
  s.run_until(
      [&] {
        for (std::size_t i = 0; i < s.size(); ++i)
          if (s.alive(i) && s.rounds(i) < base[i] + rounds) return false;
        return true;
      },
      limit);
  return snapshot(s);
}

}  // namespace

int run_spread(const Args& a, const std::string& out) {
  const Setup st = read_setup(a);
  const auto ns = a.list("nodes", {8, 16, 32, 64, 128});
  const auto hs = a.list("inner-steps", {10, 50, 200});
  const std::uint64_t steps = a.count("steps", 2000);
  for (double n : ns)
    if (n < 2 || n != std::floor(n) || n > 4096)
      throw std::invalid_argument("--nodes: whole numbers in 2..4096");
  for (double h : hs)
    if (h < 1 || h != std::floor(h))
      throw std::invalid_argument("--inner-steps: whole numbers >= 1");
  std::printf("spread: %s, %llu inner steps per node, %.0f ms per step, %s links\n",
              st.workload.c_str(), static_cast<unsigned long long>(steps), st.step_ms,
              st.rtt_ms > 0 ? "uniform" : "world-model");
  Csv csv(out + "/spread.csv",
          {"series", "mode", "inner_steps", "nodes", "final_loss", "loss_at_mean", "final_spread",
           "round_min", "round_max", "averaged_share", "virtual_s", "wall_s"});
  std::printf("%-7s %5s %5s %12s %12s %12s %9s %8s\n", "mode", "H", "N", "mean loss", "loss@mean",
              "spread", "averaged", "wall s");
  for (double hd : hs)
    for (const OuterMode mode : {OuterMode::noloco, OuterMode::diloco})
      for (double nd : ns) {
        const auto h = static_cast<std::uint32_t>(hd);
        const auto n = static_cast<std::size_t>(nd);
        const auto wall0 = std::chrono::steady_clock::now();
        Outer outer;
        read_noloco(a, outer);
        outer.mode = mode;
        Swarm s(st.seed * 1000 + n, swarm_options(st, outer, workload(st, h)));
        std::mt19937_64 rng(st.seed + n);
        const Time t0 = s.now();
        const Snapshot r = train(s, n, st, h, steps, rng);
        std::size_t rounds = 0, averaged = 0;
        for (std::size_t i = 0; i < s.size(); ++i)
          for (const auto& rep : s.reports(i))
            if (rep.kind == gossip::RoundReport::Kind::round) {
              ++rounds;
              averaged += !rep.local_only;
            }
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
        const double share = rounds ? double(averaged) / double(rounds) : NAN;
        std::printf("%-7s %5u %5zu %12.5g %12.5g %12.4g %8.1f%% %8.1f\n", gossip::to_string(mode),
                    h, n, r.mean_loss, r.loss_at_mean, r.spread, 100 * share, wall);
        std::fflush(stdout);
        csv.row({std::string(gossip::to_string(mode)) + " H=" + std::to_string(h),
                 gossip::to_string(mode), std::to_string(h), std::to_string(n), fmt(r.mean_loss),
                 fmt(r.loss_at_mean), fmt(r.spread), std::to_string(r.round_min),
                 std::to_string(r.round_max), fmt(share),
                 fmt(std::chrono::duration<double>(s.now() - t0).count()), fmt(wall, 3)});
      }
  std::printf("csv: %s\n", csv.path().c_str());
  plot("spread", csv.path(), out + "/spread.png");
  return 0;
}

int run_churn(const Args& a, const std::string& out) {
  const Setup st = read_setup(a);
  const auto n = static_cast<std::size_t>(a.count("nodes", 32));
  const auto hh = static_cast<std::uint32_t>(a.count("inner-steps", 50));
  const double share = a.num("share", 0.3);
  const double minutes = a.num("minutes", 30);
  const std::string mode_s = a.str("outer", "noloco");
  if (n < 4 || hh < 1 || share < 0 || share > 1 || minutes < 1)
    throw std::invalid_argument(
        "churn: need nodes >= 4, inner-steps >= 1, 0 <= share <= 1, "
        "minutes >= 1");
  Outer outer = parse_outer(mode_s);
  read_noloco(a, outer);
  const std::uint32_t h = read_fragments(a, outer, hh);  // a round's inner steps
  std::printf(
      "churn: %zu nodes %s, H = %u (%zu fragment(s)), %.0f%% of them leave and as many join "
      "between 20%% and 80%% of %.0f min\n",
      n, mode_s.c_str(), hh, outer.fragments, 100 * share, minutes);
  const std::string name = (mode_s == "noloco" ? "churn" : "churn_" + mode_s) +
                           (outer.fragments > 1 ? "_f" + std::to_string(outer.fragments) : "");
  Csv csv(out + "/" + name + ".csv", {"series", "minute", "live", "left", "crashed", "joined",
                                      "mean_loss", "loss_at_mean", "spread", "round_max"});
  for (const bool churn : {false, true}) {
    const auto wall0 = std::chrono::steady_clock::now();
    Swarm s(st.seed, swarm_options(st, outer, workload(st, h)));
    std::mt19937_64 rng(st.seed * 3 + 1);
    s.bootstrap(node_spec(st, h, rng));
    for (std::size_t i = 1; i < n; ++i) s.join(i - 1, node_spec(st, h, rng));
    const Time t0 = s.now();
    const auto events = churn ? static_cast<std::size_t>(std::llround(share * double(n))) : 0;
    const Time span = Time(static_cast<std::int64_t>(minutes * 60'000 * 0.6));
    const Time first = t0 + Time(static_cast<std::int64_t>(minutes * 60'000 * 0.2));
    std::size_t done = 0, left = 0, crashed = 0, joined = 0;
    const std::string series = churn ? "churn" : "no churn";
    double last_loss = NAN;
    for (int m = 1; m <= static_cast<int>(minutes); ++m) {
      const Time until = t0 + Time(std::int64_t{m} * 60'000);
      while (done < events) {
        const Time at = first + Time(span.count() * std::int64_t(done) / std::int64_t(events));
        if (at > until) break;
        s.run_until(at);
        // One goes (alternately a leave and a crash), one comes (through a live node).
        std::vector<std::size_t> live;
        for (std::size_t i = 0; i < s.size(); ++i)
          if (s.alive(i) && !s.leaving(i) && s.engine(i).has_state()) live.push_back(i);
        if (live.size() < 2)
          throw std::runtime_error("churn: fewer than two trained nodes left at minute " +
                                   std::to_string(m) + "; the swarm did not form");
        const std::size_t victim = live[rng() % live.size()];
        if (done % 2 == 0) {
          s.leave(victim);
          ++left;
        } else {
          s.kill(victim);
          ++crashed;
        }
        std::vector<std::size_t> others;
        for (auto i : live)
          if (i != victim) others.push_back(i);
        s.join(others.empty() ? victim : others[rng() % others.size()], node_spec(st, h, rng));
        ++joined;
        ++done;
      }
      s.run_until(until);
      const Snapshot r = snapshot(s);
      last_loss = r.mean_loss;
      csv.row({series, std::to_string(m), std::to_string(r.live), std::to_string(left),
               std::to_string(crashed), std::to_string(joined), fmt(r.mean_loss),
               fmt(r.loss_at_mean), fmt(r.spread), std::to_string(r.round_max)});
    }
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    std::printf("%-9s final mean loss %.5g (%zu left, %zu crashed, %zu joined; %.0f s wall)\n",
                series.c_str(), last_loss, left, crashed, joined, wall);
    std::fflush(stdout);
  }
  std::printf("csv: %s\n", csv.path().c_str());
  plot("churn", csv.path(), out + "/" + name + ".png");
  return 0;
}

namespace {
// A round report's note with its numbers and node ids left out, so that notes of one kind count
// together ("a1b2c3d4: no reply within 10 s" and "e5f6a7b8: no reply within 10 s" are one reason).
std::string reason_of(const std::string& note) {
  std::string out;
  for (std::size_t i = 0; i < note.size();) {
    std::size_t j = i;
    while (j < note.size() && std::isxdigit(static_cast<unsigned char>(note[j]))) ++j;
    const bool word_edge = (i == 0 || !std::isalpha(static_cast<unsigned char>(note[i - 1]))) &&
                           (j == note.size() || !std::isalpha(static_cast<unsigned char>(note[j])));
    if (j > i && word_edge && (j - i >= 6 || std::isdigit(static_cast<unsigned char>(note[i])))) {
      out += '#';
      i = j;
    } else {
      out += note[i++];
    }
  }
  return out.empty() ? "(no note)" : out;
}

// For every partner a round was matched with but not averaged with (its exchange failed):
// what that partner's own round of the same window shows, counted by outcome, most frequent
// first. Tells a partner that read another set of ready records (and grouped otherwise) from
// one that was matched with us too (the exchange itself failed) and from one that has no round
// of that window (it tried a later window).
std::vector<std::pair<std::size_t, std::string>> partner_outcomes(
    Swarm& s, const std::vector<std::size_t>& reports0) {
  std::map<gossip::NodeId, std::size_t> index;
  for (std::size_t i = 0; i < s.size(); ++i) index[s.id(i)] = i;
  std::map<std::string, std::size_t> count;
  for (std::size_t i = 0; i < reports0.size(); ++i) {
    const auto& reps = s.reports(i);
    for (std::size_t j = reports0[i]; j < reps.size(); ++j) {
      const auto& r = reps[j];
      if (r.kind != gossip::RoundReport::Kind::round || r.group.size() < 2) continue;
      for (const auto& p : r.group) {
        if (p == s.id(i) ||
            std::find(r.averaged_with.begin(), r.averaged_with.end(), p) != r.averaged_with.end())
          continue;
        const auto it = index.find(p);
        const gossip::RoundReport* theirs = nullptr;
        if (it != index.end())
          for (const auto& q : s.reports(it->second))
            if (q.kind == gossip::RoundReport::Kind::round && q.window == r.window) theirs = &q;
        std::string what;
        if (!theirs) {
          what = "no round of that window (it moved on to a later window)";
        } else if (std::find(theirs->group.begin(), theirs->group.end(), s.id(i)) ==
                   theirs->group.end()) {
          what =
              std::string("grouped without us, having read ") +
              (theirs->ready_seen < r.ready_seen   ? "fewer"
               : theirs->ready_seen > r.ready_seen ? "more"
                                                   : "as many") +
              " ready records, " + std::to_string(theirs->ready_not_live) +
              " from members it thought gone (" +
              (theirs->group.size() < 2 ? "alone: " + reason_of(theirs->note) : "another group") +
              ")";
        } else {
          what = "matched with us too (groups of " + std::to_string(r.group.size()) + " and " +
                 std::to_string(theirs->group.size()) + ", it averaged with " +
                 std::to_string(theirs->averaged_with.size()) + "): " + reason_of(theirs->note);
        }
        ++count[what];
      }
    }
  }
  std::vector<std::pair<std::size_t, std::string>> out;
  for (auto& [what, n] : count) out.emplace_back(n, what);
  std::sort(out.rbegin(), out.rend());
  return out;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * double(v.size())))];
}
}  // namespace

int run_scale(const Args& a, const std::string& out) {
  const Setup st = read_setup(a);
  const auto ns = a.list("nodes", {16, 64, 256, 1024});
  const auto hh = static_cast<std::uint32_t>(a.count("inner-steps", 50));
  const double join_minutes = a.num("join-minutes", 2);
  const double minutes = a.num("minutes", 5);
  const std::string mode_s = a.str("outer", "noloco");
  Outer outer = parse_outer(mode_s);
  read_noloco(a, outer);
  for (double n : ns)
    if (n < 2 || n != std::floor(n) || n > 4096)
      throw std::invalid_argument("--nodes: whole numbers in 2..4096");
  if (hh < 1 || join_minutes < 0 || minutes < 0.5)
    throw std::invalid_argument("scale: need inner-steps >= 1, join-minutes >= 0, minutes >= 0.5");
  const std::uint32_t h = read_fragments(a, outer, hh);  // a round's inner steps
  std::printf(
      "scale: %s, H = %u (%zu fragment(s)), nodes join over %.1f min then train %.1f min, %s "
      "links, quadratic\n",
      mode_s.c_str(), hh, outer.fragments, join_minutes, minutes,
      st.rtt_ms > 0 ? "uniform" : "world-model");
  const std::string name = (mode_s == "noloco" ? "scale" : "scale_" + mode_s) +
                           (outer.fragments > 1 ? "_f" + std::to_string(outer.fragments) : "");
  Csv csv(out + "/" + name + ".csv",
          {"series", "nodes", "with_state", "join_p50_s", "join_p95_s", "dht_kBps_mean",
           "dht_kBps_p95", "dht_kBps_max", "view_complete", "rounds_per_min", "averaged_share",
           "mean_loss", "loss_at_mean", "wall_s"});
  std::printf("%6s %8s %9s %9s %11s %11s %11s %9s %9s %9s %10s %8s\n", "N", "state", "join p50",
              "join p95", "DHT kB/s", "p95 kB/s", "max kB/s", "views", "rnd/min", "averaged",
              "mean loss", "wall s");
  for (double nd : ns) {
    const auto n = static_cast<std::size_t>(nd);
    const auto wall0 = std::chrono::steady_clock::now();
    Swarm s(st.seed * 1000 + n, swarm_options(st, outer, workload(st, h)));
    std::mt19937_64 rng(st.seed + 7 * n);
    std::vector<Time> asked(n, Time(-1));
    std::vector<double> join_s;
    s.on_report([&](std::size_t i, const gossip::RoundReport& r) {
      if (r.kind == gossip::RoundReport::Kind::synced && i < n && asked[i] >= Time(0)) {
        join_s.push_back(std::chrono::duration<double>(s.now() - asked[i]).count());
        asked[i] = Time(-1);
      }
    });
    s.bootstrap(node_spec(st, h, rng));
    const Time t0 = s.now();
    for (std::size_t i = 1; i < n; ++i) {
      s.run_until(t0 +
                  Time(static_cast<std::int64_t>(join_minutes * 60'000 * double(i) / double(n))));
      std::vector<std::size_t> ready;
      for (std::size_t j = 0; j < s.size(); ++j)
        if (s.alive(j) && s.engine(j).has_state()) ready.push_back(j);
      const std::size_t via = ready.empty() ? 0 : ready[rng() % ready.size()];
      asked[i] = s.now();
      s.join(via, node_spec(st, h, rng));
    }
    s.run_until(
        [&] {
          for (std::size_t i = 0; i < s.size(); ++i)
            if (s.alive(i) && !s.engine(i).has_state()) return false;
          return true;
        },
        Time(600'000));
    // The measurement window: every node has its state (or gave up).
    std::vector<std::uint64_t> dht0(n);
    std::vector<std::size_t> reports0(n);
    for (std::size_t i = 0; i < n; ++i) reports0[i] = s.reports(i).size();
    std::size_t rounds_before = 0, averaged_before = 0;
    auto count_rounds = [&](std::size_t& rounds, std::size_t& averaged) {
      rounds = averaged = 0;
      for (std::size_t i = 0; i < s.size(); ++i)
        for (const auto& rep : s.reports(i))
          if (rep.kind == gossip::RoundReport::Kind::round) {
            ++rounds;
            averaged += !rep.local_only;
          }
    };
    for (std::size_t i = 0; i < n; ++i) dht0[i] = s.dht_network().bytes_sent(i);
    count_rounds(rounds_before, averaged_before);
    const Time w0 = s.now();
    s.run_for(Time(static_cast<std::int64_t>(minutes * 60'000)));
    const double window_s = std::chrono::duration<double>(s.now() - w0).count();
    std::size_t rounds_after = 0, averaged_after = 0;
    count_rounds(rounds_after, averaged_after);
    std::vector<double> kbps;
    std::set<gossip::NodeId> live;
    for (std::size_t i = 0; i < n; ++i)
      if (s.alive(i)) {
        kbps.push_back(double(s.dht_network().bytes_sent(i) - dht0[i]) / 1000.0 / window_s);
        live.insert(s.id(i));
      }
    double complete = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!s.alive(i)) continue;
      std::size_t seen = 0;
      for (const auto& m : s.membership(i).live(s.dht_network().now())) seen += live.count(m.id);
      complete += double(seen) / double(live.size());
    }
    complete /= double(live.size());
    double mean_kbps = 0;
    for (double v : kbps) mean_kbps += v;
    mean_kbps /= double(std::max<std::size_t>(kbps.size(), 1));
    const Snapshot snap = snapshot(s);
    const double rounds = double(rounds_after - rounds_before);
    const double share = rounds > 0 ? double(averaged_after - averaged_before) / rounds : NAN;
    const double per_min = rounds / double(live.size()) / (window_s / 60.0);
    std::size_t with_state = 0;
    for (std::size_t i = 0; i < n; ++i) with_state += s.alive(i) && s.engine(i).has_state();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    std::printf("%6zu %8zu %9.2f %9.2f %11.2f %11.2f %11.2f %8.1f%% %9.2f %8.1f%% %10.4g %8.0f\n",
                n, with_state, quantile(join_s, 0.5), quantile(join_s, 0.95), mean_kbps,
                quantile(kbps, 0.95), quantile(kbps, 1.0), 100 * complete, per_min, 100 * share,
                snap.mean_loss, wall);
    // Why rounds of the measurement window were local-only: the most frequent reasons.
    std::map<std::string, std::size_t> why;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& reps = s.reports(i);
      for (std::size_t j = reports0[i]; j < reps.size(); ++j)
        if (reps[j].kind == gossip::RoundReport::Kind::round && reps[j].local_only)
          ++why[reason_of(reps[j].note)];
    }
    std::vector<std::pair<std::size_t, std::string>> top;
    for (auto& [reason, count] : why) top.emplace_back(count, reason);
    std::sort(top.rbegin(), top.rend());
    for (std::size_t j = 0; j < std::min<std::size_t>(top.size(), 4); ++j)
      std::printf("        local-only %6zu: %.150s\n", top[j].first, top[j].second.c_str());
    std::size_t late = 0, matched = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& reps = s.reports(i);
      for (std::size_t j = reports0[i]; j < reps.size(); ++j)
        if (reps[j].kind == gossip::RoundReport::Kind::round && reps[j].window) {
          ++matched;
          late += reps[j].ready_late;
        }
    }
    std::printf("        ready records not stored before their window closed: %zu of %zu\n", late,
                matched);
    for (const auto& [count, what] : partner_outcomes(s, reports0))
      std::printf("        a matched partner that was not averaged with %6zu: %s\n", count,
                  what.c_str());
    std::fflush(stdout);
    csv.row({mode_s, std::to_string(n), std::to_string(with_state), fmt(quantile(join_s, 0.5)),
             fmt(quantile(join_s, 0.95)), fmt(mean_kbps), fmt(quantile(kbps, 0.95)),
             fmt(quantile(kbps, 1.0)), fmt(complete), fmt(per_min), fmt(share), fmt(snap.mean_loss),
             fmt(snap.loss_at_mean), fmt(wall, 3)});
  }
  std::printf("csv: %s\n", csv.path().c_str());
  plot("scale", csv.path(), out + "/" + name + ".png");
  return 0;
}

}  // namespace grove::sim
