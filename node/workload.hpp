// Workload: the model a node trains, seen by the node as a flat float32 parameter vector θ and an
// inner optimiser it steps. The node's training thread owns it (no locking inside).
//
//   gpt (node/gpt_workload.cpp, the only translation unit that includes libtorch): a byte-level
//       GPT-style causal transformer, inner AdamW with linear warm-up and cosine decay.
//   mlp (node/mlp_workload.cpp, plain C++): a tiny MLP regressing a fixed random teacher network
//       with known noise, for fast tests (and the sanitizer build, which has no libtorch).
//
// Everything that decides the model's numbers comes from the RunConfig (no code from peers);
// `node_seed` (derived from the node's identity) only picks this node's training samples.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "node/config.hpp"
#include "optim/floats.hpp"
#include "transport/error.hpp"

namespace grove::node {

struct StepResult {
  double loss = 0;           ///< training loss of this step's batch
  std::uint64_t tokens = 0;  ///< tokens (or samples) the step consumed
};

class Workload {
 public:
  virtual ~Workload() = default;
  /// e.g. "gpt-small (3.2M parameters)".
  virtual std::string describe() const = 0;
  virtual std::size_t num_params() const = 0;
  /// θ as one flat float32 vector (a fixed order: the same on every node of the run).
  virtual void get_params(std::span<float> out) const = 0;
  /// Replaces θ (after an outer step, a state sync or a checkpoint load).
  virtual void set_params(std::span<const float> in) = 0;
  /// The same into or out of the node's pages (optim/floats.hpp), released when done; the
  /// external workload copies and releases a fragment at a time, so that θ is never resident
  /// in the node whole.
  virtual void get_params_into(optim::Floats& out) const {
    get_params(std::span<float>(out));
    out.release();
  }
  virtual void set_params_from(const optim::Floats& in) {
    set_params(std::span<const float>(in));
    in.release();
  }
  /// θ[lo, hi) from `in`, whose other values are the workload's θ already (a round of one
  /// streaming fragment changed that part only); by default all of it is set.
  virtual void set_params_part(const optim::Floats& in, std::size_t lo, std::size_t hi) {
    (void)lo;
    (void)hi;
    set_params_from(in);
  }
  /// One inner step: a batch of this node's data, forward, backward, clip, optimiser step with
  /// the learning rate of inner step `step` (warm-up + cosine).
  virtual StepResult train_step(std::uint64_t step) = 0;
  /// The shapes of θ's tensors, in θ's order (their sizes sum to num_params()): how DeMo cuts
  /// each into blocks. By default one flat tensor.
  virtual std::vector<std::vector<std::uint64_t>> shapes() const {
    return {{static_cast<std::uint64_t>(num_params())}};
  }
  /// Inner step `step`'s gradient without the optimiser step (outer demo, whose own rule steps
  /// θ): the batch, forward, backward and clip of train_step(), the flat gradient written to
  /// `grad` (num_params() values). A non-finite loss or gradient leaves `grad` all zeros (the
  /// caller sees the loss). False: this workload cannot give its gradient (an external trainer
  /// steps its own model).
  virtual bool gradient(std::uint64_t step, std::span<float> grad, StepResult& result) {
    (void)step;
    (void)grad;
    (void)result;
    return false;
  }
  /// Mean loss over the run's fixed held-out batches (the same on every node of the run).
  virtual double evaluate() = 0;
  /// The lowest loss any model can reach on the held-out data, when known (synthetic data);
  /// NaN otherwise.
  virtual double loss_floor() const = 0;
  /// The inner optimiser's state and the data position (not θ); load() checks sizes and values.
  virtual std::vector<std::uint8_t> save() const = 0;
  virtual transport::Result<void> load(std::span<const std::uint8_t> blob) = 0;
};

struct WorkloadSpec {
  RunConfig config;
  std::vector<std::string> data_files;  ///< --data (a `files` run); empty for synthetic
  std::uint64_t node_seed = 0;          ///< this node's sample stream
  unsigned threads = 0;                 ///< compute threads (0: all)
};

/// Builds the run's workload with the run's initial θ (from config.seed). Throws
/// transport::ConfigError for an unknown preset, unreadable data, or a gpt run in a build
/// without libtorch.
std::unique_ptr<Workload> make_workload(const WorkloadSpec& spec);

// The two implementations. make_gpt_workload lives in the grove_node_gpt library (libtorch);
// a program that links it hands it to make_workload with set_gpt_factory() at start-up (the
// sanitizer build has no libtorch and offers the mlp workload only).
std::unique_ptr<Workload> make_mlp_workload(const WorkloadSpec& spec);
std::unique_ptr<Workload> make_gpt_workload(const WorkloadSpec& spec);
using WorkloadFactory = std::unique_ptr<Workload> (*)(const WorkloadSpec&);
void set_gpt_factory(WorkloadFactory f);

/// The inner learning rate at step `step`: linear warm-up over config.warmup steps, then cosine
/// decay to lr_min_ratio × lr at schedule_steps (and flat after).
double inner_lr(const RunConfig& c, std::uint64_t step);

}  // namespace grove::node
