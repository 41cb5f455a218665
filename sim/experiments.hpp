// The scale experiments of `grove-sim` (sim/main.cpp). Each writes a CSV (and, when
// /usr/bin/python3 has matplotlib, a PNG drawn by sim/plot.py) into its output directory and
// prints a short table. Every one is a pure function of its options and seed.
//   sync-time   time of one averaging step against N: NoLoCo pair exchange and DiLoCo ring
//               all-reduce simulated with the real cores, tree all-reduce from the α–β model
//   spread      NoLoCo vs DiLoCo in a simulated swarm: loss and replica spread vs N and H
//   dht-churn   DHT lookup success and latency at N nodes with a share replaced every period
//   churn       a swarm whose membership changes by a share during the run, against no churn
//   scale       the whole swarm at N = 16 ... 1024: join time, control-plane traffic per node,
//               member views, rounds and loss
//   size        a swarm at model size (1B, 8B parameters) over slow lines: a joiner's state sync
//               against its bound, round time, rounds averaged, deadlines that fired
//   noloco-sweep what gossip can change without an all-reduce (group size, γ, α, H, partner
//               choice, look-ahead) against standard DiLoCo at equal compute
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace grove::sim {

/// Options as given on the command line: --name value pairs, with typed accessors that throw
/// std::invalid_argument with a clear message on a bad value (grove-sim refuses unknown names
/// before an experiment starts).
class Args {
 public:
  explicit Args(std::map<std::string, std::string> kv) : kv_(std::move(kv)) {}
  std::string str(const std::string& k, const std::string& def) const;
  double num(const std::string& k, double def) const;
  std::uint64_t count(const std::string& k, std::uint64_t def) const;
  std::vector<double> list(const std::string& k, const std::vector<double>& def) const;

 private:
  std::map<std::string, std::string> kv_;
};

/// A CSV file with a header, written row by row.
class Csv {
 public:
  Csv(const std::string& path, const std::vector<std::string>& columns);
  ~Csv();
  Csv(const Csv&) = delete;
  Csv& operator=(const Csv&) = delete;
  void row(const std::vector<std::string>& cells);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};
std::string fmt(double v, int precision = 6);

/// Runs sim/plot.py for `kind` on the CSV; false (with a note) when python or matplotlib is not
/// there.
bool plot(const std::string& kind, const std::string& csv, const std::string& png);

int run_sync_time(const Args& a, const std::string& out);
int run_spread(const Args& a, const std::string& out);
int run_dht_churn(const Args& a, const std::string& out);
int run_churn(const Args& a, const std::string& out);
int run_noloco_sweep(const Args& a, const std::string& out);
int run_scale(const Args& a, const std::string& out);
int run_size(const Args& a, const std::string& out);

}  // namespace grove::sim
