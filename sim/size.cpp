// grove-sim size: a swarm at model size (sim/at_size.hpp) for each size, line rate and outer
// mode given: the joiner's state sync against its bound, the round time, the rounds averaged and
// the deadlines that fired.
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "sim/at_size.hpp"
#include "sim/experiments.hpp"

namespace grove::sim {

int run_size(const Args& a, const std::string& out) {
  const auto sizes = a.list("params", {1e9, 8e9});
  const auto rates = a.list("mbit", {20, 100});
  const std::string outer = a.str("outer", "noloco");
  const double inner_min = a.num("inner-min", 10);
  const double rtt = a.num("rtt-ms", 50);
  const auto seed = a.count("seed", 77);
  const bool overlap = a.count("overlap", 0) != 0;
  const auto mode = gossip::parse_mode(outer);
  if (!mode) throw std::invalid_argument("--outer: noloco or diloco");
  if (inner_min <= 0 || rtt < 0) throw std::invalid_argument("--inner-min > 0, --rtt-ms >= 0");
  for (double p : sizes)
    if (p < 1e6 || p > 1e12) throw std::invalid_argument("--params: each in 1e6..1e12");
  for (double m : rates)
    if (m <= 0 || m > 1e5) throw std::invalid_argument("--mbit: each in (0, 100000]");
  Csv csv(out + "/size.csv", {"params", "mbit", "outer", "join_s", "bound_s", "join_x_bound",
                              "round_s", "averaged", "rounds", "deadlines_fired", "sim_wall_s"});
  std::printf("size: 3 nodes (2 pair, the third joins), %s%s, inner phase %.3g min, RTT %.0f ms\n",
              outer.c_str(), overlap ? " with overlap" : "", inner_min, rtt);
  std::printf("%8s %6s %10s %10s %8s %10s %10s %6s %8s\n", "params", "Mbit/s", "join (s)",
              "bound (s)", "x bound", "round (s)", "averaged", "fired", "wall (s)");
  for (double p : sizes)
    for (double m : rates) {
      SizeSetup s;
      s.params = p;
      s.mbit = m;
      s.mode = *mode;
      s.inner = gossip::Time(static_cast<std::int64_t>(inner_min * 60'000));
      s.one_way = gossip::Time(static_cast<std::int64_t>(std::llround(rtt / 2)));
      s.seed = seed;
      s.overlap = overlap;
      const SizeOutcome r = run_at_size(s);
      int averaged = 0, rounds = 0;
      for (std::size_t i = 0; i < r.rounds.size(); ++i)
        averaged += r.averaged[i], rounds += r.rounds[i];
      const std::string avg = std::to_string(averaged) + "/" + std::to_string(rounds);
      std::printf("%7.1fB %6.0f %10.0f %10.0f %8.3f %10.0f %10s %6zu %8.1f%s\n", p / 1e9, m,
                  r.join_s, r.bound_s, r.join_s / r.bound_s, r.round_s, avg.c_str(), r.fired.size(),
                  r.wall_s, r.completed ? "" : "  (the joiners did not get in within a day)");
      for (const auto& f : r.fired) std::printf("    fired: %s\n", f.c_str());
      std::fflush(stdout);
      csv.row({fmt(p), fmt(m), outer, fmt(r.join_s), fmt(r.bound_s), fmt(r.join_s / r.bound_s),
               fmt(r.round_s), std::to_string(averaged), std::to_string(rounds),
               std::to_string(r.fired.size()), fmt(r.wall_s, 3)});
    }
  std::printf("csv: %s\n", csv.path().c_str());
  return 0;
}

}  // namespace grove::sim
