// CheckpointWriter: checkpoints are written by a thread of their own, so that training does not
// stop for the write and fsync (0.3-0.5 s a round for 3M parameters, seconds for 100M): a node
// killed at any instant resumes from the last round whose checkpoint was complete, at most two
// rounds back (one being written, the next waiting). A checkpoint that arrives while one waits
// takes its place (the waiting one is skipped). The outer state's bytes are shared with the
// round engine's snapshot, so a waiting checkpoint costs no model-sized memory of its own.
//
// Threads: add() from one thread (the training thread); the writer thread is started by the first
// add(). Everything else under `mu_`.
#pragma once

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "node/checkpoint.hpp"

namespace grove::node {

class CheckpointWriter {
 public:
  /// `on_busy(true)` when a write begins and `on_busy(false)` when it ends, on the writer's
  /// thread (the status board says "checkpointing" meanwhile).
  explicit CheckpointWriter(std::filesystem::path dir, std::function<void(bool)> on_busy = {})
      : dir_(std::move(dir)), on_busy_(std::move(on_busy)) {}
  ~CheckpointWriter() { stop(); }
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Queues `c` unless it is the same (round, step) as the last one queued.
  void add(Checkpoint c);
  /// Waits for the checkpoint in hand (and the one waiting), then stops the writer.
  void stop();

  struct Stats {
    std::uint64_t written = 0, skipped = 0;
    double mean_s = NAN;  ///< seconds per checkpoint written
  };
  Stats stats() const;

 private:
  void run();

  const std::filesystem::path dir_;
  const std::function<void(bool)> on_busy_;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> last_;  // (round, step); add()'s thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  std::optional<Checkpoint> job_;
  bool busy_ = false, stop_ = false;
  std::uint64_t written_ = 0, skipped_ = 0;
  double seconds_ = 0;
};

}  // namespace grove::node
