// The GPT workload through the Workload interface only (no libtorch header here): presets, θ in
// and out, identical initial θ from one seed, learning toward the synthetic source's floor, the
// optimiser state's round trip and its refusal of damaged blobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "node/corpus.hpp"
#include "node/workload.hpp"
#include "transport/crypto.hpp"
#include "transport/error.hpp"

namespace grove::node {
namespace {

WorkloadSpec tiny(std::uint64_t node_seed = 1, std::uint64_t seed = 1) {
  WorkloadSpec s;
  s.config.model = "tiny";
  s.config.seed = seed;
  s.config.seq_len = 64;
  s.config.batch = 8;
  s.config.eval_batches = 4;
  s.config.lr = 3e-3f;
  s.config.warmup = 20;
  s.config.schedule_steps = 400;
  s.node_seed = node_seed;
  s.threads = 2;
  return s;
}

std::vector<float> params_of(const Workload& w) {
  std::vector<float> p(w.num_params());
  w.get_params(p);
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GptWorkload, PresetsHaveTheExpectedParameterCounts) {
  struct Shape {
    const char* name;
    std::size_t layers, d;
  };
  for (const Shape s : {Shape{"tiny", 2, 64}, Shape{"small", 4, 256}, Shape{"base", 6, 384}}) {
    WorkloadSpec spec = tiny();
    spec.config.model = s.name;
    spec.config.seq_len = 128;
    const auto w = make_gpt_workload(spec);
    // Token (tied head) and position embeddings, blocks of 12d² + 13d, the final LayerNorm.
    const std::size_t expect =
        256 * s.d + 128 * s.d + s.layers * (12 * s.d * s.d + 13 * s.d) + 2 * s.d;
    EXPECT_EQ(w->num_params(), expect) << s.name;
    EXPECT_NE(w->describe().find(std::string("gpt-") + s.name), std::string::npos);
  }
}

TEST(GptWorkload, UnknownPresetIsAConfigErrorListingThePresets) {
  WorkloadSpec spec = tiny();
  spec.config.model = "huge";
  try {
    make_gpt_workload(spec);
    FAIL() << "accepted an unknown preset";
  } catch (const transport::ConfigError& e) {
    const std::string what = e.what();
    for (const char* p : {"huge", "tiny", "small", "base"})
      EXPECT_NE(what.find(p), std::string::npos) << what;
  }
}

TEST(GptWorkload, ImpossibleMemoryIsAConfigError) {
  WorkloadSpec spec = tiny();
  spec.config.model = "base";
  spec.config.batch = 4096;
  spec.config.seq_len = 8192;
  spec.config.eval_batches = 1;
  EXPECT_THROW(make_gpt_workload(spec), transport::ConfigError);
}

TEST(GptWorkload, InitialParamsDependOnTheRunSeedOnly) {
  const auto a = make_gpt_workload(tiny(1, 5)), b = make_gpt_workload(tiny(2, 5));
  const auto c = make_gpt_workload(tiny(1, 6));
  const auto pa = params_of(*a);
  EXPECT_TRUE(same_bits(pa, params_of(*b)));   // another node of the same run
  EXPECT_FALSE(same_bits(pa, params_of(*c)));  // another run
  double sum = 0;
  for (float x : pa) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
  }
  EXPECT_LT(std::abs(sum / pa.size()), 0.05);  // mostly N(0, 0.02), some LayerNorm gains of 1
}

TEST(GptWorkload, GetSetRoundTrip) {
  const auto w = make_gpt_workload(tiny());
  auto p = params_of(*w);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i % 97) * 0.01f - 0.3f;
  w->set_params(p);
  EXPECT_TRUE(same_bits(params_of(*w), p));
  std::vector<float> wrong(p.size() - 1);
  EXPECT_THROW(w->set_params(wrong), std::invalid_argument);
  EXPECT_THROW(w->get_params(wrong), std::invalid_argument);
  EXPECT_TRUE(same_bits(params_of(*w), p));
}

// DeMo's view of the model (outer demo): the tensors' shapes cover θ in its order, and a gradient
// is the step's without the optimiser: θ stays, the same batch's step (a second workload at the
// same data position) moves θ against it, and a gradient step lowers that batch's loss.
TEST(GptWorkload, AGradientIsTheStepsWithoutTheOptimiser) {
  const auto w = make_gpt_workload(tiny()), twin = make_gpt_workload(tiny());
  std::size_t total = 0;
  for (const auto& shape : w->shapes()) {
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    total += n;
  }
  EXPECT_EQ(total, w->num_params());
  const auto before = params_of(*w);
  std::vector<float> g(w->num_params());
  StepResult r;
  ASSERT_TRUE(w->gradient(0, g, r));
  EXPECT_TRUE(same_bits(params_of(*w), before));  // no step taken
  EXPECT_TRUE(std::isfinite(r.loss));
  double sq = 0;
  for (float v : g) sq += static_cast<double>(v) * v;
  EXPECT_GT(sq, 0.0);
  EXPECT_LE(std::sqrt(sq), 1.0 + 1e-3);  // clipped at the run's 1.0
  // AdamW's first step moves each value against the sign of its (clipped) gradient.
  twin->train_step(0);
  const auto after = params_of(*twin);
  std::size_t against = 0, moved = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (g[i] == 0.0f || after[i] == before[i]) continue;
    ++moved;
    against += (after[i] - before[i]) * g[i] < 0;
  }
  ASSERT_GT(moved, g.size() / 2);
  EXPECT_GT(against, moved * 9 / 10);
}

// A tiny model on the synthetic source: from ~ln 256 (uniform over bytes) to well below the
// unigram entropy (what context-free prediction reaches), never below the floor.
TEST(GptWorkload, TinyModelLearnsTowardTheFloor) {
  WorkloadSpec spec = tiny();
  spec.config.seq_len = 64;
  spec.config.batch = 16;
  const auto w = make_gpt_workload(spec);
  const double floor = w->loss_floor();
  ASSERT_TRUE(std::isfinite(floor));
  const Corpus corpus(spec.config, {}, spec.node_seed);
  EXPECT_EQ(corpus.loss_floor(), floor);
  const double unigram = corpus.unigram_entropy();
  const double before = w->evaluate();
  EXPECT_NEAR(before, std::log(256.0), 0.2);
  double last_train = 0;
  for (std::uint64_t step = 0; step < 300; ++step) {
    const auto r = w->train_step(step);
    ASSERT_TRUE(std::isfinite(r.loss));
    EXPECT_EQ(r.tokens, 16u * 64);
    last_train = r.loss;
  }
  const double after = w->evaluate();
  EXPECT_EQ(w->evaluate(), after);  // evaluation is deterministic and changes nothing
  std::printf(
      "tiny, 300 steps of 16 x 64: eval %.4f -> %.4f (train %.4f), floor %.4f, unigram "
      "%.4f\n",
      before, after, last_train, floor, unigram);
  // Two nats below context-free prediction: the model uses the context.
  EXPECT_LT(after, unigram - 2.0);
  EXPECT_GT(after, floor - 0.05);  // the held-out sample is finite: a little below is possible
}

TEST(GptWorkload, SetParamsKeepsTheOptimiserState) {
  const auto a = make_gpt_workload(tiny()), b = make_gpt_workload(tiny());
  for (std::uint64_t s = 0; s < 30; ++s) {
    a->train_step(s);
    b->train_step(s);
  }
  b->set_params(params_of(*a));  // same values: only a reset of the moments could change b
  EXPECT_EQ(a->train_step(30).loss, b->train_step(30).loss);
  EXPECT_TRUE(same_bits(params_of(*a), params_of(*b)));
}

TEST(GptWorkload, SaveLoadContinuesIdentically) {
  const auto a = make_gpt_workload(tiny(3));
  for (std::uint64_t s = 0; s < 25; ++s) a->train_step(s);
  const auto blob = a->save();
  const auto theta = params_of(*a);

  const auto b = make_gpt_workload(tiny(4));  // another node: other data position, fresh moments
  b->train_step(0);
  b->set_params(theta);
  if (auto r = b->load(blob); !r) FAIL() << r.why();
  EXPECT_EQ(b->save(), blob);
  for (std::uint64_t s = 25; s < 28; ++s) EXPECT_EQ(a->train_step(s).loss, b->train_step(s).loss);
  EXPECT_TRUE(same_bits(params_of(*a), params_of(*b)));
  EXPECT_EQ(a->evaluate(), b->evaluate());
}

TEST(GptWorkload, LoadRefusesDamagedOrForeignBlobsAndChangesNothing) {
  const auto a = make_gpt_workload(tiny());
  for (std::uint64_t s = 0; s < 5; ++s) a->train_step(s);
  const auto blob = a->save();
  const auto b = make_gpt_workload(tiny());
  for (std::uint64_t s = 0; s < 3; ++s) b->train_step(s);
  const auto before = b->save();

  for (std::size_t len :
       {std::size_t{0}, std::size_t{7}, std::size_t{40}, blob.size() / 2, blob.size() - 1}) {
    const auto r = b->load(std::span(blob).first(len));
    EXPECT_FALSE(r) << len;
    EXPECT_FALSE(r.why().empty());
  }
  auto longer = blob;
  longer.push_back(0);
  EXPECT_FALSE(b->load(longer));

  // Any changed byte fails the checksum (tried at the header, a size, the moments, the corpus).
  for (std::size_t at : {std::size_t{0}, std::size_t{9}, std::size_t{40}, blob.size() / 2,
                         blob.size() - 40, blob.size() - 1}) {
    auto bad = blob;
    bad[at] ^= 0x10;
    EXPECT_FALSE(b->load(bad)) << at;
  }

  // With a valid checksum the values are still checked: a NaN moment, a negative second moment.
  // The blob's layout: 32-byte header, one u64 per tensor, then exp_avg and exp_avg_sq.
  const std::size_t tensors = blob[8];
  const std::size_t moments = 32 + 8 * tensors;
  auto rehash = [](std::vector<std::uint8_t> v) {
    const auto h = transport::blake2b_256(std::span(v).first(v.size() - 32));
    std::memcpy(v.data() + v.size() - 32, h.data(), 32);
    return v;
  };
  if (auto r = b->load(rehash(blob)); !r) FAIL() << r.why();  // the layout above is right
  auto with = [&](std::size_t value_index, float x) {
    auto v = blob;
    std::memcpy(v.data() + moments + 4 * value_index, &x, 4);
    return rehash(v);
  };
  const auto nan_moment = b->load(with(3, std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(nan_moment);
  EXPECT_NE(nan_moment.why().find("non-finite"), std::string::npos) << nan_moment.why();
  const auto negative = b->load(with(a->num_params() + 3, -1.0f));
  EXPECT_FALSE(negative);
  EXPECT_NE(negative.why().find("negative"), std::string::npos) << negative.why();

  // A blob of another model shape.
  WorkloadSpec other = tiny();
  other.config.seq_len = 32;
  EXPECT_FALSE(b->load(make_gpt_workload(other)->save()));

  // Refusals changed nothing: b goes on from its own state. (b's last accepted load was a's
  // blob; restore its own to compare.)
  if (auto r = b->load(before); !r) FAIL() << r.why();
  EXPECT_EQ(b->save(), before);
}

TEST(GptWorkload, NonFiniteParamsSkipTheUpdate) {
  const auto w = make_gpt_workload(tiny());
  w->train_step(0);
  auto p = params_of(*w);
  p[5] = std::numeric_limits<float>::quiet_NaN();
  w->set_params(p);
  const auto moments_before = w->save();
  EXPECT_FALSE(std::isfinite(w->train_step(1).loss));
  EXPECT_TRUE(same_bits(params_of(*w), p));
  const auto moments_after = w->save();
  // Only the corpus position (and so the checksum) moved; the moments and the step did not.
  const std::size_t tail = 36 + 32;
  EXPECT_TRUE(
      std::equal(moments_before.begin(), moments_before.end() - tail, moments_after.begin()));
}

// The node builds workloads through make_workload; a program linking libtorch registers the gpt
// factory, after which make_workload's checks apply before the gpt workload is built.
TEST(GptWorkload, MakeWorkloadUsesTheRegisteredFactory) {
  set_gpt_factory(&make_gpt_workload);
  WorkloadSpec spec = tiny();
  const auto w = make_workload(spec);
  EXPECT_NE(w->describe().find("gpt-tiny"), std::string::npos);
  spec.config.lr = -1;
  EXPECT_THROW(make_workload(spec), transport::ConfigError);
  set_gpt_factory(nullptr);
}

TEST(GptWorkload, FilesHaveNoFloor) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("grove-gpt-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const auto file = (dir / "text").string();
  {
    std::ofstream f(file, std::ios::binary);
    for (int i = 0; i < 2000; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  WorkloadSpec spec = tiny();
  spec.config.data = DataKind::files;
  spec.data_files = {file};
  const auto w = make_gpt_workload(spec);
  EXPECT_TRUE(std::isnan(w->loss_floor()));
  const double before = w->evaluate();
  for (std::uint64_t s = 0; s < 30; ++s) w->train_step(s);
  EXPECT_LT(w->evaluate(), before);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace grove::node
