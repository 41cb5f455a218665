// What the simulated nodes train: a cheap objective that runs inside the simulator in place of
// the real workload. Each node draws its own local data (or local optimum) when it is added, and
// an inner phase is H real optimizer steps on it, so that the outer algorithms (NoLoCo, DiLoCo)
// see genuine pseudo-gradients, noise and heterogeneity.
//   NoisyQuadratic  ½·Σ h_k (w_k − c_k)²: curvatures spread over two decades, a known optimum
//                   (loss 0 at w = c), node i's local optimum c + δ_i, SGD with Gaussian
//                   gradient noise. Microseconds per phase even for thousands of nodes.
//   TinyMlp         a 16-32-8 tanh network trained with SGD on labels from a fixed random
//                   "teacher" network; node i draws its inputs around its own shifted mean
//                   (non-identical data). Loss: cross-entropy on a fixed held-out set.
// Everything is drawn from the seeds given; nothing reads a clock or a global generator.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace grove::sim {

class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string name() const = 0;
  virtual std::size_t params() const = 0;
  /// The model every run starts from (the bootstrap node's φ).
  virtual std::vector<float> initial() const = 0;
  /// Node `i` joins: it draws its local data from `rng`. Called once per node, in index order.
  virtual void add_node(std::size_t i, std::mt19937_64& rng) = 0;
  /// One inner phase (H optimizer steps) of node `i`, in place on θ.
  virtual void inner(std::size_t i, std::span<float> theta, std::mt19937_64& rng) = 0;
  /// The objective the swarm minimizes, at `w` (a held-out loss for TinyMlp).
  virtual double loss(std::span<const float> w) const = 0;
  /// Its minimum where known (NaN otherwise).
  virtual double optimum() const = 0;
};

struct QuadraticOptions {
  std::size_t params = 1024;
  std::uint32_t inner_steps = 50;  ///< H
  float lr = 0.5f;                 ///< inner SGD rate (curvatures are ≤ 1)
  float grad_noise = 0.5f;         ///< σ of the Gaussian noise added to every gradient value
  float heterogeneity = 0.5f;      ///< σ of each node's offset δ_i from the global optimum
};
std::unique_ptr<Workload> make_quadratic(std::uint64_t seed, QuadraticOptions o = {});

struct MlpOptions {
  std::uint32_t inner_steps = 50;  ///< H
  std::uint32_t batch = 32;
  float lr = 0.1f;      ///< inner SGD rate
  float shift = 0.75f;  ///< σ of each node's input mean (0: identical data everywhere)
  std::size_t eval_samples = 2048;
};
std::unique_ptr<Workload> make_tiny_mlp(std::uint64_t seed, MlpOptions o = {});

}  // namespace grove::sim
