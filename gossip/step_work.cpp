#include "gossip/step_work.hpp"

#include "transport/crypto.hpp"

namespace grove::gossip {

Digest weights_hash(std::span<const float> phi) {
  return transport::blake2b_256(
      {reinterpret_cast<const std::uint8_t*>(phi.data()), phi.size_bytes()});
}

void StepWork::run() {
  auto& phi = state.phi;
  auto& m = state.momentum;
  switch (kind) {
    case Kind::none:
      break;
    case Kind::local:
      if (mode == OuterMode::noloco && noloco.one_tensor()) {
        optim::noloco_step_theta(phi, m, theta, noloco, threads);
      } else {
        std::vector<float> d(phi.size());
        optim::pseudo_gradient(phi, theta, d, threads);
        if (mode == OuterMode::diloco) {
          optim::diloco_step(phi, m, d, diloco, threads);
        } else {
          const auto phi0 = phi;
          optim::noloco_step(phi, m, d, phi0, noloco, threads);
        }
      }
      break;
    case Kind::noloco_mean:
      if (noloco.one_tensor())
        optim::noloco_step_theta(phi, m, theta, noloco, threads);
      else
        optim::noloco_step(phi, m, theta, phi_mean, noloco, threads);
      break;
    case Kind::parse: {
      auto s = optim::deserialize(blob, max_values);
      blob = {};
      if (!s) {
        error = "the downloaded state does not parse";
        return;
      }
      if (want && s->phi.size() != *want) {
        error = "the downloaded state has " + std::to_string(s->phi.size()) + " values, we need " +
                std::to_string(*want);
        return;
      }
      if (s->momentum.size() != s->phi.size()) s->momentum.assign(s->phi.size(), 0.0f);
      state = std::move(*s);
      break;
    }
    case Kind::diloco_ring: {
      std::span<const float> mean_delta(ring);
      if (average_phi) {
        // Members entered from NoLoCo: one φ, one momentum (zero) and one round for the group.
        const auto n = static_cast<std::ptrdiff_t>(phi.size());
        std::copy(ring.begin(), ring.begin() + n, phi.begin());
        std::fill(m.begin(), m.end(), 0.0f);
        mean_delta = mean_delta.subspan(phi.size());
      }
      optim::diloco_step(phi, m, mean_delta, diloco, threads);
      break;
    }
  }
  phi_mean = {};
  hash = weights_hash(phi);
  if (serialise) bytes = std::make_shared<const std::vector<std::uint8_t>>(optim::serialize(state));
}

}  // namespace grove::gossip
