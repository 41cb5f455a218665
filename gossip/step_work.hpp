// StepWork: the model-sized work that ends a round, as one job for the driver to run off its
// strand (seconds for a large model): the outer step with what the round's averaging gave (or the
// local step alone), the new φ's hash and the new state's serialised form; or the parsing of a
// downloaded state. run() touches nothing but the job's own fields.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gossip/mode.hpp"
#include "gossip/protocol.hpp"
#include "optim/buffer.hpp"
#include "optim/outer.hpp"

namespace grove::gossip {

/// BLAKE2b-256 of the values' bytes.
Digest weights_hash(std::span<const float> phi);

struct StepWork {
  enum class Kind {
    none,         ///< φ stays (the inner phase was lost)
    local,        ///< no partner: θ against φ alone
    noloco_mean,  ///< NoLoCo with the exchange's mean: of θ (β = γ), or of Δ and of φ
    diloco_ring,  ///< DiLoCo with the all-reduce's mean Δ (or mean φ ‖ mean Δ)
    parse,        ///< a downloaded state: `blob` parsed into `state` (no step)
  } kind = Kind::none;
  optim::OuterState state;  ///< in: φ, momentum, the round after the step; out: the new state
  OuterMode mode = OuterMode::noloco;
  std::vector<float> theta;     ///< local: θ; noloco_mean: the mean of θ, or of Δ (β ≠ γ)
  std::vector<float> phi_mean;  ///< noloco_mean with β ≠ γ: the mean of φ
  optim::FloatBuffer ring;      ///< diloco_ring: the result, kept for the next all-reduce
  bool average_phi = false;     ///< diloco_ring: the result is mean φ ‖ mean Δ
  optim::NoLoCoConfig noloco;
  optim::DiLoCoConfig diloco;
  unsigned threads = 0;
  optim::ByteBuffer blob;           ///< parse: the verified download
  std::size_t max_values = 0;       ///< parse: optim::deserialize's bound
  std::optional<std::size_t> want;  ///< parse: φ's size when known
  std::string error;                ///< parse: why the state was refused (out)
  bool serialise = false;           ///< make `bytes` (the engine serves snapshots)
  Digest hash{};                    ///< out: of the new φ
  std::shared_ptr<const std::vector<std::uint8_t>> bytes;  ///< out: optim::serialize(state)
  void run();
};

}  // namespace grove::gossip
