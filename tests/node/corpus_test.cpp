// Corpus: seeded streams (per node for training, per run for evaluation), the synthetic source's
// exact entropy against a long sample, files split into training and held-out parts, refusals.
#include "node/corpus.hpp"
#include "tests/node/temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "transport/error.hpp"

namespace grove::node {
namespace {

namespace fs = std::filesystem;
using transport::ConfigError;

RunConfig synthetic(std::uint32_t seq_len = 64, std::uint32_t batch = 4,
                    std::uint32_t eval_batches = 2, std::uint64_t seed = 1) {
  RunConfig c;
  c.seq_len = seq_len;
  c.batch = batch;
  c.eval_batches = eval_batches;
  c.seed = seed;
  return c;
}

std::vector<std::uint8_t> draw(Corpus& c, std::size_t windows) {
  std::vector<std::uint8_t> out(windows * c.window_bytes());
  c.next_windows(out);
  return out;
}

std::vector<std::uint8_t> eval_copy(const Corpus& c) {
  return {c.eval_windows().begin(), c.eval_windows().end()};
}

TEST(Corpus, SameSeedsGiveTheSameStreams) {
  Corpus a(synthetic(), {}, 7), b(synthetic(), {}, 7);
  EXPECT_EQ(draw(a, 10), draw(b, 10));
  EXPECT_EQ(draw(a, 3), draw(b, 3));
  EXPECT_EQ(eval_copy(a), eval_copy(b));
  EXPECT_EQ(a.num_eval_windows(), 8u);
  EXPECT_EQ(a.eval_windows().size(), 8u * 65);
  EXPECT_EQ(a.loss_floor(), b.loss_floor());
}

TEST(Corpus, NodeSeedsChangeTrainingButNotHeldOutWindows) {
  Corpus a(synthetic(), {}, 1), b(synthetic(), {}, 2);
  const auto ta = draw(a, 20), tb = draw(b, 20);
  EXPECT_NE(ta, tb);
  EXPECT_EQ(eval_copy(a), eval_copy(b));
  // The held-out windows are not a piece of either training stream.
  const auto ev = eval_copy(a);
  const std::vector<std::uint8_t> first(ev.begin(), ev.begin() + 65);
  EXPECT_EQ(std::search(ta.begin(), ta.end(), first.begin(), first.end()), ta.end());
  EXPECT_EQ(std::search(tb.begin(), tb.end(), first.begin(), first.end()), tb.end());
}

TEST(Corpus, RunSeedChangesTheSource) {
  Corpus a(synthetic(64, 4, 2, 1), {}, 1), b(synthetic(64, 4, 2, 2), {}, 1);
  EXPECT_NE(eval_copy(a), eval_copy(b));
  EXPECT_NE(draw(a, 5), draw(b, 5));
  EXPECT_NE(a.entropy_rate(), b.entropy_rate());
}

TEST(Corpus, SyntheticBytesArePrintable) {
  Corpus a(synthetic(), {}, 3);
  std::vector<bool> seen(256, false);
  for (auto b : draw(a, 200)) seen[b] = true;
  int distinct = 0;
  for (int v = 0; v < 256; ++v) {
    if (!seen[v]) continue;
    ++distinct;
    EXPECT_TRUE(std::isalnum(v) || v == ' ' || v == '.') << v;
  }
  EXPECT_GT(distinct, 40);
  EXPECT_LE(distinct, 64);
}

// Plug-in estimates of H(X) , H(X[t] | X[t-1]) and H(X[t] | X[t-2] X[t-1]) from one long run of
// the chain, against the exact values the corpus computed from the chain's stationary law.
TEST(Corpus, ExactEntropiesMatchALongSample) {
  const std::uint32_t seq_len = 1023;
  Corpus c(synthetic(seq_len, 4, 1, 11), {}, 5);
  // Training windows are consecutive pieces of one chain, so their concatenation is one run.
  const auto bytes = draw(c, 4096);
  std::array<int, 256> sym{};
  sym.fill(-1);
  int n_sym = 0;
  std::vector<int> x(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (sym[bytes[i]] < 0) sym[bytes[i]] = n_sym++;
    x[i] = sym[bytes[i]];
  }
  ASSERT_LE(n_sym, 64);
  std::vector<double> n1(64), n2(64 * 64), n3(64 * 64 * 64);
  for (std::size_t i = 2; i < x.size(); ++i) {
    n1[x[i]] += 1;
    n2[x[i - 1] * 64 + x[i]] += 1;
    n3[(x[i - 2] * 64 + x[i - 1]) * 64 + x[i]] += 1;
  }
  const double n = static_cast<double>(x.size() - 2);
  auto h = [&](const std::vector<double>& v) {
    double s = 0;
    for (double k : v)
      if (k > 0) s -= k / n * std::log(k / n);
    return s;
  };
  // Marginals of the pair and triple counts over their last coordinate(s) equal the counts
  // with one symbol less (up to the two dropped edges), so H(Y | X) = H(X, Y) − H(X).
  std::vector<double> n2_head(64 * 64);
  for (std::size_t i = 0; i < n3.size(); ++i) n2_head[i / 64] += n3[i];
  std::vector<double> n1_head(64);
  for (std::size_t i = 0; i < n2.size(); ++i) n1_head[i / 64] += n2[i];
  const double emp_unigram = h(n1);
  const double emp_first = h(n2) - h(n1_head);
  const double emp_rate = h(n3) - h(n2_head);

  const double first = c.loss_floor() * seq_len - (seq_len - 1) * c.entropy_rate();
  EXPECT_NEAR(emp_unigram, c.unigram_entropy(), 0.01);
  EXPECT_NEAR(emp_first, first, 0.01);
  EXPECT_NEAR(emp_rate, c.entropy_rate(), 0.01);

  // The floor is clearly above zero and far below what context-free prediction reaches: the
  // gap is what a model can learn.
  EXPECT_GT(c.entropy_rate(), 0.3);
  EXPECT_GT(c.unigram_entropy() - c.loss_floor(), 2.0);
  EXPECT_GT(first - c.entropy_rate(), 0.5);  // the second symbol of context matters
  EXPECT_GE(c.loss_floor(), c.entropy_rate());
  EXPECT_LE(c.loss_floor(), c.entropy_rate() + std::log(64.0) / seq_len);
}

TEST(Corpus, StateRestoresTheStream) {
  Corpus a(synthetic(), {}, 9);
  draw(a, 3);
  const auto s = a.state();
  const auto next = draw(a, 5);
  std::vector<std::uint8_t> enc;
  s.encode_to(enc);
  ASSERT_EQ(enc.size(), CorpusState::kEncodedSize);
  const auto back = CorpusState::decode(enc);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, s);

  Corpus b(synthetic(), {}, 1234);  // another node's stream, moved to a's position
  if (auto r = b.restore(*back); !r) FAIL() << r.why();
  EXPECT_EQ(draw(b, 5), next);

  EXPECT_FALSE(CorpusState::decode(std::span(enc).first(enc.size() - 1)));
  EXPECT_FALSE(CorpusState::decode(std::vector<std::uint8_t>(CorpusState::kEncodedSize, 0)));
  CorpusState bad = s;
  bad.context = 64 * 64;
  const auto refused = b.restore(bad);
  EXPECT_FALSE(refused);
  EXPECT_NE(refused.why().find("context"), std::string::npos);
  EXPECT_EQ(draw(b, 1), draw(a, 1));  // a refused state left the stream alone
}

TEST(Corpus, PartialWindowIsACallerBug) {
  Corpus a(synthetic(), {}, 1);
  std::vector<std::uint8_t> out(a.window_bytes() + 1);
  EXPECT_THROW(a.next_windows(out), std::invalid_argument);
}

TEST(Corpus, TooManyHeldOutBytesAreRefused) {
  EXPECT_THROW(Corpus(synthetic(8192, 4096, 100), {}, 1), ConfigError);
}

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("grove-corpus-") {}
  std::string write(const std::string& name, const std::vector<std::uint8_t>& bytes) const {
    const auto p = path / name;
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
};

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(g());
  return v;
}

RunConfig files_config() {
  RunConfig c = synthetic(31, 4, 2);
  c.data = DataKind::files;
  return c;
}

TEST(Corpus, FileWindowsComeOnlyFromTheTrainingPart) {
  TempDir dir;
  // Random bytes: any 32-byte window occurs once, so its position can be found.
  const auto a = random_bytes(30'000, 1), b = random_bytes(10'000, 2);
  const std::vector<std::string> files{dir.write("a", a), dir.write("b", b)};
  std::vector<std::uint8_t> all = a;
  all.insert(all.end(), b.begin(), b.end());

  Corpus c(files_config(), files, 77);
  EXPECT_TRUE(std::isnan(c.loss_floor()));
  const std::uint64_t train = c.train_bytes();
  EXPECT_LE(train, all.size() - all.size() / 20);  // at least 5% held out
  EXPECT_GT(train, all.size() - all.size() / 10);
  EXPECT_GT(c.unigram_entropy(), 5.4);  // random bytes: close to ln 256

  auto position = [&](std::span<const std::uint8_t> w) {
    const auto it = std::search(all.begin(), all.end(), w.begin(), w.end());
    EXPECT_NE(it, all.end());
    return static_cast<std::uint64_t>(it - all.begin());
  };
  const auto windows = draw(c, 2000);
  std::uint64_t lowest = all.size(), highest = 0;
  for (std::size_t i = 0; i < windows.size(); i += 32) {
    const auto p = position(std::span(windows).subspan(i, 32));
    lowest = std::min(lowest, p);
    highest = std::max(highest, p);
  }
  EXPECT_LE(highest + 32, train);
  EXPECT_LT(lowest, 1000u);  // spread over the whole training part
  EXPECT_GT(highest + 32, train - 1000);

  ASSERT_EQ(c.num_eval_windows(), 8u);
  for (std::size_t i = 0; i < 8; ++i)
    EXPECT_GE(position(c.eval_windows().subspan(i * 32, 32)), train);

  // The same files and seeds give the same windows; the held-out windows ignore node_seed.
  Corpus same(files_config(), files, 77), other(files_config(), files, 78);
  EXPECT_EQ(draw(same, 2000), windows);
  EXPECT_NE(draw(other, 50), std::vector<std::uint8_t>(windows.begin(), windows.begin() + 1600));
  EXPECT_EQ(eval_copy(other), eval_copy(c));

  CorpusState s = c.state();
  s.context = 5;
  EXPECT_FALSE(c.restore(s));
}

TEST(Corpus, BadFilesAreRefused) {
  TempDir dir;
  const auto good = dir.write("good", random_bytes(20'000, 3));
  const RunConfig fc = files_config();
  auto refused = [&](const std::vector<std::string>& files, const RunConfig& cfg,
                     const std::string& expect) {
    try {
      Corpus c(cfg, files, 1);
      ADD_FAILURE() << "accepted; expected: " << expect;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  refused({}, fc, "needs data files");
  refused({good}, synthetic(), "synthetic");
  refused({(dir.path / "missing").string()}, fc, "not a readable regular file");
  refused({dir.path.string()}, fc, "not a readable regular file");
  refused({good, dir.write("empty", {})}, fc, "is empty");
  refused({dir.write("short", random_bytes(31, 4))}, fc, "fewer than one window");
  // Enough bytes for windows but not for the held-out windows and training as well.
  refused({dir.write("small", random_bytes(280, 5))}, fc, "too few");

  // Sizes are checked before anything is read: a sparse file just over the limit costs nothing.
  const auto huge = dir.path / "huge";
  { std::ofstream(huge).put('x'); }
  fs::resize_file(huge, kMaxCorpusBytes + 1);
  refused({huge.string()}, fc, "more than");
  refused({good, huge.string()}, fc, "more than");

  EXPECT_NO_THROW(Corpus(fc, std::vector<std::string>{good}, 1));
}

}  // namespace
}  // namespace grove::node
