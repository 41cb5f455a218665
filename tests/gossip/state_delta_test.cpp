// State deltas (gossip/state_delta.hpp): a DiLoCo round's mean Δ kept in its codec replays to the
// very bits of the group's step; a delta from other weights, of another round or size, with a
// changed byte, or not a delta at all is refused with a reason.
#include "gossip/state_delta.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gossip/step_work.hpp"
#include "optim/codecs.hpp"

namespace grove::gossip {
namespace {

constexpr std::size_t kN = 3000;

optim::OuterState state_of(unsigned seed, std::uint64_t round) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> phi(kN), m(kN);
  for (auto& v : phi) v = g(rng);
  for (auto& v : m) v = 0.1f * g(rng);
  optim::OuterState s;
  s.round = round;
  s.phi = std::move(phi);
  s.momentum = std::move(m);
  return s;
}

// A mean Δ as an fp16 all-reduce leaves it: every value exact in fp16.
std::vector<float> mean_delta(unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.01f);
  std::vector<float> d(kN);
  for (auto& v : d) v = optim::half_to_float(optim::float_to_half(g(rng)));
  return d;
}

std::vector<std::uint8_t> bytes_of(const StateBlob& b) {
  std::vector<std::uint8_t> v(b.size());
  EXPECT_TRUE(b.read(0, v));
  return v;
}

struct Kept {
  std::shared_ptr<const StateBlob> blob;
  Digest from, to;
  optim::OuterState after;  // the group's state after the step
};

// What a member does: the step on its state, the delta written a piece at a time.
Kept keep_step(const optim::OuterState& before, const std::vector<float>& d,
               const optim::DiLoCoConfig& cfg, WireCodec codec = WireCodec::fp16) {
  Kept k;
  k.after = before;
  k.from = weights_hash(before.phi);
  optim::diloco_step(k.after.phi, k.after.momentum, d, cfg);
  ++k.after.round;
  k.to = weights_hash(k.after.phi);
  auto store = memory_blob_store();
  auto w = DeltaWriter::create(*store, codec, kN);
  EXPECT_TRUE(w);
  EXPECT_TRUE(w->write(0, std::span(d).first(1000)));
  EXPECT_TRUE(w->write(1000, std::span(d).subspan(1000)));
  auto b = w->seal(k.after.round, k.from, k.to);
  EXPECT_TRUE(b);
  k.blob = *b;
  return k;
}

TEST(StateDelta, ReplaysTwoRoundsToTheGroupsVeryBits) {
  const optim::DiLoCoConfig cfg{0.7f, 0.9f};
  const auto s0 = state_of(1, 7);
  const auto k1 = keep_step(s0, mean_delta(2), cfg);
  const auto k2 = keep_step(k1.after, mean_delta(3), cfg);
  EXPECT_EQ(k1.blob->size(), delta_size(WireCodec::fp16, kN));
  EXPECT_EQ(k1.blob->size(), kDeltaHeaderBytes + 2 * kN);  // a quarter of φ ‖ m

  auto s = s0;
  Digest h = weights_hash(s.phi);
  ASSERT_TRUE(replay_delta(*k1.blob, s, h, cfg));
  ASSERT_TRUE(replay_delta(*k2.blob, s, h, cfg));
  EXPECT_EQ(s.round, 9u);
  EXPECT_EQ(h, k2.to);
  EXPECT_EQ(s.phi.to_vector(), k2.after.phi.to_vector());
  EXPECT_EQ(s.momentum.to_vector(), k2.after.momentum.to_vector());
}

// The bound a DiLoCo group puts on its mean Δ (StepWork::max_mean_norm, the mean of the norms
// its members declared): a mean within it is stepped and kept as a delta; one above it (a member
// sent more than it declared) is not applied at all — φ and momentum stay, the round advances,
// no delta is kept — and the step says why.
// A DiLoCo step of s0 with mean Δ d, its norm bounded just above ‖d‖ (taken) or at half of it
// (refused: someone sent more than it declared).
struct RingStep {
  optim::DiLoCoConfig cfg{0.7f, 0.9f};
  optim::OuterState s0 = state_of(4, 7);
  std::vector<float> d = mean_delta(5);
  double norm = optim::l2_norm(d.data(), d.size());
  std::vector<double> bounds() const { return {1.001 * norm, 0.5 * norm}; }
  StepWork at(double bound) const {
    StepWork w;
    w.kind = StepWork::Kind::diloco_ring;
    w.state = s0;
    w.diloco = cfg;
    w.ring = d;
    w.max_mean_norm = bound;
    return w;
  }
};

TEST(StateDelta, AMeanAboveTheDeclaredNormsIsNotStepped) {
  const RingStep c;
  const auto& [cfg, s0, d, norm] = c;
  for (const double bound : c.bounds()) {
    SCOPED_TRACE(bound);
    StepWork w = c.at(bound);
    w.state.round = 8;  // (the engine's ++round before the job)
    w.delta_store = memory_blob_store();
    w.delta_from = weights_hash(s0.phi);
    w.run();
    EXPECT_EQ(w.state.round, 8u);
    if (bound > norm) {
      EXPECT_TRUE(w.dropped.empty());
      const auto k = keep_step(s0, d, cfg);
      EXPECT_EQ(w.state.phi.to_vector(), k.after.phi.to_vector());
      EXPECT_EQ(w.hash, k.to);
      EXPECT_TRUE(w.delta);
    } else {
      EXPECT_NE(w.dropped.find("a member sent more than it declared"), std::string::npos)
          << w.dropped;
      EXPECT_EQ(w.state.phi.to_vector(), s0.phi.to_vector());
      EXPECT_EQ(w.state.momentum.to_vector(), s0.momentum.to_vector());
      EXPECT_EQ(w.hash, weights_hash(s0.phi));
      EXPECT_FALSE(w.delta);
    }
  }
}

// After an E3M0 all-reduce the error buffer is already the member's residual (part of it other
// members' values): a step taken scales it by its bound; a step refused (someone sent more than
// it declared) empties it, so that nothing of the liar's message stays behind to be sent again.
TEST(StateDelta, AnE3M0ResidualIsScaledWithItsStepAndEmptiedWithoutIt) {
  const RingStep c;
  for (const double bound : c.bounds()) {
    SCOPED_TRACE(bound);
    StepWork w = c.at(bound);
    const std::size_t n = c.s0.phi.size();
    w.state.error = optim::Floats(n, 0.25f);
    w.error_is_residual = true;
    w.error_scale = 0.5f;
    w.run();
    EXPECT_EQ(w.state.error.to_vector(), std::vector<float>(n, bound > c.norm ? 0.125f : 0.0f));
  }
}

// ‖φ − θ‖ without writing Δ, a fragment at a time and over threads, is the plain sum's.
TEST(StateDelta, PseudoGradientNormIsThePlainOnes) {
  const auto a = state_of(8, 0).phi.to_vector(), b = state_of(9, 0).phi.to_vector();
  double plain = 0;
  for (std::size_t i = 0; i < a.size(); ++i) plain += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  for (const unsigned threads : {1u, 3u})
    EXPECT_NEAR(pseudo_gradient_norm(optim::Floats(a), optim::Floats(b), threads), std::sqrt(plain),
                1e-9 * std::sqrt(plain));
  EXPECT_DOUBLE_EQ(norm_of(optim::Floats(a), 1000, 10), optim::l2_norm(a.data() + 1000, 10));
}

TEST(StateDelta, KeptInFp32ForBlockCodecs) {
  EXPECT_EQ(delta_codec(WireCodec::e3m0), WireCodec::fp32);
  EXPECT_EQ(delta_codec(WireCodec::bf16), WireCodec::bf16);
  const optim::DiLoCoConfig cfg;
  std::vector<float> d(kN, 0.1234567f);  // not exact in fp16: fine in fp32
  const auto k = keep_step(state_of(4, 0), d, cfg, WireCodec::e3m0);
  EXPECT_EQ(k.blob->size(), kDeltaHeaderBytes + 4 * kN);
  auto s = state_of(4, 0);
  Digest h = weights_hash(s.phi);
  ASSERT_TRUE(replay_delta(*k.blob, s, h, cfg));
  EXPECT_EQ(h, k.to);
}

TEST(StateDelta, AValueNotExactInTheCodecIsNotKept) {
  auto store = memory_blob_store();
  auto w = DeltaWriter::create(*store, WireCodec::fp16, 4);
  ASSERT_TRUE(w);
  const std::vector<float> d{0.5f, 0.1234567f, 0.0f, 1.0f};
  const auto r = w->write(0, d);
  EXPECT_FALSE(r);
  EXPECT_NE(r.text().find("not exact"), std::string::npos) << r.text();
  EXPECT_FALSE(w->write(2, std::vector<float>(3, 0.5f)));  // past the end
}

TEST(StateDelta, RefusesADeltaThatDoesNotFitTheState) {
  const optim::DiLoCoConfig cfg;
  const auto s0 = state_of(5, 3);
  const auto k = keep_step(s0, mean_delta(6), cfg);
  const auto unchanged = s0.phi.to_vector();
  {  // other slow weights
    auto s = state_of(9, 3);
    Digest h = weights_hash(s.phi);
    const auto r = replay_delta(*k.blob, s, h, cfg);
    EXPECT_FALSE(r);
    EXPECT_NE(r.text().find("other slow weights"), std::string::npos) << r.text();
    EXPECT_EQ(s.round, 3u);
  }
  {  // another round
    auto s = s0;
    s.round = 4;
    Digest h = weights_hash(s.phi);
    const auto r = replay_delta(*k.blob, s, h, cfg);
    EXPECT_FALSE(r);
    EXPECT_NE(r.text().find("round"), std::string::npos) << r.text();
    EXPECT_EQ(s.phi.to_vector(), unchanged);
  }
  {  // another size
    optim::OuterState s;
    s.round = 3;
    s.phi = std::vector<float>(kN - 1, 0.0f);
    s.momentum = std::vector<float>(kN - 1, 0.0f);
    Digest h = weights_hash(s.phi);
    EXPECT_FALSE(replay_delta(*k.blob, s, h, cfg));
  }
}

TEST(StateDelta, AChangedValueFailsTheHashWithTheStateUnchanged) {
  const optim::DiLoCoConfig cfg;
  const auto s0 = state_of(7, 0);
  const auto k = keep_step(s0, mean_delta(8), cfg);
  auto bytes = bytes_of(*k.blob);
  bytes[kDeltaHeaderBytes + 2 * 1500] ^= 0x01;  // one value's lowest mantissa bit
  auto s = s0;
  Digest h = weights_hash(s.phi);
  const auto r = replay_delta(*memory_blob(bytes), s, h, cfg);
  EXPECT_FALSE(r);
  EXPECT_NE(r.text().find("not the delta's"), std::string::npos) << r.text();
  EXPECT_EQ(s.phi.to_vector(), s0.phi.to_vector());
  EXPECT_EQ(s.momentum.to_vector(), s0.momentum.to_vector());
  EXPECT_EQ(s.round, 0u);
  EXPECT_EQ(h, weights_hash(s0.phi));
}

// Finite values that step φ past the float range (the fuzz target's find, kept as a seed in
// tests/fuzz/corpus/gossip): refused before φ or the momentum hold an Inf.
TEST(StateDelta, ADeltaThatOverflowsTheStepIsRefusedWithTheStateUnchanged) {
  optim::DiLoCoConfig cfg;
  auto s0 = state_of(12, 2);
  s0.phi.data()[5] = 3.0e38f;
  auto store = memory_blob_store();
  auto w = DeltaWriter::create(*store, WireCodec::fp32, kN);
  ASSERT_TRUE(w);
  std::vector<float> d(kN, 0.0f);
  d[5] = -3.0e38f;  // φ − lr·(Δ + μ·b) leaves the float range
  ASSERT_TRUE(w->write(0, d));
  const Digest from = weights_hash(s0.phi);
  auto blob = w->seal(3, from, Digest{1});
  ASSERT_TRUE(blob);
  auto s = s0;
  Digest h = from;
  const auto r = replay_delta(**blob, s, h, cfg);
  EXPECT_FALSE(r);
  EXPECT_NE(r.text().find("float range"), std::string::npos) << r.text();
  EXPECT_TRUE(optim::all_finite(s.phi.to_vector()) && optim::all_finite(s.momentum.to_vector()));
  EXPECT_EQ(s.phi.to_vector(), s0.phi.to_vector());
  EXPECT_EQ(h, from);
}

// A blob that reads well until it is read `ok_reads` times (a file that goes away).
class FailingBlob : public StateBlob {
 public:
  FailingBlob(std::shared_ptr<const StateBlob> b, int ok_reads)
      : b_(std::move(b)), left_(ok_reads) {}
  std::uint64_t size() const override { return b_->size(); }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    if (left_-- <= 0) return {transport::errc::source_failed, "the file went away"};
    return b_->read(offset, out);
  }

 private:
  std::shared_ptr<const StateBlob> b_;
  mutable int left_;
};

TEST(StateDelta, OnlyAReadFailingWhileApplyingLeavesTheStateChangedAndSaysSo) {
  // Two fragments: the header, both fragments checked, the first applied, then the read fails.
  const std::size_t n = optim::kFragment + 100;
  optim::OuterState s0;
  s0.round = 0;
  s0.phi = std::vector<float>(n, 1.0f);
  s0.momentum = std::vector<float>(n, 0.0f);
  const optim::DiLoCoConfig cfg;
  auto after = s0;
  const std::vector<float> d(n, 0.25f);
  optim::diloco_step(after.phi, after.momentum, d, cfg);
  auto store = memory_blob_store();
  auto w = DeltaWriter::create(*store, WireCodec::fp16, n);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->write(0, d));
  auto blob = w->seal(1, weights_hash(s0.phi), weights_hash(after.phi));
  ASSERT_TRUE(blob);
  {  // the read fails in the check: refused, unchanged
    auto s = s0;
    Digest h = weights_hash(s.phi);
    const auto r = replay_delta(FailingBlob(*blob, 2), s, h, cfg);
    EXPECT_FALSE(r);
    EXPECT_EQ(r.error(), transport::make_error_code(transport::errc::rejected));
    EXPECT_EQ(s.phi.to_vector(), s0.phi.to_vector());
  }
  {  // the read fails after the first fragment was applied: changed, and said so
    auto s = s0;
    Digest h = weights_hash(s.phi);
    const auto r = replay_delta(FailingBlob(*blob, 4), s, h, cfg);
    EXPECT_FALSE(r);
    EXPECT_EQ(r.error(), transport::make_error_code(transport::errc::source_failed));
    EXPECT_NE(r.text().find("changed part way"), std::string::npos) << r.text();
    EXPECT_EQ(h, weights_hash(s.phi));
    EXPECT_EQ(s.phi.data()[0], after.phi.data()[0]);
    EXPECT_EQ(s.phi.data()[n - 1], 1.0f);
  }
  {  // and it reads well: the group's state
    auto s = s0;
    Digest h = weights_hash(s.phi);
    ASSERT_TRUE(replay_delta(**blob, s, h, cfg));
    EXPECT_EQ(h, weights_hash(after.phi));
    EXPECT_EQ(s.round, 1u);
  }
}

TEST(StateDelta, RefusesWhatIsNotADelta) {
  const auto k = keep_step(state_of(10, 0), mean_delta(11), {});
  const auto good = bytes_of(*k.blob);
  auto with = [&](std::size_t at, std::uint8_t v) {
    auto b = good;
    b[at] = v;
    return read_delta_header(*memory_blob(b));
  };
  EXPECT_TRUE(read_delta_header(*k.blob));
  EXPECT_FALSE(with(0, 'X'));    // magic
  EXPECT_FALSE(with(8, 2));      // version
  EXPECT_FALSE(with(12, 3));     // codec (e3m0 is never kept)
  EXPECT_FALSE(with(24, 0xff));  // values against the size
  EXPECT_FALSE(read_delta_header(*memory_blob({good.begin(), good.end() - 1})));  // truncated
  EXPECT_FALSE(read_delta_header(*memory_blob({good.begin(), good.begin() + 50})));
  // An Inf in the values is refused before it reaches φ.
  auto inf = good;
  inf[kDeltaHeaderBytes] = 0x00;
  inf[kDeltaHeaderBytes + 1] = 0x7c;  // fp16 +Inf, the first value
  auto s = state_of(10, 0);
  Digest h = weights_hash(s.phi);
  const auto before = s.phi.to_vector();
  EXPECT_FALSE(replay_delta(*memory_blob(inf), s, h, {}));
  EXPECT_EQ(s.phi.to_vector(), before);
}

}  // namespace
}  // namespace grove::gossip
