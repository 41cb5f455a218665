// TrainingLoop: the node's training thread. It drives the Controller (node/controller.hpp) with
// the workload's inner steps, the round engine's reports, the stop request and the clock, and
// carries out the controller's actions on the workload, the round engine (through RoundRuntime),
// the member record, the checkpoint writer, the metrics and the console.
//
// Threads: run() is called on the node's main thread and owns the workload, θ, the controller and
// the Tally. Reports arrive through the ReportQueue from the DHT strand; a stop request from the
// signal handler (an atomic flag and a wake-up).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>

#include "node/checkpoint.hpp"
#include "node/checkpoint_writer.hpp"
#include "node/cli.hpp"
#include "node/collectives.hpp"
#include "node/console.hpp"
#include "node/controller.hpp"
#include "node/metrics.hpp"
#include "node/network.hpp"
#include "node/servers.hpp"
#include "node/workload.hpp"

namespace grove::node {

/// Reports from the round engine (DHT strand) to the training thread, and its wake-ups.
class ReportQueue {
 public:
  void push(gossip::RoundReport r);
  /// Wakes a waiting wait() (a stop request, the member record's removal).
  void wake();
  /// The next report, if any; waits until `deadline` (none: until woken) for one.
  std::optional<gossip::RoundReport> wait(
      std::optional<std::chrono::steady_clock::time_point> deadline);
  std::optional<gossip::RoundReport> try_pop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<gossip::RoundReport> q_;
  bool woken_ = false;
};

/// Everything the loop works with; owned by the node, which outlives the loop.
struct TrainingSetup {
  const CliOptions& o;
  const RunConfig& config;
  const std::string& run_name;
  StartKind start;
  std::string join_command;  ///< printed for others (the first node of a run)
  Workload& workload;
  ExternalWorkload* external = nullptr;  ///< the user's trainer, when the workload is theirs
  std::optional<Checkpoint>& resume;
  Network& net;
  std::shared_ptr<dht::Membership> members;
  std::shared_ptr<gossip::RoundRuntime> round;
  StatusBoard& board;
  Metrics& metrics;
  CheckpointWriter& checkpoints;
  Console& console;
  ReportQueue& reports;
  const std::atomic<bool>& stopping;
  /// Where φ and the momentum are made (node/state_files.hpp; none: the heap).
  optim::FloatAllocator floats;
  std::filesystem::path state_dir;  ///< the saved contacts are kept here (node/contacts.hpp)
  /// A resumed node without --peer reached its swarm through its saved contacts or the LAN (it
  /// fetches the swarm's state first, as with --peer).
  bool rejoined = false;
  /// The run's per-step calls (an external trainer's collectives; DeMo's exchange: outer demo).
  Collectives* collectives = nullptr;
};

/// Trains until the controller ends the run; returns the process exit code.
int run_training(TrainingSetup& s);

}  // namespace grove::node
