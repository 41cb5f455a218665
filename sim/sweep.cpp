// Experiment 5: what a gossip method can change, without an all-reduce, to close NoLoCo's gap to
// standard DiLoCo (../shared/ALGORITHMS.md: with the reference defaults NoLoCo ended ~9% above
// DiLoCo with Nesterov 0.9 in plain PyTorch).
//
// The algorithms only, without the network: K replicas of the workload in one process, each
// running its inner phase (H real SGD steps on its own data) and then the outer step of
// optim/outer.hpp — the functions grove-node runs — with groups formed by a partner policy:
//   random    groups of g drawn at random every round (grove-node's matchmaking)
//   lrm       least recently met: each replica, in random order, takes the partners it met
//             longest ago
//   far       farthest weights: each replica, in random order, takes the partners whose slow
//             weights are farthest from its own (a sketch of φ would carry this in a record)
// and optionally a Nesterov-style look-ahead (the next inner phase starts from φ + α·m, the point
// the momentum is heading to, instead of φ). Every setting runs the same inner steps per replica
// (equal compute) on the same seeds; reported: the mean over seeds of the replicas' mean loss at
// the end, its ratio to standard DiLoCo's (lr 0.7, Nesterov 0.9), and the replica spread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "optim/outer.hpp"
#include "sim/experiments.hpp"
#include "sim/workload.hpp"

namespace grove::sim {

namespace {

struct Setting {
  std::string name;
  bool diloco = false;
  optim::DiLoCoConfig dl{};
  optim::NoLoCoConfig nl{};
  std::size_t group = 2;
  std::string partners = "random";
  bool lookahead = false;
  std::uint32_t h = 0;  // 0: the sweep's H
};

struct Result {
  double loss = 0, spread = 0;
};

double dist2(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t k = 0; k < a.size(); ++k) s += double(a[k] - b[k]) * double(a[k] - b[k]);
  return s;
}

std::vector<std::vector<std::size_t>> make_groups(const Setting& st,
                                                  const std::vector<std::vector<float>>& phi,
                                                  std::vector<std::vector<std::size_t>>& met,
                                                  std::size_t round, std::mt19937_64& rng) {
  const std::size_t K = phi.size();
  std::vector<std::size_t> order(K);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::vector<std::size_t>> groups;
  if (st.partners == "random") {
    for (std::size_t i = 0; i + st.group <= K; i += st.group)
      groups.emplace_back(order.begin() + std::ptrdiff_t(i),
                          order.begin() + std::ptrdiff_t(i + st.group));
    for (std::size_t i = K - K % st.group; i < K; ++i) groups.back().push_back(order[i]);
  } else {
    std::vector<bool> taken(K, false);
    for (std::size_t a : order) {
      if (taken[a]) continue;
      std::vector<std::size_t> g{a};
      taken[a] = true;
      while (g.size() < st.group) {
        std::optional<std::size_t> best;
        double best_score = -1;
        for (std::size_t b : order) {
          if (taken[b]) continue;
          const double score = st.partners == "far"
                                   ? dist2(phi[a], phi[b])
                                   : double(round + 1 - std::min(round + 1, met[a][b]));
          if (score > best_score) best = b, best_score = score;
        }
        if (!best) break;
        taken[*best] = true;
        g.push_back(*best);
      }
      if (g.size() < 2 && !groups.empty())
        groups.back().push_back(a);  // the odd one joins the last group
      else
        groups.push_back(std::move(g));
    }
  }
  for (const auto& g : groups)
    for (auto x : g)
      for (auto y : g) met[x][y] = round + 1;
  return groups;
}

Result run(const Setting& st, Workload& w, std::size_t K, std::uint64_t steps, std::uint32_t h,
           std::uint64_t seed) {
  const std::size_t P = w.params();
  std::vector<std::vector<float>> phi(K, w.initial()), mom(K, std::vector<float>(P, 0.0f));
  std::vector<std::vector<float>> theta(K);
  std::vector<std::mt19937_64> rngs;
  for (std::size_t i = 0; i < K; ++i) rngs.emplace_back(seed * 1000 + i);
  std::mt19937_64 rng(seed * 77 + 5);
  std::vector<std::vector<std::size_t>> met(K, std::vector<std::size_t>(K, 0));
  const std::uint64_t rounds = std::max<std::uint64_t>(1, steps / h);
  std::vector<float> mean_t(P), mean_d(P), mean_p(P), d(P);
  for (std::uint64_t r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < K; ++i) {
      theta[i] = phi[i];
      if (st.lookahead)
        for (std::size_t k = 0; k < P; ++k) theta[i][k] += st.nl.alpha * mom[i][k];
      w.inner(i, theta[i], rngs[i]);
    }
    if (st.diloco) {
      std::fill(mean_d.begin(), mean_d.end(), 0.0f);
      for (std::size_t i = 0; i < K; ++i) {
        optim::pseudo_gradient(phi[i], theta[i], d);
        for (std::size_t k = 0; k < P; ++k) mean_d[k] += d[k] / float(K);
      }
      for (std::size_t i = 0; i < K; ++i) optim::diloco_step(phi[i], mom[i], mean_d, st.dl);
      continue;
    }
    for (const auto& g : make_groups(st, phi, met, r, rng)) {
      std::fill(mean_t.begin(), mean_t.end(), 0.0f);
      std::fill(mean_d.begin(), mean_d.end(), 0.0f);
      std::fill(mean_p.begin(), mean_p.end(), 0.0f);
      const float inv = 1.0f / float(g.size());
      for (auto i : g) {
        optim::pseudo_gradient(phi[i], theta[i], d);
        for (std::size_t k = 0; k < P; ++k) {
          mean_t[k] += theta[i][k] * inv;
          mean_d[k] += d[k] * inv;
          mean_p[k] += phi[i][k] * inv;
        }
      }
      for (auto i : g) {
        if (st.nl.one_tensor())
          optim::noloco_step_theta(phi[i], mom[i], mean_t, st.nl);
        else
          optim::noloco_step(phi[i], mom[i], mean_d, mean_p, st.nl);
      }
    }
  }
  Result res;
  std::vector<double> mean(P, 0.0);
  for (std::size_t i = 0; i < K; ++i) {
    res.loss += w.loss(phi[i]) / double(K);
    for (std::size_t k = 0; k < P; ++k) mean[k] += phi[i][k] / double(K);
  }
  double sq = 0;
  for (std::size_t i = 0; i < K; ++i)
    for (std::size_t k = 0; k < P; ++k) sq += (phi[i][k] - mean[k]) * (phi[i][k] - mean[k]);
  res.spread = std::sqrt(sq / double(K * P));
  if (!std::isfinite(res.loss)) res.loss = INFINITY;
  return res;
}

std::vector<Setting> settings() {
  std::vector<Setting> s;
  auto dl = [&](std::string name, float lr, float mu) {
    Setting x;
    x.name = std::move(name);
    x.diloco = true;
    x.dl = {lr, mu};
    s.push_back(x);
  };
  auto nl = [&](std::string name, float a, float b, float g, std::size_t group = 2,
                std::string partners = "random", bool look = false, std::uint32_t h = 0) {
    Setting x;
    x.name = std::move(name);
    x.nl = {a, b, g};
    x.group = group;
    x.partners = std::move(partners);
    x.lookahead = look;
    x.h = h;
    s.push_back(x);
  };
  dl("DiLoCo lr0.7 Nesterov0.9 (standard)", 0.7f, 0.9f);
  dl("DiLoCo lr0.7 Nesterov0.3 (weak)", 0.7f, 0.3f);
  nl("NoLoCo reference a0.5 b=g0.7 n2 random", 0.5f, 0.7f, 0.7f);
  nl("group 3", 0.5f, 0.7f, 0.7f, 3);
  nl("group 4", 0.5f, 0.7f, 0.7f, 4);
  nl("gamma 0.3 (b0.7)", 0.5f, 0.7f, 0.3f);
  nl("gamma 1.0 (b0.7)", 0.5f, 0.7f, 1.0f);
  nl("beta 1.0 (g0.7)", 0.5f, 1.0f, 0.7f);
  nl("beta 1.4 (g0.7)", 0.5f, 1.4f, 0.7f);
  nl("alpha 0.3", 0.3f, 0.7f, 0.7f);
  nl("alpha 0.7", 0.7f, 0.7f, 0.7f);
  nl("alpha 0.9", 0.9f, 0.7f, 0.7f);
  nl("partners least-recently-met", 0.5f, 0.7f, 0.7f, 2, "lrm");
  nl("partners farthest", 0.5f, 0.7f, 0.7f, 2, "far");
  nl("look-ahead", 0.5f, 0.7f, 0.7f, 2, "random", true);
  nl("alpha 0.7 + look-ahead", 0.7f, 0.7f, 0.7f, 2, "random", true);
  nl("alpha 0.7 beta 1.0 gamma 1.0", 0.7f, 1.0f, 1.0f);
  nl("alpha 0.7 beta 1.0 gamma 1.0 group 4", 0.7f, 1.0f, 1.0f, 4);
  nl("look-ahead + beta 1.0", 0.5f, 1.0f, 0.7f, 2, "random", true);
  nl("look-ahead + beta 1.4", 0.5f, 1.4f, 0.7f, 2, "random", true);
  nl("look-ahead + group 4", 0.5f, 0.7f, 0.7f, 4, "random", true);
  nl("look-ahead + beta 1.0 gamma 1.0 group 4", 0.5f, 1.0f, 1.0f, 4, "random", true);
  nl("look-ahead + beta 1.4 gamma 1.0 group 4", 0.5f, 1.4f, 1.0f, 4, "random", true);
  nl("look-ahead + beta 1.4 group 4 far", 0.5f, 1.4f, 0.7f, 4, "far", true);
  return s;
}

}  // namespace

int run_noloco_sweep(const Args& a, const std::string& out) {
  const auto K = static_cast<std::size_t>(a.count("replicas", 16));
  const std::uint64_t steps = a.count("steps", 3000);
  const auto h = static_cast<std::uint32_t>(a.count("inner-steps", 50));
  const auto seeds = a.count("seeds", 3);
  const std::string wname = a.str("workload", "mlp");
  if (K < 4 || h < 1 || steps < h || seeds < 1)
    throw std::invalid_argument(
        "noloco-sweep: need replicas >= 4, inner-steps >= 1, steps >= "
        "inner-steps, seeds >= 1");
  if (wname != "mlp" && wname != "quadratic")
    throw std::invalid_argument("--workload: mlp or quadratic");
  std::printf("noloco-sweep: %zu replicas of %s, H = %u, %llu inner steps each, %llu seed(s)\n", K,
              wname.c_str(), h, static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(seeds));
  Csv csv(out + "/noloco_sweep.csv",
          {"setting", "final_loss", "loss_min", "loss_max", "ratio_to_diloco", "spread", "wall_s"});
  const auto all = settings();
  std::vector<double> losses(all.size());
  double reference = NAN;
  for (std::size_t si = 0; si < all.size(); ++si) {
    const auto wall0 = std::chrono::steady_clock::now();
    const auto& st = all[si];
    double sum = 0, spread = 0, lo = INFINITY, hi = -INFINITY;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
      std::unique_ptr<Workload> w;
      const std::uint32_t hh = st.h ? st.h : h;
      if (wname == "mlp") {
        MlpOptions o;
        o.inner_steps = hh;
        w = make_tiny_mlp(seed, o);
      } else {
        QuadraticOptions o;
        o.inner_steps = hh;
        o.lr = 0.1f;
        w = make_quadratic(seed, o);
      }
      std::mt19937_64 drng(seed);
      for (std::size_t i = 0; i < K; ++i) w->add_node(i, drng);
      const Result r = run(st, *w, K, steps, hh, seed);
      sum += r.loss;
      spread += r.spread;
      lo = std::min(lo, r.loss);
      hi = std::max(hi, r.loss);
    }
    const double loss = sum / double(seeds);
    losses[si] = loss;
    if (si == 0) reference = loss;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    const bool diverged = !(loss < 10 * reference) && si > 0;
    std::printf("%-44s loss %.4f [%.4f, %.4f]  ÷ DiLoCo %.3f  spread %.4f  (%.1f s)%s\n",
                st.name.c_str(), loss, lo, hi, loss / reference, spread / double(seeds), wall,
                diverged ? "  DIVERGED" : "");
    std::fflush(stdout);
    csv.row({"\"" + st.name + "\"", fmt(loss), fmt(lo), fmt(hi), fmt(loss / reference),
             fmt(spread / double(seeds)), fmt(wall, 3)});
  }
  std::size_t best = 2;
  for (std::size_t si = 2; si < all.size(); ++si)
    if (losses[si] < losses[best]) best = si;
  std::printf(
      "best gossip setting: %s, loss %.4f = %.3f × standard DiLoCo, %.3f × the NoLoCo "
      "reference\n",
      all[best].name.c_str(), losses[best], losses[best] / reference, losses[best] / losses[2]);
  std::printf("csv: %s\n", csv.path().c_str());
  plot("noloco-sweep", csv.path(), out + "/noloco_sweep.png");
  return 0;
}

}  // namespace grove::sim
