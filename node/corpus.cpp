#include "node/corpus.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "optim/splitmix.hpp"
#include "transport/error.hpp"

namespace grove::node {
namespace {

using transport::ConfigError;

// The synthetic source: contexts are the last two symbols (prev * kSymbols + last). Each last
// symbol has kSuccessors possible followers and each context picks kChoices of them, so a model
// that sees one symbol of context can narrow the next one to ~8 and one that sees two to ~3:
// the loss has a visible step from unigram (~ln 64) to bigram (~ln 8) to the floor.
constexpr int kSymbols = 64;
constexpr int kContexts = kSymbols * kSymbols;
constexpr int kSuccessors = 8;
constexpr int kChoices = 3;
// Printable, so a sample of the stream can be read in a log.
constexpr char kAlphabet[kSymbols + 1] =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .";
// Steps run before a stream's first window: the chain forgets its arbitrary start long before,
// so windows are distributed as the stationary chain (which the floor assumes).
constexpr int kBurnIn = 1024;

// Domain tags, so that the chain, the held-out stream and the training streams drawn from one
// config.seed are unrelated.
constexpr std::uint64_t kChainDomain = 0x636861696e000001;  // "chain"
constexpr std::uint64_t kEvalDomain = 0x6576616c00000002;   // "eval"
constexpr std::uint64_t kTrainDomain = 0x747261696e000003;  // "train"

using optim::splitmix64;

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t domain, std::uint64_t extra) {
  return splitmix64(splitmix64(seed ^ domain) ^ extra);
}

// xoshiro256** (Blackman & Vigna): small state that fits a checkpoint, and integer-only, so a
// stream is the same on every machine.
struct Rng {
  std::array<std::uint64_t, 4> s{};

  static Rng seeded(std::uint64_t seed) {
    Rng r;
    for (auto& w : r.s) {
      seed += optim::kSplitmixGamma;
      w = splitmix64(seed);
    }
    return r;
  }
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t next() {
    const std::uint64_t out = rotl(s[1] * 5, 7) * 9;
    const std::uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
  }
  // Uniform in [0, n). The modulo bias is below n / 2^64, far under anything measurable here.
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

double entropy_of(std::span<const double> p) {
  double h = 0;
  for (double x : p)
    if (x > 0) h -= x * std::log(x);
  return h;
}

struct Chain {
  std::array<std::array<std::uint8_t, kChoices>, kContexts> next{};
  std::array<std::array<std::uint16_t, kChoices>, kContexts> cum{};  // cumulative weights
  std::vector<double> stationary;  // over contexts: P(X[t-1] = a, X[t] = b)

  static Chain generate(std::uint64_t seed);

  std::uint8_t step(std::uint32_t& ctx, Rng& rng) const {
    const auto& c = cum[ctx];
    const std::uint64_t r = rng.below(c[kChoices - 1]);
    int j = 0;
    while (r >= c[j]) ++j;
    const std::uint8_t sym = next[ctx][j];
    ctx = ((ctx % kSymbols) * kSymbols) + sym;
    return sym;
  }
  double prob(int ctx, int j) const {
    const double prev = j == 0 ? 0.0 : cum[ctx][j - 1];
    return (cum[ctx][j] - prev) / cum[ctx][kChoices - 1];
  }

  // One step of the lazy chain (I + P) / 2 on a distribution over contexts. The lazy chain has
  // the same stationary distribution and cannot oscillate, so power iteration always settles.
  void lazy_step(const std::vector<double>& in, std::vector<double>& out) const {
    for (int s = 0; s < kContexts; ++s) out[s] = 0.5 * in[s];
    for (int s = 0; s < kContexts; ++s) {
      if (in[s] == 0) continue;
      const int base = (s % kSymbols) * kSymbols;
      for (int j = 0; j < kChoices; ++j) out[base + next[s][j]] += 0.5 * in[s] * prob(s, j);
    }
  }
  std::vector<double> settle(std::vector<double> p) const {
    std::vector<double> q(p.size());
    for (int it = 0; it < 200'000; ++it) {
      lazy_step(p, q);
      double diff = 0;
      for (int s = 0; s < kContexts; ++s) diff += std::abs(q[s] - p[s]);
      p.swap(q);
      if (diff < 1e-15) break;
    }
    return p;
  }
};

Chain Chain::generate(std::uint64_t seed) {
  // A random chain may (rarely) split into several closed classes; then the stationary
  // distribution is not unique and the entropy rate of one stream would not be the computed
  // mixture. Such a chain is detected and the next one is drawn.
  for (std::uint64_t attempt = 0;; ++attempt) {
    Rng rng = Rng::seeded(derive_seed(seed, kChainDomain, attempt));
    Chain c;
    std::array<std::array<std::uint8_t, kSuccessors>, kSymbols> succ{};
    for (auto& s : succ) {
      std::array<std::uint8_t, kSymbols> all{};
      for (int i = 0; i < kSymbols; ++i) all[i] = static_cast<std::uint8_t>(i);
      for (int i = 0; i < kSuccessors; ++i) std::swap(all[i], all[i + rng.below(kSymbols - i)]);
      std::copy_n(all.begin(), kSuccessors, s.begin());
    }
    for (int ctx = 0; ctx < kContexts; ++ctx) {
      auto cand = succ[ctx % kSymbols];
      std::uint16_t total = 0;
      for (int j = 0; j < kChoices; ++j) {
        std::swap(cand[j], cand[j + rng.below(kSuccessors - j)]);
        c.next[ctx][j] = cand[j];
        // Squared weights 1..256 give contexts from nearly certain to nearly uniform.
        const auto w = static_cast<std::uint16_t>(1 + rng.below(16));
        total = static_cast<std::uint16_t>(total + w * w);
        c.cum[ctx][j] = total;
      }
    }
    std::vector<double> p(kContexts, 1.0 / kContexts);
    p = c.settle(std::move(p));
    std::vector<double> point(kContexts, 0.0);
    point[std::max_element(p.begin(), p.end()) - p.begin()] = 1.0;
    point = c.settle(std::move(point));
    double diff = 0;
    for (int s = 0; s < kContexts; ++s) diff += std::abs(point[s] - p[s]);
    if (diff < 1e-9 || attempt == 63) {
      c.stationary = std::move(p);
      return c;
    }
  }
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

void CorpusState::encode_to(std::vector<std::uint8_t>& out) const {
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  for (auto w : rng) put(w, 8);
  put(context, 4);
}

std::optional<CorpusState> CorpusState::decode(std::span<const std::uint8_t> in) {
  if (in.size() != kEncodedSize) return std::nullopt;
  auto get = [&](std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{in[at + i]} << (8 * i);
    return v;
  };
  CorpusState s;
  for (int i = 0; i < 4; ++i) s.rng[i] = get(8 * i, 8);
  s.context = static_cast<std::uint32_t>(get(32, 4));
  if (s.rng == std::array<std::uint64_t, 4>{}) return std::nullopt;
  return s;
}

struct Corpus::Impl {
  DataKind kind = DataKind::synthetic;
  std::size_t window = 0;
  std::optional<Chain> chain;      // synthetic
  std::vector<std::uint8_t> data;  // files: training part, then the held-out part
  std::uint64_t train_len = 0;
  std::vector<std::uint8_t> eval;
  std::size_t num_eval = 0;
  Rng rng;
  std::uint32_t context = 0;
  double floor = std::numeric_limits<double>::quiet_NaN();
  double rate = std::numeric_limits<double>::quiet_NaN();
  double unigram = 0;
  std::size_t num_files = 0;

  void init_synthetic(const RunConfig& c, std::uint64_t node_seed);
  void init_files(const RunConfig& c, std::span<const std::string> files, std::uint64_t node_seed);
  void run_chain(std::uint32_t& ctx, Rng& r, std::span<std::uint8_t> out) const {
    for (auto& b : out) b = static_cast<std::uint8_t>(kAlphabet[chain->step(ctx, r)]);
  }
  void start_chain(std::uint32_t& ctx, Rng& r) const {
    ctx = static_cast<std::uint32_t>(r.below(kContexts));
    for (int i = 0; i < kBurnIn; ++i) chain->step(ctx, r);
  }
};

void Corpus::Impl::init_synthetic(const RunConfig& c, std::uint64_t node_seed) {
  chain = Chain::generate(c.seed);
  const auto& pi = chain->stationary;
  rate = 0;
  for (int s = 0; s < kContexts; ++s) {
    std::array<double, kChoices> p{};
    for (int j = 0; j < kChoices; ++j) p[j] = chain->prob(s, j);
    rate += pi[s] * entropy_of(p);
  }
  std::vector<double> last(kSymbols, 0.0);
  for (int s = 0; s < kContexts; ++s) last[s % kSymbols] += pi[s];
  unigram = entropy_of(last);
  // H(X1 | X0) = H(X0, X1) − H(X0): the stationary pair law is `pi`, its marginal `last`.
  const double first = entropy_of(pi) - unigram;
  const double targets = static_cast<double>(c.seq_len);
  floor = (first + (targets - 1) * rate) / targets;

  Rng eval_rng = Rng::seeded(derive_seed(c.seed, kEvalDomain, 0));
  std::uint32_t eval_ctx = 0;
  start_chain(eval_ctx, eval_rng);
  run_chain(eval_ctx, eval_rng, eval);

  rng = Rng::seeded(derive_seed(c.seed, kTrainDomain, node_seed));
  start_chain(context, rng);
}

void Corpus::Impl::init_files(const RunConfig& c, std::span<const std::string> files,
                              std::uint64_t node_seed) {
  namespace fs = std::filesystem;
  if (files.empty()) throw ConfigError("a files run needs data files (--data)");
  std::uint64_t total = 0;
  std::vector<std::uint64_t> sizes;
  for (const auto& f : files) {
    std::error_code ec;
    const auto st = fs::status(f, ec);
    if (ec || !fs::is_regular_file(st))
      throw ConfigError("data file '" + f + "': not a readable regular file" +
                        (ec ? " (" + ec.message() + ")" : ""));
    const std::uint64_t size = fs::file_size(f, ec);
    if (ec) throw ConfigError("data file '" + f + "': " + ec.message());
    if (size == 0) throw ConfigError("data file '" + f + "' is empty");
    if (size < window)
      throw ConfigError(
          format("data file '%s' has %llu bytes, fewer than one window (seq_len + "
                 "1 = %zu)",
                 f.c_str(), static_cast<unsigned long long>(size), window));
    total += size;
    if (total > kMaxCorpusBytes)
      throw ConfigError(
          format("data files hold more than %llu bytes (the corpus is kept in "
                 "memory); use fewer or smaller files",
                 static_cast<unsigned long long>(kMaxCorpusBytes)));
    sizes.push_back(size);
  }
  // Hold out the last 5%, and at least the evaluation windows laid end to end.
  const std::uint64_t need_eval = eval.size();
  const std::uint64_t held = std::max<std::uint64_t>((total + 19) / 20, need_eval);
  if (total < held + window)
    throw ConfigError(format(
        "data files hold %llu bytes: too few to hold out %llu bytes for "
        "evaluation (eval_batches × batch windows of %zu bytes) and still "
        "train on a window",
        static_cast<unsigned long long>(total), static_cast<unsigned long long>(held), window));
  data.resize(total);
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::ifstream in(files[i], std::ios::binary);
    in.read(reinterpret_cast<char*>(data.data() + at), static_cast<std::streamsize>(sizes[i]));
    if (!in || static_cast<std::uint64_t>(in.gcount()) != sizes[i])
      throw ConfigError("data file '" + files[i] + "': read failed (changed while reading?)");
    at += sizes[i];
  }
  num_files = files.size();
  train_len = total - held;

  // Held-out windows spread evenly over the held-out part; since held >= num_eval × window the
  // spacing is at least a window, so they do not overlap.
  const std::uint64_t span = held - window;
  for (std::size_t i = 0; i < num_eval; ++i) {
    const std::uint64_t off = num_eval == 1 ? 0 : span * i / (num_eval - 1);
    std::memcpy(eval.data() + i * window, data.data() + train_len + off, window);
  }

  std::array<double, 256> counts{};
  for (std::uint64_t i = 0; i < train_len; ++i) counts[data[i]] += 1;
  for (auto& x : counts) x /= static_cast<double>(train_len);
  unigram = entropy_of(counts);

  rng = Rng::seeded(derive_seed(c.seed, kTrainDomain, node_seed));
  context = 0;
}

Corpus::Corpus(const RunConfig& config, std::span<const std::string> data_files,
               std::uint64_t node_seed)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.kind = config.data;
  m.window = std::size_t{config.seq_len} + 1;
  m.num_eval = std::size_t{config.eval_batches} * config.batch;
  const double eval_bytes = static_cast<double>(m.num_eval) * static_cast<double>(m.window);
  if (eval_bytes > static_cast<double>(kMaxEvalBytes))
    throw ConfigError(
        format("eval_batches × batch × (seq_len + 1) = %.0f bytes of held-out "
               "windows; at most %llu",
               eval_bytes, static_cast<unsigned long long>(kMaxEvalBytes)));
  m.eval.resize(m.num_eval * m.window);
  if (config.data == DataKind::synthetic) {
    if (!data_files.empty())
      throw ConfigError("data files were given, but the run's data is synthetic");
    m.init_synthetic(config, node_seed);
  } else {
    m.init_files(config, data_files, node_seed);
  }
}

Corpus::~Corpus() = default;
Corpus::Corpus(Corpus&&) noexcept = default;
Corpus& Corpus::operator=(Corpus&&) noexcept = default;

std::size_t Corpus::window_bytes() const {
  return impl_->window;
}

void Corpus::next_windows(std::span<std::uint8_t> out) {
  auto& m = *impl_;
  if (out.size() % m.window != 0)
    throw std::invalid_argument("Corpus::next_windows: not a whole number of windows");
  if (m.kind == DataKind::synthetic) {
    // Consecutive pieces of one long chain, as a reader of a long text would see it.
    m.run_chain(m.context, m.rng, out);
    return;
  }
  const std::uint64_t starts = m.train_len - m.window + 1;
  for (std::size_t at = 0; at < out.size(); at += m.window)
    std::memcpy(out.data() + at, m.data.data() + m.rng.below(starts), m.window);
}

std::span<const std::uint8_t> Corpus::eval_windows() const {
  return impl_->eval;
}
std::size_t Corpus::num_eval_windows() const {
  return impl_->num_eval;
}
double Corpus::loss_floor() const {
  return impl_->floor;
}
double Corpus::entropy_rate() const {
  return impl_->rate;
}
double Corpus::unigram_entropy() const {
  return impl_->unigram;
}
std::uint64_t Corpus::train_bytes() const {
  return impl_->train_len;
}

CorpusState Corpus::state() const {
  return {impl_->rng.s, impl_->context};
}

transport::Result<void> Corpus::restore(const CorpusState& s) {
  auto fail = [](const char* w) -> transport::Result<void> {
    return {transport::errc::malformed, w};
  };
  if (s.rng == std::array<std::uint64_t, 4>{}) return fail("corpus state: all-zero generator");
  if (impl_->kind == DataKind::synthetic && s.context >= kContexts)
    return fail("corpus state: chain context out of range");
  if (impl_->kind == DataKind::files && s.context != 0)
    return fail("corpus state: a chain context for a files corpus");
  impl_->rng.s = s.rng;
  impl_->context = s.context;
  return {};
}

std::string Corpus::describe() const {
  const auto& m = *impl_;
  if (m.kind == DataKind::synthetic)
    return format(
        "synthetic order-2 Markov source over %d symbols (floor %.4f, entropy rate "
        "%.4f, unigram %.4f nats/byte)",
        kSymbols, m.floor, m.rate, m.unigram);
  return format("%zu data file(s), %zu bytes (%llu for training, %llu held out)", m.num_files,
                m.data.size(), static_cast<unsigned long long>(m.train_len),
                static_cast<unsigned long long>(m.data.size() - m.train_len));
}

}  // namespace grove::node
