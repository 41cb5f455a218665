#include "sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace grove::sim {

namespace {

class NoisyQuadratic final : public Workload {
 public:
  NoisyQuadratic(std::uint64_t seed, QuadraticOptions o) : o_(o) {
    if (o_.params == 0 || o_.inner_steps == 0) throw std::invalid_argument("quadratic: empty");
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    h_.resize(o_.params);
    c_.resize(o_.params);
    for (std::size_t k = 0; k < o_.params; ++k) {
      const double t = o_.params > 1 ? static_cast<double>(k) / double(o_.params - 1) : 0.0;
      h_[k] = static_cast<float>(std::pow(10.0, -2.0 + 2.0 * t));  // 0.01 … 1
      c_[k] = n01(rng);
    }
  }
  std::string name() const override { return "quadratic"; }
  std::size_t params() const override { return o_.params; }
  std::vector<float> initial() const override { return std::vector<float>(o_.params, 0.0f); }
  void add_node(std::size_t i, std::mt19937_64& rng) override {
    if (offsets_.size() <= i) offsets_.resize(i + 1);
    std::normal_distribution<float> nd(0.0f, o_.heterogeneity);
    auto& d = offsets_[i];
    d.resize(o_.params);
    for (auto& v : d) v = nd(rng);
  }
  void inner(std::size_t i, std::span<float> theta, std::mt19937_64& rng) override {
    const auto& d = offsets_.at(i);
    std::normal_distribution<float> noise(0.0f, o_.grad_noise);
    for (std::uint32_t s = 0; s < o_.inner_steps; ++s)
      for (std::size_t k = 0; k < theta.size(); ++k) {
        const float g = h_[k] * (theta[k] - c_[k] - d[k]) + noise(rng);
        theta[k] -= o_.lr * g;
      }
  }
  double loss(std::span<const float> w) const override {
    double s = 0;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const double e = double(w[k]) - c_[k];
      s += 0.5 * h_[k] * e * e;
    }
    return s / static_cast<double>(w.size());
  }
  double optimum() const override { return 0.0; }

 private:
  QuadraticOptions o_;
  std::vector<float> h_, c_;
  std::vector<std::vector<float>> offsets_;
};

// A 16-32-8 tanh MLP with hand-written forward and backward passes.
class TinyMlp final : public Workload {
  static constexpr std::size_t D = 16, Hd = 32, C = 8;
  static constexpr std::size_t W1 = 0, B1 = W1 + Hd * D, W2 = B1 + Hd, B2 = W2 + C * Hd, P = B2 + C;

 public:
  TinyMlp(std::uint64_t seed, MlpOptions o) : o_(o) {
    if (o_.inner_steps == 0 || o_.batch == 0) throw std::invalid_argument("mlp: empty");
    std::mt19937_64 rng(seed);
    teacher_ = random_net(rng, 2.0f);
    init_ = random_net(rng, 1.0f);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    eval_x_.resize(o_.eval_samples * D);
    for (auto& v : eval_x_) v = n01(rng);
    eval_y_.resize(o_.eval_samples);
    for (std::size_t s = 0; s < o_.eval_samples; ++s)
      eval_y_[s] = label(std::span<const float>(eval_x_).subspan(s * D, D));
  }
  std::string name() const override { return "mlp"; }
  std::size_t params() const override { return P; }
  std::vector<float> initial() const override { return init_; }
  void add_node(std::size_t i, std::mt19937_64& rng) override {
    if (means_.size() <= i) means_.resize(i + 1);
    std::normal_distribution<float> nd(0.0f, o_.shift);
    auto& m = means_[i];
    m.resize(D);
    for (auto& v : m) v = o_.shift > 0 ? nd(rng) : 0.0f;
  }
  void inner(std::size_t i, std::span<float> w, std::mt19937_64& rng) override {
    const auto& mu = means_.at(i);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> x(D), h(Hd), z(C), grad(P);
    for (std::uint32_t s = 0; s < o_.inner_steps; ++s) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      for (std::uint32_t b = 0; b < o_.batch; ++b) {
        for (std::size_t d = 0; d < D; ++d) x[d] = mu[d] + n01(rng);
        const std::size_t y = label(x);
        forward(w, x, h, z);
        softmax(z);
        z[y] -= 1.0f;  // dL/dz for cross-entropy
        const float inv = 1.0f / static_cast<float>(o_.batch);
        for (std::size_t c = 0; c < C; ++c) {
          const float dz = z[c] * inv;
          grad[B2 + c] += dz;
          for (std::size_t j = 0; j < Hd; ++j) grad[W2 + c * Hd + j] += dz * h[j];
        }
        for (std::size_t j = 0; j < Hd; ++j) {
          float dh = 0;
          for (std::size_t c = 0; c < C; ++c) dh += w[W2 + c * Hd + j] * z[c] * inv;
          const float da = dh * (1.0f - h[j] * h[j]);
          grad[B1 + j] += da;
          for (std::size_t d = 0; d < D; ++d) grad[W1 + j * D + d] += da * x[d];
        }
      }
      for (std::size_t k = 0; k < P; ++k) w[k] -= o_.lr * grad[k];
    }
  }
  double loss(std::span<const float> w) const override {
    std::vector<float> h(Hd), z(C);
    double s = 0;
    for (std::size_t n = 0; n < o_.eval_samples; ++n) {
      forward(w, std::span<const float>(eval_x_).subspan(n * D, D), h, z);
      const float m = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (float v : z) sum += std::exp(double(v) - m);
      s += std::log(sum) + m - z[eval_y_[n]];
    }
    return s / static_cast<double>(o_.eval_samples);
  }
  double optimum() const override { return std::numeric_limits<double>::quiet_NaN(); }

 private:
  static std::vector<float> random_net(std::mt19937_64& rng, float gain) {
    std::vector<float> w(P, 0.0f);
    std::normal_distribution<float> n1(0.0f, gain / std::sqrt(float(D)));
    std::normal_distribution<float> n2(0.0f, gain / std::sqrt(float(Hd)));
    for (std::size_t k = W1; k < B1; ++k) w[k] = n1(rng);
    for (std::size_t k = W2; k < B2; ++k) w[k] = n2(rng);
    return w;
  }
  static void forward(std::span<const float> w, std::span<const float> x, std::vector<float>& h,
                      std::vector<float>& z) {
    for (std::size_t j = 0; j < Hd; ++j) {
      float a = w[B1 + j];
      for (std::size_t d = 0; d < D; ++d) a += w[W1 + j * D + d] * x[d];
      h[j] = std::tanh(a);
    }
    for (std::size_t c = 0; c < C; ++c) {
      float a = w[B2 + c];
      for (std::size_t j = 0; j < Hd; ++j) a += w[W2 + c * Hd + j] * h[j];
      z[c] = a;
    }
  }
  static void softmax(std::vector<float>& z) {
    const float m = *std::max_element(z.begin(), z.end());
    float sum = 0;
    for (auto& v : z) sum += (v = std::exp(v - m));
    for (auto& v : z) v /= sum;
  }
  std::size_t label(std::span<const float> x) const {
    std::vector<float> h(Hd), z(C);
    forward(teacher_, x, h, z);
    return static_cast<std::size_t>(std::max_element(z.begin(), z.end()) - z.begin());
  }

  MlpOptions o_;
  std::vector<float> teacher_, init_, eval_x_;
  std::vector<std::size_t> eval_y_;
  std::vector<std::vector<float>> means_;
};

}  // namespace

std::unique_ptr<Workload> make_quadratic(std::uint64_t seed, QuadraticOptions o) {
  return std::make_unique<NoisyQuadratic>(seed, o);
}

std::unique_ptr<Workload> make_tiny_mlp(std::uint64_t seed, MlpOptions o) {
  return std::make_unique<TinyMlp>(seed, o);
}

}  // namespace grove::sim
