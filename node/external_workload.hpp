// ExternalWorkload: the model lives in the user's training process (a "trainer", the Python
// package in node/python/grove); the node runs everything else. The node serves one trainer at a
// time on a Unix socket (messages: node/trainer_protocol.hpp) and shares θ with it through a
// shared-memory segment (float32, P values), so the parameters never cross the socket.
//
// The node's training loop drives it like any workload, from its training thread:
//   train_step   tells the waiting trainer to go on (loading θ from shared memory first when the
//                node changed it), then waits for its next "step" (one call of its step()).
//   get_params   asks the trainer to store θ in shared memory, then copies it out.
//   set_params   copies θ into shared memory; the trainer loads it before it goes on.
// So the trainer is blocked inside step() exactly while the node runs a round without overlap,
// and shared memory is touched only while the trainer waits.
//
// Between two of its steps the trainer may make collectives (grove.all_sum, average_gradients,
// all_gather, barrier): train_step's wait serves them (Options::collective). Their tensors sit in
// a second segment, the trainer's collective segment, which the node makes as large as the
// trainer asks ("buffer") or a result needs: the input at its start, the result right after it.
//
// A trainer that goes away (its process died) leaves the node in the swarm: train_step waits
// for the next trainer, checks its model against the run's, and hands it the node's θ. A second
// trainer while one is attached is refused. A trainer whose model is not the run's is refused
// with the reason. The node never executes anything a trainer sends.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "node/collectives.hpp"
#include "node/trainer_protocol.hpp"
#include "node/workload.hpp"

namespace grove::node {

class ExternalWorkload final : public Workload {
 public:
  struct Options {
    std::string socket_path;         ///< created with mode 0600 (a stale one is replaced)
    std::string shm_name;            ///< "/grove-…"; an old segment of that name is replaced
    std::function<bool()> stopping;  ///< waits end (train_step returns NaN loss)
    std::function<void(const std::string&)> on_state;  ///< "waiting for a trainer", "training"
    /// Where a trainer keeps its own state (its welcome names it; it saves there when asked,
    /// after each of the node's checkpoints, and restores from there when it attaches).
    std::string state_file;
    /// Runs a trainer's collective on `input` (a view of its collective segment), results in
    /// pages of `out` (the segment, after the input, when they fit); blocks until the call
    /// ends. None: collectives are answered with an error.
    std::function<CollectiveOutcome(const TrainerCollective&, optim::Floats input,
                                    optim::FloatAllocator out)>
        collective;
  };
  /// Listens on the socket; ConfigError when it cannot (or another node serves it).
  explicit ExternalWorkload(Options o);
  ~ExternalWorkload() override;

  /// At bootstrap, before the run exists: waits for the first trainer's hello (nullopt when
  /// stopping). bind() must follow.
  std::optional<TrainerHello> wait_for_first_trainer();
  /// Fixes the run (later trainers are checked against it), creates the shared memory and
  /// welcomes the trainer waiting from wait_for_first_trainer(), if any. ConfigError when the
  /// segment cannot be created.
  void bind(const RunConfig& run, const std::string& run_name);
  /// Waits (until stopping) for a trainer whose model is the run's; false when stopping.
  bool attach();

  std::string describe() const override;
  std::size_t num_params() const override;
  void get_params(std::span<float> out) const override;
  void set_params(std::span<const float> in) override;
  void get_params_into(optim::Floats& out) const override;
  void set_params_from(const optim::Floats& in) override;
  /// Writes θ[lo, hi) into shared memory and has the trainer load that part only (shared memory
  /// and the trainer hold the rest already); a load still pending widens to cover both.
  void set_params_part(const optim::Floats& in, std::size_t lo, std::size_t hi) override;
  StepResult train_step(std::uint64_t step) override;
  double evaluate() override;
  double loss_floor() const override { return NAN; }
  /// The node writes a checkpoint: the trainer saves its own state at its next step (the
  /// checkpoint's bytes hold nothing of it: the trainer's state is its own file).
  std::vector<std::uint8_t> save() const override;
  transport::Result<void> load(std::span<const std::uint8_t>) override { return {}; }

  /// Tells an attached trainer that the node is leaving (its step() raises with `why`).
  void say_goodbye(const std::string& why);

  /// θ handed over between the trainer and the node: get_params (the trainer stores θ in shared
  /// memory, the node copies it out; a trainer's first store, which moves its parameters into
  /// shared memory, is not counted) and set_params (the node copies θ in), and for comparison
  /// the fastest of three plain copies of the same bytes (measured when asked).
  struct Handoff {
    std::uint64_t gets = 0, sets = 0;
    double get_s = 0, set_s = 0;
    double bytes = 0;  ///< of one hand-off (θ's)
    /// given to the trainer in all: a round of one streaming fragment gives that part only
    double set_bytes = 0;
    double memcpy_s = NAN;  ///< one plain copy of `bytes` (timed over up to 16 MiB, scaled)
  };
  Handoff handoff(bool measure_memcpy) const;

  struct Impl;

 private:
  void fetch(std::span<float> out, const optim::Floats* side) const;
  void store(std::span<const float> in, const optim::Floats* side);
  void save_trainer_state();
  /// Serves a collective or buffer request; false when the trainer went away.
  bool serve_collective(const TrainerCollective& c);
  bool serve_buffer(const TrainerBuffer& b);
  std::unique_ptr<Impl> impl_;
};

}  // namespace grove::node
