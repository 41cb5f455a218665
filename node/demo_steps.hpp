// DemoSteps: DeMo for the built-in workloads (outer "demo"; optim/demo.hpp holds the rule). Every
// inner step of the training thread:
//   1. the workload's gradient g (its batch, forward, backward, clip; no optimiser step);
//   2. per tensor, δ ← β·δ + lr·g and this member's message: the top-k DCT coefficients of δ per
//      block, which leave δ (optim::Demo::compress; lr is the run's inner schedule);
//   3. one all-gather of every member's message with the step group (node/collectives.hpp: the
//      members that take part in call k are its group; a dead one is dropped, a joiner comes in
//      at the next call). Messages travel as float32: per block k indices (exact below 2^24)
//      then k values;
//   4. every member applies the group's messages in the group's order with the learning rate of
//      the call's number (both shared by the call's members): θ ← θ − lr·sign(mean of what was
//      sent), the same bits on every member.
// A member whose message is malformed is left out of the step (the log says who); a failed call
// (its deadline, a lost group) steps with our own message alone, as a member alone does.
// A joiner: the call after which the group has a member its previous call did not (the
// outcome's `joined`) is followed by one all-gather that aligns θ: every member sends (θ, 1 if it
// has stepped, else 0) and takes the θ of the first member by rank that has stepped (exactly:
// those all hold the same bits). δ stays each member's own (a joiner's starts at zero; it is not
// in a checkpoint, as in the reference). Every 1000th call logs a hash of θ.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "node/collectives.hpp"
#include "node/config.hpp"
#include "node/workload.hpp"
#include "optim/demo.hpp"

namespace grove::node {

struct DemoStep {
  StepResult step;
  std::uint32_t members = 1;  ///< messages applied (ours included)
  bool aligned = false;       ///< θ was aligned with a joiner's group before the step
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::string problem;  ///< when the exchange failed or a message was refused: why
};

class DemoSteps {
 public:
  /// Throws ConfigError when a tensor's shape does not fit DeMo's blocks.
  DemoSteps(Workload& w, const RunConfig& c, Collectives& calls);
  /// One inner step (number `step`: the learning-rate schedule's).
  DemoStep step(std::uint64_t step, const std::function<bool()>& stopping);
  /// Float32 values of one member's message (per tensor, per block: k indices, k values).
  std::size_t message_values() const { return msg_values_; }

  /// A message in floats to optim::Demo's bytes, tensor by tensor (false: an index that is not
  /// a whole number below 65536; optim::demo_check sees the rest).
  static bool to_bytes(const optim::DemoBlocks& b, std::span<const float> in,
                       std::span<std::uint8_t> out);
  static void to_floats(const optim::DemoBlocks& b, std::span<const std::uint8_t> in,
                        std::span<float> out);

 private:
  bool align(const std::function<bool()>& stopping, DemoStep& out);

  Workload& w_;
  const RunConfig& c_;
  Collectives& calls_;
  std::vector<optim::DemoBlocks> blocks_;
  std::vector<std::size_t> offset_;      // each tensor's first value in θ
  std::vector<std::size_t> msg_offset_;  // each tensor's first value in a message
  std::size_t msg_values_ = 0;
  std::vector<float> theta_, grad_, delta_;
  std::vector<std::uint8_t> bytes_;  // one tensor's message in optim::Demo's format
  std::vector<std::vector<std::uint8_t>> members_;
  optim::Demo demo_;
  bool stepped_ = false;  // a step of ours has been applied (a joiner's θ is not the group's)
};

}  // namespace grove::node
