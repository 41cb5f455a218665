// The node's state files: blobs in unnamed files that leave nothing behind, and a model-sized
// state served, downloaded and checkpointed through them without model-sized memory.
#include "node/state_files.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>

#include "gossip/state_sync.hpp"
#include "gossip/step_work.hpp"
#include "node/checkpoint.hpp"
#include "tests/node/rss.hpp"
#include "tests/node/temp_dir.hpp"

namespace grove::node {
namespace {

namespace fs = std::filesystem;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("grove-blobs-") {}
};

std::size_t files_in(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

using testing::PeakRss;
using testing::rss_now;
using testing::sanitized;

TEST(StateFiles, ABlobIsAFileThatLeavesNothingBehind) {
  TempDir d;
  auto store = state_files(d.path / "blobs");
  auto w = store->create(1 << 20);
  ASSERT_TRUE(w) << w.text();
  std::vector<std::uint8_t> piece(4096);
  for (std::size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<std::uint8_t>(i * 7);
  ASSERT_TRUE((*w)->write((1 << 20) - 4096, piece));
  EXPECT_FALSE((*w)->write((1 << 20) - 4095, piece));
  auto blob = (*w)->seal();
  ASSERT_TRUE(blob);
  EXPECT_FALSE((*w)->write(0, piece)) << "a sealed writer takes no more";
  EXPECT_EQ(files_in(d.path / "blobs"), 0u) << "unnamed files only";
  std::vector<std::uint8_t> back(4096);
  ASSERT_TRUE(blob->read((1 << 20) - 4096, back));
  EXPECT_EQ(back, piece);
  EXPECT_FALSE(blob->read(1 << 20, back));
  // A state through a file: written piece by piece, parsed back.
  optim::OuterState s;
  s.round = 3;
  s.phi.assign(300'000, 1.5f);
  s.momentum.assign(300'000, -0.5f);
  auto saved = gossip::save_state(*store, s);
  ASSERT_TRUE(saved) << saved.text();
  auto loaded = gossip::load_state(**saved);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(*loaded, s);
}

TEST(StateFiles, AStoreThatCannotMakeFilesSaysWhy) {
  TempDir d;
  {
    std::ofstream f(d.path / "not-a-dir");
    f << "x";
  }
  auto w = state_files(d.path / "not-a-dir")->create(100);
  ASSERT_FALSE(w);
  EXPECT_NE(w.why().find("not-a-dir"), std::string::npos) << w.text();
}

// The descriptors and mappings of this process that name a file in `dir` (an unnamed file shows
// as "dir/#inode (deleted)").
std::size_t open_in(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    n += fs::read_symlink(e.path(), ec).string().starts_with(dir.string());
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) n += line.find(dir.string()) != line.npos;
  return n;
}

// A dropped file is unmapped and closed off the dropping thread (freeing a large file's blocks
// takes seconds), but it is: nothing stays open or mapped.
TEST(StateFiles, DroppedFilesAreUnmappedAndClosed) {
  TempDir d;
  const auto dir = d.path / "blobs";
  auto store = state_files(dir);
  const auto alloc = float_pages(dir);
  {
    std::vector<optim::Floats> arrays;
    std::vector<std::shared_ptr<const gossip::StateBlob>> blobs;
    for (int i = 0; i < 20; ++i) {
      arrays.push_back(optim::Floats::zeros(1 << 16, alloc));
      ASSERT_TRUE(arrays.back().paged());
      arrays.back()[100] = 1.0f;
      auto w = store->create(1 << 16);
      ASSERT_TRUE(w) << w.text();
      blobs.push_back((*w)->seal());
    }
    EXPECT_EQ(open_in(dir), 60u) << "20 arrays (a descriptor and a mapping each) and 20 blobs";
  }
  ASSERT_TRUE(dropped_files_closed(std::chrono::seconds(20)));
  EXPECT_EQ(open_in(dir), 0u);
}

// A state of 256 MiB (a 32M-parameter model's φ and momentum; the same code path carries 8 GB)
// served from a file, downloaded into a file and written into a checkpoint: the process's
// resident memory grows by the chunks in flight, not by the state.
TEST(StateFiles, AStateIsServedDownloadedAndCheckpointedWithoutModelSizedMemory) {
  if (sanitized()) GTEST_SKIP() << "the sanitizers' allocators keep freed memory resident";
  TempDir d;
  auto store = state_files(d.path / "blobs");
  constexpr std::size_t kValues = 32u << 20;  // φ and momentum: 2 × 128 MiB
  const std::uint64_t size = 8 + 8 + 3 * 8 + 2 * 4 * std::uint64_t{kValues} + 8;
  // The donor's state, written into its file piece by piece (never whole in memory): the same
  // bytes as optim::serialize_to makes, from a generator.
  std::shared_ptr<const gossip::StateBlob> served;
  {
    auto w = store->create(size);
    ASSERT_TRUE(w) << w.text();
    optim::StateChecksum sum;
    std::uint64_t at = 0;
    const auto put = [&](std::span<const std::uint8_t> b) {
      sum.update(b);
      ASSERT_TRUE((*w)->write(at, b));
      at += b.size();
    };
    const auto u64 = [&](std::uint64_t v) {
      std::uint8_t b[8];
      for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
      put(b);
    };
    put({reinterpret_cast<const std::uint8_t*>("GRVOUT02"), 8});
    u64(9);
    std::vector<float> piece(1 << 18);
    for (int array = 0; array < 2; ++array) {
      u64(kValues);
      for (std::size_t v = 0; v < kValues; v += piece.size()) {
        for (std::size_t i = 0; i < piece.size(); ++i)
          piece[i] = static_cast<float>((v + i) % 1000) * (array ? -0.001f : 0.001f);
        put({reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size() * 4});
      }
    }
    u64(0);
    std::uint8_t trailer[8];
    const auto c = sum.final();
    for (int i = 0; i < 8; ++i) trailer[i] = static_cast<std::uint8_t>(c >> (8 * i));
    ASSERT_TRUE((*w)->write(at, trailer));
    ASSERT_EQ(at + 8, size);
    served = (*w)->seal();
  }
  const std::uint64_t base = rss_now();
  std::uint64_t peak = base;
  auto snap = gossip::StateSnapshot::of("run-f", 9, served, 4u << 20);
  ASSERT_TRUE(snap) << snap.text();
  peak = std::max(peak, rss_now());
  gossip::StateServer server;
  server.add(*snap);
  gossip::StateSyncOptions o;
  o.store = store;
  gossip::StateOffer offer{{}, "donor", "run-f", 9, size, (*snap)->root(), {}};
  offer.donor[0] = 1;
  gossip::StateDownload download("run-f", {offer}, o, dht::Time(0));
  for (int guard = 0; guard < 10000 && download.status() == gossip::OpStatus::running; ++guard) {
    auto reqs = download.take_requests();
    if (reqs.empty()) break;
    for (auto& r : reqs) {
      auto body = server.answer(r.body);
      ASSERT_TRUE(body) << body.text();
      download.on_response(r.id, *body, dht::Time(0));
      peak = std::max(peak, rss_now());
    }
  }
  ASSERT_EQ(download.status(), gossip::OpStatus::done) << download.failure();
  auto got = download.take_blob();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->size(), size);
  // The checkpoint copies the downloaded blob into its file piece by piece.
  Checkpoint c;
  c.config_text = "grove-run v1\n";
  c.round = 9;
  c.outer_blob = got;
  ASSERT_FALSE(save_checkpoint(d.path / "ckpt", c));
  peak = std::max(peak, rss_now());
  const std::uint64_t grew = peak - base;
  EXPECT_LT(grew, size / 8) << "resident memory grew by " << grew << " bytes for a state of "
                            << size;
  // What was checkpointed loads back (now the state is in memory: once).
  auto back = load_latest(d.path / "ckpt");
  ASSERT_TRUE(back.checkpoint) << back.skipped;
  ASSERT_EQ(back.checkpoint->outer.phi.size(), kValues);
  EXPECT_EQ(back.checkpoint->outer.phi[1234], static_cast<float>(1234 % 1000) * 0.001f);
  EXPECT_EQ(back.checkpoint->outer.momentum[999], static_cast<float>(999) * -0.001f);
  EXPECT_LT(rss_now() - base, 2 * size) << "loading holds the state once, not the file as well";
}

// A round's outer step over φ, the momentum and θ in the node's pages (48M values: 192 MiB
// each), with φ's hash and the new state's blob: the process holds a few fragments, not the
// arrays, and the step's values are right.
TEST(StateFiles, AnOuterStepOverPagedArraysHoldsFragmentsNotTheState) {
  if (sanitized()) GTEST_SKIP() << "the sanitizers' allocators keep freed memory resident";
  TempDir d;
  const auto alloc = float_pages(d.path / "blobs");
  constexpr std::size_t n = 48u << 20;
  const auto value = [](std::size_t i) { return static_cast<float>(i % 1024) / 1024.0f; };
  gossip::StepWork w;
  w.kind = gossip::StepWork::Kind::noloco_mean;  // (θ as the group's mean: the whole step)
  w.mode = gossip::OuterMode::noloco;
  w.noloco = {0.5f, 0.7f, 0.7f};
  w.threads = 2;
  w.state.round = 4;
  w.state.phi = optim::Floats::zeros(n, alloc);
  w.state.momentum = optim::Floats::zeros(n, alloc);
  w.theta = optim::Floats::zeros(n, alloc);
  ASSERT_TRUE(w.state.phi.paged() && w.state.momentum.paged() && w.theta.paged());
  optim::by_fragments(n,
                      [&](std::size_t lo, std::size_t hi) {
                        for (std::size_t i = lo; i < hi; ++i) {
                          w.state.phi[i] = value(i);
                          w.theta[i] = value(i) + 0.5f;
                        }
                      },
                      {&w.state.phi, &w.theta});
  w.store = state_files(d.path / "blobs");
  const std::uint64_t base = rss_now();
  PeakRss peak;
  w.run();
  const std::uint64_t grew = peak.stop() - base;
  const std::uint64_t arrays = 3 * std::uint64_t{n} * sizeof(float);
  EXPECT_LT(grew, arrays / 4) << "resident memory grew by " << grew << " bytes over arrays of "
                              << arrays;
  ASSERT_TRUE(w.blob);
  EXPECT_EQ(w.blob->size(), optim::serialized_size(w.state));
  // NoLoCo from zero momentum: m = β(θ − φ), φ' = φ + m.
  for (std::size_t i : {std::size_t{0}, std::size_t{12345}, n - 1}) {
    EXPECT_FLOAT_EQ(w.state.momentum[i], 0.7f * 0.5f);
    EXPECT_FLOAT_EQ(w.state.phi[i], value(i) + 0.7f * 0.5f);
  }
  EXPECT_EQ(w.hash, gossip::weights_hash(std::span<const float>(w.state.phi)));
}

}  // namespace
}  // namespace grove::node
