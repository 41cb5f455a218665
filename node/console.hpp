// What a person sees on stdout: the start banner, how training began, a live line rewritten in
// place about once a second on a terminal, one line per round, and the final summary. Tally is
// the training thread's count of everything these lines (and the metrics) show.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "node/checkpoint_writer.hpp"
#include "node/external_workload.hpp"
#include "node/metrics.hpp"
#include "transport/host.hpp"
#include "transport/reach.hpp"
#include "transport/relay.hpp"

namespace grove::node {

/// The training thread's counts (it alone writes them).
struct Tally {
  Progress progress;  ///< what every metrics line carries
  std::uint64_t tokens = 0;
  double first_eval = NAN, compute_s = 0, eval_s = 0, tokens_per_s = 0;
  double sync_ms_sum = 0, round_time_sum = 0;
  std::uint64_t rounds_averaged = 0, rounds_local = 0, syncs = 0, round_count = 0;
  std::string last_sync;  ///< "with ab12cd34, 840 ms, 1.20/1.10 MB", for the live line
};

/// The end of the run as the summary tells it.
struct Outcome {
  std::string run;
  double wall_s = 0, utilization = NAN, peak_rss_bytes = 0, param_bytes = 0, loss_floor = NAN;
  CheckpointWriter::Stats checkpoints;
  transport::HostStats host;
  transport::RelayStats relay;
  transport::Reachability reach = transport::Reachability::unchecked;
  std::optional<ExternalWorkload::Handoff> handoff;
};

/// Milliseconds per operation: `seconds` over `n` of them (NaN when none).
inline double ms_each(double seconds, std::uint64_t n) {
  return n ? 1e3 * seconds / static_cast<double>(n) : NAN;
}

class Console {
 public:
  /// `progress`: the live and round lines (--no-progress: off).
  explicit Console(bool progress);
  void banner(const std::string& node, const std::string& run, const std::string& workload,
              const std::string& outer, const std::string& codec, const std::string& advertise);
  void join_command(const std::string& command);
  void synced(std::uint64_t round, double eval, double floor);
  /// A state sync under way: verified bytes of the total, the donor's rate (bytes per second),
  /// and the time left at that rate; at most every 5 s (a terminal or not: a join of a large
  /// state takes minutes, and its log must show that it moves).
  void syncing(std::uint64_t bytes, std::uint64_t total, double rate);
  void resumed(std::uint64_t round, std::uint64_t step);
  void started(double eval, double floor);
  void trainer_socket(const std::string& path);
  /// During an inner phase: at most once a second, on a terminal only.
  void live(const Tally& t, double rate, double floor);
  void round(const Tally& t, const std::string& mode, double floor);
  void summary(const Tally& t, const Outcome& o);

 private:
  const bool progress_;
  const bool tty_;
  std::chrono::steady_clock::time_point last_live_{}, last_sync_{};
};

}  // namespace grove::node
