// DeMo (optim/demo.hpp): the blocking rule, the DCT, the members' mean per coefficient, the
// checks on a member's message, and whole steps against plain PyTorch
// (tests/optim/demo_reference.py through /usr/bin/python3, Debian's python3-torch).
#include "optim/demo.hpp"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace grove::optim {
namespace {

TEST(Demo, BlockSideIsTheLargestDivisorUpToTheChunk) {
  const std::pair<std::size_t, std::size_t> cases[] = {
      {64, 64},    {768, 64}, {2048, 64}, {50304, 64}, {100, 50}, {96, 48},
      {50257, 29}, {60, 60},  {1, 1},     {67, 1},     {134, 2},  {0, 1}};
  for (auto [s, want] : cases) EXPECT_EQ(demo_chunk(s, 64), want) << s;
  EXPECT_EQ(demo_chunk(100, 7), 5u);
  EXPECT_EQ(demo_chunk(100, 26), 25u);
  EXPECT_EQ(demo_chunk(100, 101), 100u);
}

TEST(Demo, TensorsAreViewedAsRowsByColumns) {
  DemoParams p;
  const std::vector<std::uint64_t> s1{130}, s2{64, 128}, s3{4, 6, 10}, s0{};
  auto b = demo_blocks(s1, p);
  EXPECT_EQ(b.rows, 1u);
  EXPECT_EQ(b.cols, 130u);
  EXPECT_EQ(b.w, 26u);
  EXPECT_EQ(b.k, 26u);  // a block of 26 keeps min(32, 26)
  b = demo_blocks(s2, p);
  EXPECT_EQ(b.h, 64u);
  EXPECT_EQ(b.w, 64u);
  EXPECT_EQ(b.count(), 2u);
  EXPECT_EQ(demo_encoded_size(b), 2u * 32 * 6);
  b = demo_blocks(s3, p);
  EXPECT_EQ(b.rows, 4u);
  EXPECT_EQ(b.cols, 60u);
  b = demo_blocks(s0, p);
  EXPECT_EQ(b.size(), 1u);
  EXPECT_EQ(b.k, 1u);
  EXPECT_STREQ(demo_params_problem(p), "");
  p.chunk = 257;
  EXPECT_STRNE(demo_params_problem(p), "");
  p = {};
  p.decay = 1.0f;
  EXPECT_STRNE(demo_params_problem(p), "");
}

TEST(Demo, TheBasisIsTheOrthonormalDct) {
  Demo d;
  const auto m = d.basis(4);
  // Column 0 of M (row 0 of the reference's forward matrix F = Mᵀ).
  EXPECT_NEAR(m[0], 0.5f, 1e-6);
  EXPECT_NEAR(m[4], 0.6532815f, 1e-6);
  EXPECT_NEAR(m[8], 0.5f, 1e-6);
  EXPECT_NEAR(m[12], 0.2705981f, 1e-6);
  const auto m64 = d.basis(64);
  for (std::size_t a = 0; a < 64; a += 7)
    for (std::size_t c = 0; c < 64; c += 5) {
      double dot = 0;
      for (std::size_t t = 0; t < 64; ++t) dot += double(m64[a * 64 + t]) * m64[c * 64 + t];
      EXPECT_NEAR(dot, a == c ? 1.0 : 0.0, 1e-6);
    }
}

struct Sel {
  std::vector<std::uint16_t> idx;
  std::vector<float> val;
};
std::vector<Sel> decode(const DemoBlocks& b, std::span<const std::uint8_t> msg) {
  std::vector<Sel> out(b.count());
  for (std::size_t blk = 0; blk < b.count(); ++blk) {
    const std::uint8_t* p = msg.data() + blk * b.k * 6;
    for (std::size_t j = 0; j < b.k; ++j) {
      std::uint16_t i;
      float v;
      std::memcpy(&i, p + 2 * j, 2);
      std::memcpy(&v, p + 2 * b.k + 4 * j, 4);
      out[blk].idx.push_back(i);
      out[blk].val.push_back(v);
    }
  }
  return out;
}
std::vector<std::uint8_t> encode(const std::vector<Sel>& sels) {
  std::vector<std::uint8_t> out;
  for (const auto& s : sels) {
    for (auto i : s.idx) out.insert(out.end(), {std::uint8_t(i & 0xff), std::uint8_t(i >> 8)});
    for (float v : s.val) {
      std::uint8_t b[4];
      std::memcpy(b, &v, 4);
      out.insert(out.end(), b, b + 4);
    }
  }
  return out;
}

// The DCT of 0..7 (Psyche's port of DeMo has the same fixture), sent whole: k = 8.
TEST(Demo, CompressSendsTheLargestCoefficientsAndKeepsTheRest) {
  DemoParams p;
  p.topk = 8;
  const std::vector<std::uint64_t> shape{8};
  const auto b = demo_blocks(shape, p);
  Demo d;
  std::vector<float> delta(8, 0.0f), g(8);
  for (int i = 0; i < 8; ++i) g[i] = float(i);
  std::vector<std::uint8_t> msg(demo_encoded_size(b));
  ASSERT_EQ(d.compress(b, delta, g, 1.0f, 0.0f, msg), CodecError::ok);
  const auto s = decode(b, msg);
  const float want[8] = {9.8995f, -6.4423f, 0.0f, -0.67345f, 0.0f, -0.20090f, 0.0f, -0.050702f};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(s[0].idx[i], i);
    EXPECT_NEAR(s[0].val[i], want[i], 2e-4);
  }
  for (float x : delta) EXPECT_NEAR(x, 0.0f, 1e-5);  // everything was sent

  // k = 3: the three largest |C| (0, 1, 3), in index order; δ keeps the rest (its DCT is C with
  // those three zeroed).
  p.topk = 3;
  const auto b3 = demo_blocks(shape, p);
  std::vector<float> d3(8, 0.0f);
  std::vector<std::uint8_t> m3(demo_encoded_size(b3));
  ASSERT_EQ(d.compress(b3, d3, g, 1.0f, 0.0f, m3), CodecError::ok);
  const auto s3 = decode(b3, m3);
  EXPECT_EQ(s3[0].idx, (std::vector<std::uint16_t>{0, 1, 3}));
  const auto m = d.basis(8);
  for (std::size_t f = 0; f < 8; ++f) {
    double c = 0;
    for (std::size_t t = 0; t < 8; ++t) c += double(m[f * 8 + t]) * d3[t];
    EXPECT_NEAR(c, (f == 0 || f == 1 || f == 3) ? 0.0 : want[f], 2e-4) << f;
  }
}

// The blocks of a one-dimensional tensor of n values.
DemoBlocks blocks_1d(std::uint64_t n, std::uint32_t topk, std::uint32_t chunk) {
  DemoParams p;
  p.topk = topk;
  p.chunk = chunk;
  const std::vector<std::uint64_t> shape{n};
  return demo_blocks(shape, p);
}

// Per coefficient, the mean over the members that sent it (not a sum over all members ÷ W).
TEST(Demo, TheGroupsStepIsTheMeanOverTheMembersThatSentACoefficient) {
  const auto b = blocks_1d(4, 1, 4);
  ASSERT_EQ(b.k, 1u);
  const auto a = encode({{{0}, {2.0f}}}), c = encode({{{0}, {4.0f}}}), e = encode({{{3}, {-6.0f}}});
  const std::span<const std::uint8_t> members[] = {a, c, e};
  Demo d;
  std::vector<float> w(4, 1.0f), g(4);
  ASSERT_EQ(d.apply(b, members, w, 0.5f, 0.0f, g), CodecError::ok);
  const auto m = d.basis(4);
  for (std::size_t t = 0; t < 4; ++t) {
    const float want = 3.0f * m[0 * 4 + t] - 6.0f * m[3 * 4 + t];
    EXPECT_NEAR(g[t], want, 1e-6);
    EXPECT_EQ(w[t], 1.0f - 0.5f * (want > 0 ? 1.0f : -1.0f));
  }
}

TEST(Demo, ABadMessageIsRejectedAndChangesNothing) {
  const auto b = blocks_1d(8, 2, 4);
  ASSERT_EQ(b.count(), 2u);
  const std::vector<Sel> good{{{0, 2}, {1.0f, -1.0f}}, {{1, 3}, {0.5f, 2.0f}}};
  EXPECT_EQ(demo_check(b, encode(good)), CodecError::ok);
  auto bad = good;
  bad[1].idx = {3, 1};  // not increasing
  EXPECT_EQ(demo_check(b, encode(bad)), CodecError::malformed);
  bad = good;
  bad[0].idx = {1, 1};  // repeated
  EXPECT_EQ(demo_check(b, encode(bad)), CodecError::malformed);
  bad = good;
  bad[0].idx = {0, 4};  // out of the block
  EXPECT_EQ(demo_check(b, encode(bad)), CodecError::malformed);
  bad = good;
  bad[1].val[0] = std::nanf("");
  EXPECT_EQ(demo_check(b, encode(bad)), CodecError::not_finite);
  bad[1].val[0] = INFINITY;
  EXPECT_EQ(demo_check(b, encode(bad)), CodecError::not_finite);
  auto shortm = encode(good);
  shortm.pop_back();
  EXPECT_EQ(demo_check(b, shortm), CodecError::size_mismatch);

  // apply: one bad member anywhere leaves the weights untouched.
  const auto ok = encode(good), nan = encode(bad);
  const std::span<const std::uint8_t> members[] = {ok, nan};
  Demo d;
  std::vector<float> w(8, 3.0f);
  EXPECT_EQ(d.apply(b, members, w, 0.1f, 0.1f), CodecError::not_finite);
  for (float x : w) EXPECT_EQ(x, 3.0f);
  // compress: a NaN gradient leaves δ untouched.
  std::vector<float> delta(8, 1.0f), g(8, 0.0f);
  g[5] = std::nanf("");
  std::vector<std::uint8_t> msg(demo_encoded_size(b));
  EXPECT_EQ(d.compress(b, delta, g, 0.1f, 0.9f, msg), CodecError::not_finite);
  for (float x : delta) EXPECT_EQ(x, 1.0f);
  EXPECT_EQ(d.compress(b, delta, std::span<const float>(g).first(7), 0.1f, 0.9f, msg),
            CodecError::size_mismatch);
}

// --- against PyTorch ---------------------------------------------------------------------------

struct RefCase {
  std::vector<std::vector<std::uint64_t>> shapes;
  int steps, members;
  DemoParams p;
  float lr;
};

// Max |a − b| over max |b| (at least `floor`).
double max_rel(const float* a, const float* b, std::size_t n, double floor) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return worst / std::max(scale, floor);
}

void against_torch(const RefCase& rc, std::uint32_t seed) {
  namespace fs = std::filesystem;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<DemoBlocks> bs;
  std::size_t total = 0;
  for (const auto& s : rc.shapes) {
    bs.push_back(demo_blocks(s, rc.p));
    total += bs.back().size();
  }
  std::vector<float> p0(total);
  for (auto& x : p0) x = nd(rng);
  std::vector<float> grads(std::size_t(rc.steps) * rc.members * total);
  for (auto& x : grads) x = nd(rng);

  const fs::path dir = fs::temp_directory_path() / ("grove-demo-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "in.bin", out = dir / "out.bin";
  {
    std::ofstream f(in, std::ios::binary);
    const std::int32_t hdr[5] = {rc.steps, rc.members, std::int32_t(rc.shapes.size()),
                                 std::int32_t(rc.p.topk), std::int32_t(rc.p.chunk)};
    const float fs3[3] = {rc.lr, rc.p.decay, rc.p.weight_decay};
    f.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    f.write(reinterpret_cast<const char*>(fs3), sizeof fs3);
    for (const auto& s : rc.shapes) {
      const std::int32_t nd32 = std::int32_t(s.size());
      f.write(reinterpret_cast<const char*>(&nd32), 4);
      for (auto v : s) {
        const std::int32_t d = std::int32_t(v);
        f.write(reinterpret_cast<const char*>(&d), 4);
      }
    }
    f.write(reinterpret_cast<const char*>(p0.data()), std::streamsize(p0.size() * 4));
    f.write(reinterpret_cast<const char*>(grads.data()), std::streamsize(grads.size() * 4));
  }
  const std::string cmd = "/usr/bin/python3 " GROVE_SOURCE_DIR "/tests/optim/demo_reference.py " +
                          in.string() + " " + out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference failed (needs python3-torch): " << cmd;
  std::vector<float> ref(std::size_t(rc.steps) * 3 * total);
  {
    std::ifstream f(out, std::ios::binary);
    f.read(reinterpret_cast<char*>(ref.data()), std::streamsize(ref.size() * 4));
    ASSERT_EQ(std::size_t(f.gcount()), ref.size() * 4);
  }
  fs::remove_all(dir);

  Demo d;
  std::vector<float> p = p0, g(total);
  std::vector<std::vector<float>> deltas(rc.members, std::vector<float>(total, 0.0f));
  std::size_t flips = 0;
  for (int s = 0; s < rc.steps; ++s) {
    std::size_t lo = 0;
    for (const auto& b : bs) {
      std::vector<std::vector<std::uint8_t>> msgs(rc.members,
                                                  std::vector<std::uint8_t>(demo_encoded_size(b)));
      std::vector<std::span<const std::uint8_t>> views;
      for (int m = 0; m < rc.members; ++m) {
        const float* gm = grads.data() + (std::size_t(s) * rc.members + m) * total + lo;
        ASSERT_EQ(d.compress(b, std::span(deltas[m]).subspan(lo, b.size()), std::span(gm, b.size()),
                             rc.lr, rc.p.decay, msgs[m]),
                  CodecError::ok);
        views.push_back(msgs[m]);
      }
      ASSERT_EQ(d.apply(b, views, std::span(p).subspan(lo, b.size()), rc.lr, rc.p.weight_decay,
                        std::span(g).subspan(lo, b.size())),
                CodecError::ok);
      lo += b.size();
    }
    const float* rp = ref.data() + std::size_t(s) * 3 * total;
    const float* rd = rp + total;
    const float* rg = rd + total;
    // δ and G: to 1e-5 of the tensor's largest value (float32 sums in another order). A tensor
    // whose every coefficient was sent keeps only rounding in δ: measured against lr.
    lo = 0;
    for (std::size_t t = 0; t < bs.size(); ++t) {
      const std::size_t n = bs[t].size();
      EXPECT_LT(max_rel(deltas[0].data() + lo, rd + lo, n, rc.lr), 1e-5)
          << "step " << s << " tensor " << t;
      EXPECT_LT(max_rel(g.data() + lo, rg + lo, n, 1e-30), 1e-5) << "step " << s << " tensor " << t;
      lo += n;
    }
    // p: exact steps of ±lr, except where G is so near 0 that float order flips its sign.
    double gscale = 0;
    for (std::size_t i = 0; i < total; ++i) gscale = std::max(gscale, std::abs(double(rg[i])));
    for (std::size_t i = 0; i < total; ++i) {
      if (std::abs(p[i] - rp[i]) <= 1e-6f * std::max(1.0f, std::abs(rp[i]))) continue;
      ++flips;
      EXPECT_LT(std::abs(double(g[i])), 1e-5 * gscale) << "step " << s << " value " << i;
      p[i] = rp[i];  // go on from the reference's weights
    }
  }
  EXPECT_LE(flips, total / 10000 + 2);
}

TEST(Demo, StepsMatchPlainPyTorch) {
  RefCase rc;
  rc.shapes = {{64, 128}, {100, 96}, {67, 64}, {130}, {7}, {4, 6, 10}, {}};
  rc.steps = 5;
  rc.members = 3;
  rc.lr = 1e-3f;
  against_torch(rc, 11);
}

TEST(Demo, StepsMatchPlainPyTorchWithWeightDecayAndOtherSettings) {
  RefCase rc;
  rc.shapes = {{48, 256}, {256}, {3, 5, 32}};
  rc.steps = 4;
  rc.members = 4;
  rc.lr = 4e-4f;
  rc.p.decay = 0.9f;
  rc.p.topk = 5;
  rc.p.chunk = 16;
  rc.p.weight_decay = 0.1f;
  against_torch(rc, 12);
}

}  // namespace
}  // namespace grove::optim
