// The node's metrics log: one JSON object per line (--metrics FILE), typed events serialised here
// and nowhere else. Every line carries the node's progress (Progress); each event adds its own
// fields. Events: start, eval, round, synced, stop, handoff (an external trainer's hand-off
// timings). Written by the training thread only.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace grove::node {

/// What every metrics line carries.
struct Progress {
  std::string node;  ///< first 16 hex digits of the node id
  std::uint64_t step = 0, round = 0;
  double loss = NAN, eval_loss = NAN;
  std::vector<std::string> partners;  ///< of the last round: 16 hex digits each
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  long long sync_ms = 0;    ///< of the last round
  std::size_t members = 1;  ///< live members training (ourselves included)
  std::size_t idle = 0;     ///< live members whose trainer has gone (they train nothing)
  std::string param_hash;   ///< 16 hex digits of the slow weights' hash since the last round
};

namespace event {
struct Start {
  std::string run;
  std::size_t params = 0;
  double loss_floor = NAN;
};
struct Eval {
  double loss_floor = NAN;
};
/// A round ended ("round") or the state was replaced by the swarm's ("synced").
struct Round {
  bool synced = false;
  std::string mode, note;
  double tokens_per_s = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  double transfer_s = 0;  ///< the round's exchange or all-reduce, start to outcome
  bool local_only = false;
  double compute_s = 0, eval_s = 0, wall_s = 0;
};
struct Stop {
  double first_eval_loss = NAN, loss_floor = NAN;
  std::uint64_t rounds_averaged = 0, rounds_local = 0, syncs = 0, checkpoints = 0;
  double compute_s = 0, eval_s = 0, wall_s = 0, utilization = NAN;
  double peak_rss_bytes = 0, param_bytes = 0, checkpoint_s = NAN;
};
struct Handoff {
  double bytes = 0, get_ms = NAN, set_ms = NAN, memcpy_ms = NAN;
  double set_bytes = NAN;  ///< the bytes of θ one hand-off to the trainer wrote, on average
};
}  // namespace event

class Metrics {
 public:
  /// No path: nothing is written. Throws transport::ConfigError when the file cannot be opened.
  explicit Metrics(const std::optional<std::string>& path);
  void write(const Progress& p, const event::Start& e);
  void write(const Progress& p, const event::Eval& e);
  void write(const Progress& p, const event::Round& e);
  void write(const Progress& p, const event::Stop& e);
  void write(const Progress& p, const event::Handoff& e);

 private:
  class Line;
  void emit(const Line& l);
  std::ofstream out_;
};

}  // namespace grove::node
