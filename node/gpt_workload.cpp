// The default workload: a byte-level GPT-style causal transformer on libtorch, trained with
// AdamW on a Corpus (node/corpus.hpp). This is the only translation unit that includes
// <torch/torch.h> (~25 s and ~1.1 GB of compiler memory), so nothing else pays for it.
//
// Model: token and learned position embeddings, pre-norm blocks (LayerNorm → causal multi-head
// self-attention → residual; LayerNorm → GELU MLP of 4× width → residual), a final LayerNorm and
// an output head tied to the token embedding. No dropout: the data is a stream, not a small set
// to memorise, and without it a step is a pure function of θ, the optimiser state and the batch.
//
// θ is every parameter in named_parameters() order, flattened (the order the modules are
// registered in below). The initial θ is drawn by a portable generator of our own from
// config.seed, not by libtorch's, whose normal sampler takes different code paths on different
// CPUs: every node of a run must start from the same bits.
#include <torch/torch.h>

#include <dlfcn.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <thread>

#include "node/corpus.hpp"
#include "node/workload.hpp"
#include "optim/splitmix.hpp"
#include "transport/crypto.hpp"
#include "transport/error.hpp"

namespace grove::node {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the optimiser blob stores floats in the host's byte order, assumed little-endian");

constexpr std::int64_t kVocab = 256;  // bytes
constexpr double kAdamEps = 1e-8;     // torch.optim.AdamW's default
constexpr double kInitStd = 0.02;     // GPT-2's

struct Preset {
  const char* name;
  int layers;
  int dim;
  int heads;
};
// tiny: for tests (well under a second per step); small: the default, a few million parameters
// that train at a useful speed on two CPU cores; base: for machines with more to give.
constexpr Preset kPresets[] = {{"tiny", 2, 64, 2}, {"small", 4, 256, 4}, {"base", 6, 384, 6}};

const Preset& find_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p;
  std::string list;
  for (const auto& p : kPresets) list += std::string(list.empty() ? "" : ", ") + p.name;
  throw transport::ConfigError("unknown gpt model preset '" + name + "' (presets: " + list + ")");
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// ---- The model ---------------------------------------------------------------------------------

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(std::int64_t dim, std::int64_t heads) : heads_(heads) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj_ = register_module("proj", torch::nn::Linear(dim, dim));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc_ = register_module("fc", torch::nn::Linear(dim, 4 * dim));
    out_ = register_module("out", torch::nn::Linear(4 * dim, dim));
  }

  /// x: (batch, time, dim); mask: (time, time), 0 on and below the diagonal, −inf above.
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    const auto b = x.size(0), t = x.size(1), c = x.size(2), hd = c / heads_;
    // (b, t, 3, heads, hd) → (3, b, heads, t, hd): q, k and v of every head in one matmul.
    const auto qkv = qkv_(ln1_(x)).view({b, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
    const auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto att = torch::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(double(hd)));
    att = torch::softmax(att.add_(mask), -1);
    const auto y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, c});
    x = x + proj_(y);
    return x + out_(torch::gelu(fc_(ln2_(x))));
  }

 private:
  std::int64_t heads_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  GptImpl(const Preset& p, std::int64_t seq_len) {
    wte_ = register_module("wte", torch::nn::Embedding(kVocab, p.dim));
    wpe_ = register_module("wpe", torch::nn::Embedding(seq_len, p.dim));
    for (int i = 0; i < p.layers; ++i)
      blocks_.push_back(register_module("h" + std::to_string(i), Block(p.dim, p.heads)));
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({p.dim})));
    mask_ = torch::full({seq_len, seq_len}, -std::numeric_limits<float>::infinity()).triu(1);
    positions_ = torch::arange(seq_len, torch::kLong);
  }

  /// idx: (batch, time) byte values → logits (batch, time, 256).
  torch::Tensor forward(const torch::Tensor& idx) {
    const auto t = idx.size(1);
    auto x = wte_(idx) + wpe_(positions_.narrow(0, 0, t));
    const auto mask = mask_.narrow(0, 0, t).narrow(1, 0, t);
    for (auto& b : blocks_) x = b->forward(x, mask);
    // The head shares the token embedding's matrix (fewer parameters, as in GPT-2).
    return torch::matmul(ln_f_(x), wte_->weight.t());
  }

 private:
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::Tensor mask_, positions_;
};
TORCH_MODULE(Gpt);

using optim::splitmix64;

// Gaussian draws for the initial θ: a counter hashed by splitmix64, Box–Muller in double, rounded
// to float. Double-precision log/cos differ between libm builds at most in the last bit, which the
// rounding to float all but always hides.
class InitRng {
 public:
  explicit InitRng(std::uint64_t seed) : x_(seed) {}
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  double uniform() {  // in (0, 1)
    x_ += optim::kSplitmixGamma;
    return (static_cast<double>(splitmix64(x_) >> 11) + 0.5) * 0x1p-53;
  }
  std::uint64_t x_;
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Compute threads. libtorch's intra-op pool (OpenMP) runs the element-wise work and OpenBLAS's
// pthread pool the matrix products; idle threads of both spin, so two full pools on the same
// cores steal from each other. Medians measured on 2 busy cores (gpt-small, batch 16 × 128):
// libtorch 2 + OpenBLAS 2 threads 1.45 s a step, libtorch 2 + OpenBLAS 1 0.70 s, libtorch 1 +
// OpenBLAS 2 0.43 s (libtorch 2 + OpenBLAS 2 reaches 0.55 s only with OMP_WAIT_POLICY=passive,
// which must be set before the process starts). So with the pthread OpenBLAS the matrix
// products get the threads and libtorch runs one; with any other BLAS (OpenMP OpenBLAS shares
// libtorch's pool, others are unknown) libtorch gets them. OpenBLAS is looked up at run time, as
// libtorch may be linked to another BLAS. torch::set_num_threads is process-wide: one workload
// per process.
void set_threads(unsigned requested) {
  const int n =
      static_cast<int>(requested ? requested : std::max(1u, std::thread::hardware_concurrency()));
  using SetThreads = void (*)(int);
  using GetParallel = int (*)();
  const auto set_blas =
      reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  const auto blas_parallel =
      reinterpret_cast<GetParallel>(::dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  constexpr int kOpenBlasPthreads = 1;  // openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP
  if (set_blas && blas_parallel && blas_parallel() == kOpenBlasPthreads) {
    set_blas(n);
    torch::set_num_threads(1);
  } else {
    torch::set_num_threads(n);
  }
}

// The run's preset, after checking that a training step fits this machine's memory. The bound
// is rough (activations kept for backward, logits, parameters, gradients, two moments), but an
// impossible config is refused at start-up rather than failing an allocation mid-run.
const Preset& checked_preset(const RunConfig& c) {
  const Preset& p = find_preset(c.model);
  const double b = c.batch, t = c.seq_len, d = p.dim;
  const double params = p.layers * 12 * d * d + (kVocab + t) * d;
  const double per_layer = b * t * 20 * d + 3 * b * p.heads * t * t;
  const double need = 4 * (p.layers * per_layer + 3 * b * t * kVocab + 4 * params);
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  if (have > 0 && need > have)
    throw transport::ConfigError(
        format("gpt-%s with batch %u x seq_len %u needs about %.1f GiB "
               "per step; this machine has %.1f GiB",
               p.name, c.batch, c.seq_len, need / (1 << 30), have / (1 << 30)));
  return p;
}

// ---- The optimiser state blob ------------------------------------------------------------------
//
//   "GRVGPT01"                    8 bytes
//   u64 tensors, u64 values, u64 AdamW step     (little-endian)
//   u64 numel of each tensor      (named_parameters order)
//   f32 exp_avg of every value, then f32 exp_avg_sq of every value
//   CorpusState                   CorpusState::kEncodedSize bytes
//   BLAKE2b-256 of all the above  32 bytes
//
// One step counter serves all tensors: they are always stepped together.
constexpr char kMagic[8] = {'G', 'R', 'V', 'G', 'P', 'T', '0', '1'};
constexpr std::size_t kHeader = 8 + 3 * 8;
constexpr std::size_t kHash = 32;

std::uint64_t get_u64(std::span<const std::uint8_t> in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{in[at + i]} << (8 * i);
  return v;
}

// ---- The workload ------------------------------------------------------------------------------

class GptWorkload final : public Workload {
 public:
  explicit GptWorkload(const WorkloadSpec& spec)
      : cfg_(spec.config),
        preset_(checked_preset(cfg_)),
        corpus_(cfg_, spec.data_files, spec.node_seed) {
    set_threads(spec.threads);
    model_ = Gpt(preset_, cfg_.seq_len);
    std::size_t index = 0;
    const std::uint64_t init_seed = splitmix64(cfg_.seed ^ 0x696e697400000004);  // "init"
    torch::NoGradGuard no_grad;
    for (const auto& np : model_->named_parameters()) {
      torch::Tensor p = np.value();
      if (p.scalar_type() != torch::kFloat || !p.is_contiguous())
        throw std::logic_error("gpt: parameter " + np.key() + " is not contiguous float32");
      const std::string& name = np.key();
      // Decay only the matrices of the blocks' linear layers: embeddings (the head included, it
      // is tied), LayerNorm gains and biases are not pulled towards zero, as in GPT-2 / nanoGPT
      // practice for norms and biases and keeping embedding rows of rare bytes intact.
      const bool matrix = p.dim() == 2 && name.rfind("wte", 0) != 0 && name.rfind("wpe", 0) != 0;
      init(p, name, InitRng(splitmix64(init_seed + index)));
      params_.push_back(p);
      decay_.push_back(matrix);
      m_.push_back(torch::zeros_like(p));
      v_.push_back(torch::zeros_like(p));
      num_params_ += static_cast<std::size_t>(p.numel());
      ++index;
    }
    batch_.resize(std::size_t{cfg_.batch} * corpus_.window_bytes());
  }

  std::string describe() const override {
    return format("gpt-%s (%.2fM parameters: %d layers, d=%d, %d heads, seq_len %u)", preset_.name,
                  num_params_ / 1e6, preset_.layers, preset_.dim, preset_.heads, cfg_.seq_len);
  }

  std::size_t num_params() const override { return num_params_; }

  void get_params(std::span<float> out) const override {
    check_size(out.size(), "get_params");
    std::size_t at = 0;
    for (const auto& p : params_) {
      const auto n = static_cast<std::size_t>(p.numel());
      std::memcpy(out.data() + at, p.data_ptr<float>(), n * sizeof(float));
      at += n;
    }
  }

  // Writes through the parameters' storage: the optimiser's moments are untouched, and no
  // autograd graph is alive between steps that could have saved the old values.
  void set_params(std::span<const float> in) override {
    check_size(in.size(), "set_params");
    std::size_t at = 0;
    for (auto& p : params_) {
      const auto n = static_cast<std::size_t>(p.numel());
      std::memcpy(p.data_ptr<float>(), in.data() + at, n * sizeof(float));
      at += n;
    }
  }

  StepResult train_step(std::uint64_t step) override {
    const auto b = backward();
    torch::NoGradGuard no_grad;  // (the step writes the parameters in place)
    if (b.finite) adamw(inner_lr(cfg_, step));
    return b.step;
  }

  std::vector<std::vector<std::uint64_t>> shapes() const override {
    std::vector<std::vector<std::uint64_t>> out;
    for (const auto& p : params_) {
      std::vector<std::uint64_t> s;
      for (const auto d : p.sizes()) s.push_back(static_cast<std::uint64_t>(d));
      out.push_back(std::move(s));
    }
    return out;
  }

  bool gradient(std::uint64_t, std::span<float> grad, StepResult& result) override {
    check_size(grad.size(), "gradient");
    const auto b = backward();
    result = b.step;
    std::size_t at = 0;
    for (const auto& p : params_) {
      const auto n = static_cast<std::size_t>(p.numel());
      if (b.finite)
        std::memcpy(grad.data() + at, p.grad().data_ptr<float>(), n * sizeof(float));
      else
        std::fill_n(grad.data() + at, n, 0.0f);
      at += n;
    }
    return true;
  }

  double evaluate() override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const auto windows = corpus_.eval_windows();
    const std::size_t per_batch = batch_.size();
    double sum = 0;
    for (std::uint32_t b = 0; b < cfg_.eval_batches; ++b) {
      const auto [x, y] = inputs_and_targets(windows.data() + b * per_batch);
      sum += loss_of(x, y).item<double>();
    }
    model_->train();
    // Batches are the same size, so the mean of their means is the mean over all targets.
    return sum / cfg_.eval_batches;
  }

  double loss_floor() const override { return corpus_.loss_floor(); }

  std::vector<std::uint8_t> save() const override {
    // Sized up front and filled in place: the moments are most of it (8 bytes per parameter).
    std::vector<std::uint8_t> out(blob_size());
    std::size_t at = 0;
    auto put = [&](const void* src, std::size_t n) {
      std::memcpy(out.data() + at, src, n);
      at += n;
    };
    auto put_u64 = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) out[at++] = static_cast<std::uint8_t>(v >> (8 * i));
    };
    put(kMagic, sizeof kMagic);
    put_u64(params_.size());
    put_u64(num_params_);
    put_u64(adam_step_);
    for (const auto& p : params_) put_u64(static_cast<std::uint64_t>(p.numel()));
    for (const auto* moments : {&m_, &v_})
      for (const auto& t : *moments) put(t.data_ptr<float>(), t.numel() * sizeof(float));
    std::vector<std::uint8_t> corpus;
    corpus_.state().encode_to(corpus);
    put(corpus.data(), corpus.size());
    const auto h = transport::blake2b_256(std::span(out).first(at));
    put(h.data(), h.size());
    return out;
  }

  // Everything is checked before anything changes, so a refused blob leaves the state as it was.
  transport::Result<void> load(std::span<const std::uint8_t> blob) override {
    auto fail = [](const std::string& w) -> transport::Result<void> {
      return {transport::errc::malformed, "gpt optimiser state: " + w};
    };
    if (blob.size() < kHeader + kHash) return fail("truncated header");
    if (std::memcmp(blob.data(), kMagic, 8) != 0) return fail("not a gpt optimiser state");
    if (get_u64(blob, 8) != params_.size())
      return fail(format("%llu tensors, the model has %zu",
                         static_cast<unsigned long long>(get_u64(blob, 8)), params_.size()));
    if (get_u64(blob, 16) != num_params_)
      return fail(format("%llu values, the model has %zu",
                         static_cast<unsigned long long>(get_u64(blob, 16)), num_params_));
    if (blob.size() != blob_size())
      return fail(format("%zu bytes, expected %zu", blob.size(), blob_size()));
    const std::size_t body = blob.size() - kHash;
    const auto h = transport::blake2b_256(blob.first(body));
    if (std::memcmp(h.data(), blob.data() + body, kHash) != 0) return fail("checksum mismatch");
    const std::uint64_t step = get_u64(blob, 24);
    if (step > (std::uint64_t{1} << 53)) return fail("step count out of range");
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (get_u64(blob, kHeader + 8 * i) != static_cast<std::uint64_t>(params_[i].numel()))
        return fail(format("tensor %zu (%s) has another size", i, names_at(i).c_str()));

    const std::size_t moments_at = kHeader + 8 * params_.size();
    const std::size_t v_at = moments_at + num_params_ * sizeof(float);
    for (std::size_t i = 0; i < 2 * num_params_; ++i) {
      float x;
      std::memcpy(&x, blob.data() + moments_at + i * sizeof(float), sizeof x);
      if (!std::isfinite(x)) return fail("a non-finite moment");
      if (i >= num_params_ && x < 0) return fail("a negative second moment");
      if (step == 0 && x != 0) return fail("moments without a step");
    }
    const auto state = CorpusState::decode(
        blob.subspan(v_at + num_params_ * sizeof(float), CorpusState::kEncodedSize));
    if (!state) return fail("bad corpus state");
    if (auto r = corpus_.restore(*state); !r) return fail(r.why());

    std::size_t at = moments_at;
    for (auto* moments : {&m_, &v_})
      for (auto& t : *moments) {
        const auto n = static_cast<std::size_t>(t.numel()) * sizeof(float);
        std::memcpy(t.data_ptr<float>(), blob.data() + at, n);
        at += n;
      }
    adam_step_ = step;
    return {};
  }

 private:
  void check_size(std::size_t n, const char* what) const {
    if (n != num_params_)
      throw std::invalid_argument(
          format("GptWorkload::%s: %zu values, the model has %zu", what, n, num_params_));
  }

  std::size_t blob_size() const {
    return kHeader + 8 * params_.size() + 2 * num_params_ * sizeof(float) +
           CorpusState::kEncodedSize + kHash;
  }

  std::string names_at(std::size_t i) const {
    const auto named = model_->named_parameters();
    return i < named.size() ? named[i].key() : "?";
  }

  // GPT-2's initialisation: N(0, 0.02) for matrices and embeddings, the projections back into
  // the residual stream scaled by 1/√(2·layers) so that the stream's variance does not grow with
  // depth; biases 0, LayerNorm gains 1.
  void init(torch::Tensor& p, const std::string& name, InitRng rng) const {
    if (ends_with(name, ".bias")) {
      p.zero_();
      return;
    }
    if (name.find("ln") != std::string::npos) {  // ln1, ln2, ln_f gains
      p.fill_(1.0f);
      return;
    }
    double std_dev = kInitStd;
    if (ends_with(name, "proj.weight") || ends_with(name, "out.weight"))
      std_dev /= std::sqrt(2.0 * preset_.layers);
    auto* data = p.data_ptr<float>();
    for (std::int64_t i = 0; i < p.numel(); ++i)
      data[i] = static_cast<float>(std_dev * rng.normal());
  }

  std::pair<torch::Tensor, torch::Tensor> inputs_and_targets(const std::uint8_t* windows) const {
    const auto b = static_cast<std::int64_t>(cfg_.batch);
    const auto w = static_cast<std::int64_t>(corpus_.window_bytes());
    // from_blob does not copy; the conversion to int64 does, so the buffer may be reused.
    const auto data = torch::from_blob(const_cast<std::uint8_t*>(windows), {b, w}, torch::kUInt8)
                          .to(torch::kLong);
    return {data.narrow(1, 0, w - 1), data.narrow(1, 1, w - 1)};
  }

  torch::Tensor loss_of(const torch::Tensor& x, const torch::Tensor& y) {
    const auto logits = model_->forward(x);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), y.reshape({-1}));
  }

  // A step's batch, forward, backward and clip: the gradients are in the parameters' grad.
  // A non-finite loss or gradient (θ damaged from outside, or a diverged run) must not reach θ
  // or the optimiser's state: `finite` is false and the caller sees the loss.
  struct Backward {
    StepResult step;
    bool finite = false;
  };
  Backward backward() {
    corpus_.next_windows(batch_);
    const auto [x, y] = inputs_and_targets(batch_.data());
    model_->train();
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
    const auto loss = loss_of(x, y);
    loss.backward();
    Backward b;
    b.step.loss = loss.item<double>();
    b.step.tokens = std::uint64_t{cfg_.batch} * cfg_.seq_len;

    torch::NoGradGuard no_grad;
    double sq = 0;
    for (const auto& p : params_) sq += p.grad().square().sum().item<double>();
    const double norm = std::sqrt(sq);
    if (!std::isfinite(b.step.loss) || !std::isfinite(norm)) return b;
    if (cfg_.clip > 0 && norm > cfg_.clip) {
      const double scale = cfg_.clip / (norm + 1e-6);  // as torch.nn.utils.clip_grad_norm_
      for (auto& p : params_) p.grad().mul_(scale);
    }
    b.finite = true;
    return b;
  }

  // AdamW exactly as torch.optim.AdamW (decoupled decay, bias-corrected moments, eps added
  // after the square root), written out so that its state is ours to save and restore.
  void adamw(double lr) {
    ++adam_step_;
    const double b1 = cfg_.beta1, b2 = cfg_.beta2;
    const double t = static_cast<double>(adam_step_);
    const double step_size = lr / (1 - std::pow(b1, t));
    const double bc2_sqrt = std::sqrt(1 - std::pow(b2, t));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      const auto& g = p.grad();
      if (decay_[i] && cfg_.weight_decay > 0) p.mul_(1 - lr * cfg_.weight_decay);
      m_[i].mul_(b1).add_(g, 1 - b1);
      v_[i].mul_(b2).addcmul_(g, g, 1 - b2);
      p.addcdiv_(m_[i], (v_[i].sqrt() / bc2_sqrt).add_(kAdamEps), -step_size);
    }
  }

  RunConfig cfg_;
  const Preset& preset_;
  Corpus corpus_;
  Gpt model_{nullptr};
  std::vector<torch::Tensor> params_;
  std::vector<bool> decay_;
  std::vector<torch::Tensor> m_, v_;  // AdamW's first and second moments, one per parameter
  std::uint64_t adam_step_ = 0;
  std::size_t num_params_ = 0;
  std::vector<std::uint8_t> batch_;
};

}  // namespace

std::unique_ptr<Workload> make_gpt_workload(const WorkloadSpec& spec) {
  return std::make_unique<GptWorkload>(spec);
}

}  // namespace grove::node
