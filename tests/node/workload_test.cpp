// The workload seam and the mlp workload: the schedule, determinism, learning, and resuming
// from saved optimiser state.
#include "node/workload.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "transport/error.hpp"

namespace grove::node {
namespace {

RunConfig mlp_config() {
  RunConfig c;
  c.workload = WorkloadKind::mlp;
  c.model = "tiny";
  c.seed = 5;
  c.lr = 0.01f;
  c.warmup = 10;
  c.schedule_steps = 1000;
  c.batch = 32;
  c.eval_batches = 4;
  return c;
}

std::unique_ptr<Workload> make(std::uint64_t node_seed, RunConfig c = mlp_config()) {
  WorkloadSpec s;
  s.config = c;
  s.node_seed = node_seed;
  return make_workload(s);
}

std::vector<float> params(const Workload& w) {
  std::vector<float> p(w.num_params());
  w.get_params(p);
  return p;
}

TEST(InnerLr, WarmUpThenCosineToTheFloor) {
  auto c = mlp_config();
  EXPECT_DOUBLE_EQ(inner_lr(c, 0), c.lr * 0.1);  // 1/10 of the way through warm-up
  EXPECT_DOUBLE_EQ(inner_lr(c, 9), c.lr);
  EXPECT_NEAR(inner_lr(c, 10), c.lr, 1e-12);
  EXPECT_NEAR(inner_lr(c, 505), c.lr * (c.lr_min_ratio + (1 - c.lr_min_ratio) * 0.5),
              1e-9);  // half-way through the cosine
  const double floor = static_cast<double>(c.lr) * c.lr_min_ratio;
  EXPECT_NEAR(inner_lr(c, 1000), floor, 1e-12);
  EXPECT_NEAR(inner_lr(c, 5000), floor, 1e-12);
  for (std::uint64_t s = 10; s < 1000; ++s) EXPECT_LE(inner_lr(c, s + 1), inner_lr(c, s) + 1e-15);
}

TEST(MakeWorkload, RefusesWhatItCannotBuild) {
  auto c = mlp_config();
  c.model = "huge";
  EXPECT_THROW(make(1, c), transport::ConfigError);
  c = mlp_config();
  c.data = DataKind::files;
  EXPECT_THROW(make(1, c), transport::ConfigError);  // a files run without --data
  c = mlp_config();
  c.workload = WorkloadKind::gpt;
  set_gpt_factory(nullptr);
  EXPECT_THROW(make(1, c), transport::ConfigError);  // no libtorch linked into this test
}

TEST(MlpWorkload, SameRunSameInitialWeightsDifferentNodesDifferentSamples) {
  auto a = make(1), b = make(2);
  EXPECT_EQ(params(*a), params(*b));
  EXPECT_EQ(a->evaluate(), b->evaluate());
  const auto la = a->train_step(0).loss, lb = b->train_step(0).loss;
  EXPECT_NE(la, lb);  // each node draws its own batch
  auto c = make(1);
  EXPECT_EQ(c->train_step(0).loss, la);  // ... deterministically
}

TEST(MlpWorkload, LearnsTheTeacherDownToNearTheNoiseFloor) {
  auto c = mlp_config();
  c.schedule_steps = 3000;
  auto w = make(3, c);
  const double before = w->evaluate();
  for (std::uint64_t s = 0; s < 3000; ++s) w->train_step(s);
  const double after = w->evaluate();
  EXPECT_LT(after, before * 0.2) << "before " << before << " after " << after;
  EXPECT_LT(after, 4 * w->loss_floor()) << "floor " << w->loss_floor();
  EXPECT_GT(after, 0.5 * w->loss_floor());  // cannot beat the noise by much
}

TEST(MlpWorkload, SavedStateResumesExactly) {
  auto a = make(4);
  for (std::uint64_t s = 0; s < 20; ++s) a->train_step(s);
  auto b = make(4);
  if (auto r = b->load(a->save()); !r) FAIL() << r.why();
  b->set_params(params(*a));
  EXPECT_EQ(a->train_step(20).loss, b->train_step(20).loss);
  EXPECT_EQ(params(*a), params(*b));
}

TEST(MlpWorkload, LoadRejectsDamagedState) {
  auto a = make(4);
  a->train_step(0);
  auto blob = a->save();
  EXPECT_FALSE(a->load(std::span(blob).first(blob.size() - 1)));
  auto bad = blob;
  const float nan = std::nanf("");
  std::memcpy(bad.data() + 20, &nan, 4);
  const auto r = a->load(bad);
  EXPECT_FALSE(r);
  EXPECT_NE(r.why().find("non-finite"), std::string::npos);
  EXPECT_THROW(a->set_params(std::vector<float>(3)), std::invalid_argument);
}

}  // namespace
}  // namespace grove::node
