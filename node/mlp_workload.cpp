// The mlp workload: a one-hidden-layer tanh MLP that learns a fixed random teacher network of the
// same shape from noisy samples, in plain C++ (no libtorch), so tests of the whole node run in
// seconds and under the sanitizers. The teacher comes from the run's seed (identical on every
// node); each node draws its own samples from a counter-based stream seeded by its node seed; the
// held-out set is fixed by the run's seed. Targets carry Gaussian noise of standard deviation
// kNoise, so the lowest reachable held-out loss (mean squared error) is about kNoise².
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "node/workload.hpp"
#include "optim/splitmix.hpp"
#include "transport/error.hpp"

namespace grove::node {

namespace {

using optim::splitmix64;

constexpr double kNoise = 0.1;

// Counter-based normal samples: value k of stream `seed` (Box-Muller on two hashed uniforms).
float normal(std::uint64_t seed, std::uint64_t k) {
  const auto u = [&](std::uint64_t j) {
    return (static_cast<double>(splitmix64(seed ^ splitmix64(j)) >> 11) + 0.5) * 0x1.0p-53;
  };
  const double r = std::sqrt(-2.0 * std::log(u(2 * k))), t = 2.0 * M_PI * u(2 * k + 1);
  return static_cast<float>(r * std::cos(t));
}

struct Shape {
  std::size_t in, hidden, out;
  std::size_t params() const { return hidden * in + hidden + out * hidden + out; }
};

// θ layout: W1 (hidden × in), b1 (hidden), W2 (out × hidden), b2 (out).
struct Net {
  Shape s;
  const float* w1(std::span<const float> p) const { return p.data(); }
  const float* b1(std::span<const float> p) const { return p.data() + s.hidden * s.in; }
  const float* w2(std::span<const float> p) const { return b1(p) + s.hidden; }
  const float* b2(std::span<const float> p) const { return w2(p) + s.out * s.hidden; }

  // Forward one sample: h = tanh(W1 x + b1), y = W2 h + b2.
  void forward(std::span<const float> p, const float* x, float* h, float* y) const {
    for (std::size_t j = 0; j < s.hidden; ++j) {
      float a = b1(p)[j];
      const float* row = w1(p) + j * s.in;
      for (std::size_t i = 0; i < s.in; ++i) a += row[i] * x[i];
      h[j] = std::tanh(a);
    }
    for (std::size_t o = 0; o < s.out; ++o) {
      float a = b2(p)[o];
      const float* row = w2(p) + o * s.hidden;
      for (std::size_t j = 0; j < s.hidden; ++j) a += row[j] * h[j];
      y[o] = a;
    }
  }
};

class MlpWorkload final : public Workload {
 public:
  MlpWorkload(const WorkloadSpec& spec, Shape shape)
      : cfg_(spec.config), net_{shape}, node_seed_(splitmix64(spec.node_seed ^ 0x6d6c70)) {
    const std::size_t P = shape.params();
    theta_.resize(P);
    teacher_.resize(P);
    m_.assign(P, 0.0f);
    v_.assign(P, 0.0f);
    // Student and teacher both start from the run seed (students identical on every node).
    const std::uint64_t student = splitmix64(cfg_.seed ^ 0x73747564), teach = splitmix64(cfg_.seed);
    init(theta_, student, 1.0f);
    init(teacher_, teach, 2.0f);  // a teacher with larger weights: a non-trivial target
    // The fixed held-out set.
    const std::size_t n = std::size_t{cfg_.eval_batches} * cfg_.batch;
    eval_x_.resize(n * shape.in);
    eval_y_.resize(n * shape.out);
    sample(splitmix64(cfg_.seed ^ 0x6576616c), 0, n, eval_x_.data(), eval_y_.data());
  }

  std::string describe() const override {
    return "mlp-" + cfg_.model + " (" + std::to_string(num_params()) + " parameters)";
  }
  std::size_t num_params() const override { return theta_.size(); }
  void get_params(std::span<float> out) const override {
    if (out.size() != theta_.size()) throw std::invalid_argument("mlp get_params: size mismatch");
    std::copy(theta_.begin(), theta_.end(), out.begin());
  }
  void set_params(std::span<const float> in) override {
    if (in.size() != theta_.size()) throw std::invalid_argument("mlp set_params: size mismatch");
    std::copy(in.begin(), in.end(), theta_.begin());
  }

  StepResult train_step(std::uint64_t step) override {
    std::vector<float> grad(theta_.size(), 0.0f);
    const auto r = backward(grad);
    adamw(grad, step);
    return r;
  }

  std::vector<std::vector<std::uint64_t>> shapes() const override {
    const Shape& s = net_.s;
    return {{s.hidden, s.in}, {s.hidden}, {s.out, s.hidden}, {s.out}};
  }

  bool gradient(std::uint64_t, std::span<float> grad, StepResult& result) override {
    if (grad.size() != theta_.size()) throw std::invalid_argument("mlp gradient: size mismatch");
    std::fill(grad.begin(), grad.end(), 0.0f);
    result = backward(grad);
    clip(grad);
    return true;
  }

  // One batch's loss and its gradient, added to `grad` (zeros, θ's size).
  StepResult backward(std::span<float> grad) {
    const Shape& s = net_.s;
    const std::size_t B = cfg_.batch;
    std::vector<float> x(B * s.in), y(B * s.out);
    sample(node_seed_, drawn_, B, x.data(), y.data());
    drawn_ += B;
    std::vector<float> h(s.hidden), out(s.out), dh(s.hidden);
    float* gw1 = grad.data();
    float* gb1 = gw1 + s.hidden * s.in;
    float* gw2 = gb1 + s.hidden;
    float* gb2 = gw2 + s.out * s.hidden;
    const float* w2 = net_.w2(theta_);
    double loss = 0;
    const float scale = 2.0f / static_cast<float>(B * s.out);  // d/dŷ of the mean squared error
    for (std::size_t b = 0; b < B; ++b) {
      const float* xb = x.data() + b * s.in;
      net_.forward(theta_, xb, h.data(), out.data());
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (std::size_t o = 0; o < s.out; ++o) {
        const float e = out[o] - y[b * s.out + o];
        loss += static_cast<double>(e) * e;
        const float g = scale * e;
        gb2[o] += g;
        for (std::size_t j = 0; j < s.hidden; ++j) {
          gw2[o * s.hidden + j] += g * h[j];
          dh[j] += g * w2[o * s.hidden + j];
        }
      }
      for (std::size_t j = 0; j < s.hidden; ++j) {
        const float da = dh[j] * (1.0f - h[j] * h[j]);
        gb1[j] += da;
        for (std::size_t i = 0; i < s.in; ++i) gw1[j * s.in + i] += da * xb[i];
      }
    }
    return {loss / static_cast<double>(B * s.out), B};
  }

  double evaluate() override {
    const Shape& s = net_.s;
    const std::size_t n = eval_x_.size() / s.in;
    std::vector<float> h(s.hidden), out(s.out);
    double loss = 0;
    for (std::size_t b = 0; b < n; ++b) {
      net_.forward(theta_, eval_x_.data() + b * s.in, h.data(), out.data());
      for (std::size_t o = 0; o < s.out; ++o) {
        const double e = out[o] - eval_y_[b * s.out + o];
        loss += e * e;
      }
    }
    return loss / static_cast<double>(n * s.out);
  }

  double loss_floor() const override { return kNoise * kNoise; }

  // Blob: "MLPS" u32, u64 adam step, u64 samples drawn, m (P floats), v (P floats).
  std::vector<std::uint8_t> save() const override {
    std::vector<std::uint8_t> b(4 + 16 + 8 * theta_.size());
    std::memcpy(b.data(), "MLPS", 4);
    std::memcpy(b.data() + 4, &adam_step_, 8);
    std::memcpy(b.data() + 12, &drawn_, 8);
    std::memcpy(b.data() + 20, m_.data(), 4 * m_.size());
    std::memcpy(b.data() + 20 + 4 * m_.size(), v_.data(), 4 * v_.size());
    return b;
  }
  transport::Result<void> load(std::span<const std::uint8_t> blob) override {
    const auto bad = [](const char* w) -> transport::Result<void> {
      return {transport::errc::malformed, w};
    };
    if (blob.size() != 20 + 8 * theta_.size() || std::memcmp(blob.data(), "MLPS", 4) != 0)
      return bad("mlp state: wrong size or tag for this model");
    std::vector<float> m(m_.size()), v(v_.size());
    std::uint64_t step = 0, drawn = 0;
    std::memcpy(&step, blob.data() + 4, 8);
    std::memcpy(&drawn, blob.data() + 12, 8);
    std::memcpy(m.data(), blob.data() + 20, 4 * m.size());
    std::memcpy(v.data(), blob.data() + 20 + 4 * m.size(), 4 * v.size());
    for (std::size_t i = 0; i < m.size(); ++i)
      if (!std::isfinite(m[i]) || !std::isfinite(v[i]) || v[i] < 0)
        return bad("mlp state: non-finite or negative optimiser values");
    m_ = std::move(m);
    v_ = std::move(v);
    adam_step_ = step;
    drawn_ = drawn;
    return {};
  }

 private:
  void init(std::vector<float>& p, std::uint64_t seed, float gain) const {
    const Shape& s = net_.s;
    const float a1 = gain / std::sqrt(static_cast<float>(s.in));
    const float a2 = gain / std::sqrt(static_cast<float>(s.hidden));
    std::size_t k = 0;
    for (std::size_t i = 0; i < s.hidden * s.in; ++i, ++k) p[k] = a1 * normal(seed, k);
    for (std::size_t i = 0; i < s.hidden; ++i, ++k) p[k] = 0.0f;
    for (std::size_t i = 0; i < s.out * s.hidden; ++i, ++k) p[k] = a2 * normal(seed, k);
    for (std::size_t i = 0; i < s.out; ++i, ++k) p[k] = 0.0f;
  }

  // Samples first..first+n of stream `seed`: x ~ N(0, 1), y = teacher(x) + N(0, kNoise²).
  void sample(std::uint64_t seed, std::uint64_t first, std::size_t n, float* x, float* y) const {
    const Shape& s = net_.s;
    std::vector<float> h(s.hidden);
    const std::size_t per = s.in + s.out;
    for (std::size_t b = 0; b < n; ++b) {
      const std::uint64_t base = (first + b) * per;
      for (std::size_t i = 0; i < s.in; ++i) x[b * s.in + i] = normal(seed, base + i);
      net_.forward(teacher_, x + b * s.in, h.data(), y + b * s.out);
      for (std::size_t o = 0; o < s.out; ++o)
        y[b * s.out + o] += static_cast<float>(kNoise) * normal(seed, base + s.in + o);
    }
  }

  void clip(std::span<float> g) const {
    if (cfg_.clip <= 0) return;
    double sq = 0;
    for (float v : g) sq += static_cast<double>(v) * v;
    const double norm = std::sqrt(sq);
    if (norm > cfg_.clip) {
      const float f = static_cast<float>(cfg_.clip / norm);
      for (float& v : g) v *= f;
    }
  }

  void adamw(std::vector<float>& g, std::uint64_t step) {
    clip(g);
    ++adam_step_;
    const double lr = inner_lr(cfg_, step);
    const double b1 = cfg_.beta1, b2 = cfg_.beta2;
    const double c1 = 1.0 - std::pow(b1, static_cast<double>(adam_step_));
    const double c2 = 1.0 - std::pow(b2, static_cast<double>(adam_step_));
    const Shape& s = net_.s;
    const std::size_t w1_end = s.hidden * s.in, w2_begin = w1_end + s.hidden,
                      w2_end = w2_begin + s.out * s.hidden;
    for (std::size_t i = 0; i < theta_.size(); ++i) {
      const bool matrix = i < w1_end || (i >= w2_begin && i < w2_end);  // no decay on biases
      if (matrix) theta_[i] -= static_cast<float>(lr * cfg_.weight_decay) * theta_[i];
      m_[i] = static_cast<float>(b1 * m_[i] + (1 - b1) * g[i]);
      v_[i] = static_cast<float>(b2 * v_[i] + (1 - b2) * static_cast<double>(g[i]) * g[i]);
      theta_[i] -= static_cast<float>(lr * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + 1e-8));
    }
  }

  RunConfig cfg_;
  Net net_;
  std::uint64_t node_seed_;
  std::vector<float> theta_, teacher_, m_, v_;
  std::vector<float> eval_x_, eval_y_;
  std::uint64_t adam_step_ = 0;
  std::uint64_t drawn_ = 0;  // training samples drawn so far (the stream position)
};

}  // namespace

std::unique_ptr<Workload> make_mlp_workload(const WorkloadSpec& spec) {
  Shape s{};
  if (spec.config.model == "tiny")
    s = {16, 32, 4};
  else if (spec.config.model == "small")
    s = {64, 256, 16};
  else
    throw transport::ConfigError("mlp workload: unknown model size '" + spec.config.model +
                                 "' (presets: tiny, small)");
  if (spec.config.data != DataKind::synthetic)
    throw transport::ConfigError("mlp workload: trains on its own synthetic data (no --data)");
  return std::make_unique<MlpWorkload>(spec, s);
}

}  // namespace grove::node
