// Checkpoints: round trip, damage detection, and a kill at every step of a save leaving a
// complete checkpoint behind.
#include "node/checkpoint.hpp"
#include "tests/node/temp_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <unistd.h>

namespace grove::node {
namespace {

namespace fs = std::filesystem;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("grove-ckpt-") {}
};

Checkpoint sample(std::uint64_t step) {
  Checkpoint c;
  c.config_text = "grove-run v1\nworkload mlp\n";
  c.step = step;
  c.round = step / 10;
  c.tokens = step * 1000;
  c.outer.round = c.round;
  c.outer.phi = {1.0f, 2.0f, static_cast<float>(step)};
  c.outer.momentum = {0.5f, 0.25f, 0.125f};
  c.workload = {1, 2, 3, static_cast<std::uint8_t>(step)};
  return c;
}

std::vector<std::uint8_t> read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_all(const fs::path& p, const std::vector<std::uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(Checkpoint, EncodeDecodeRoundTrip) {
  const auto c = sample(7);
  auto back = decode_checkpoint(encode_checkpoint(c));
  ASSERT_TRUE(back) << back.why();
  EXPECT_EQ(*back, c);
}

// A checkpoint written from the round engine's snapshot bytes is the same file as one written
// from the state itself (the node writes them so; loading gives the state back).
TEST(Checkpoint, WrittenFromTheStatesBytesItIsTheSameFile) {
  const auto c = sample(7);
  auto shared = c;
  shared.outer = {};
  shared.outer_blob = gossip::memory_blob(optim::serialize(c.outer));
  EXPECT_EQ(encode_checkpoint(shared), encode_checkpoint(c));
  auto back = decode_checkpoint(encode_checkpoint(shared));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, c);
}

TEST(Checkpoint, EveryDamagedByteOrTruncationIsDetected) {
  const auto bytes = encode_checkpoint(sample(3));
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto b = bytes;
    b[i] ^= 0x40;
    EXPECT_FALSE(decode_checkpoint(b)) << "byte " << i;
  }
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_checkpoint(std::span(bytes).first(n))) << "length " << n;
}

TEST(Checkpoint, SaveThenLoadTheNewest) {
  TempDir d;
  EXPECT_FALSE(load_latest(d.path).checkpoint);
  ASSERT_FALSE(save_checkpoint(d.path, sample(1)));
  ASSERT_FALSE(save_checkpoint(d.path, sample(2)));
  auto [c, why] = load_latest(d.path);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->step, 2u);
  EXPECT_TRUE(fs::exists(d.path / "checkpoint.prev"));
}

TEST(Checkpoint, ALargeStateKeepsOneCheckpoint) {
  TempDir d;
  ASSERT_FALSE(save_checkpoint(d.path, sample(1)));
  ASSERT_FALSE(save_checkpoint(d.path, sample(2)));
  ASSERT_TRUE(fs::exists(d.path / "checkpoint.prev"));
  ASSERT_FALSE(save_checkpoint(d.path, sample(3), /*keep_previous=*/false));
  EXPECT_FALSE(fs::exists(d.path / "checkpoint.prev"));
  EXPECT_FALSE(fs::exists(d.path / "checkpoint.next"));
  auto [c, why] = load_latest(d.path);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->step, 3u);
  EXPECT_TRUE(keeps_previous_checkpoint(999'999'999));
  EXPECT_FALSE(keeps_previous_checkpoint(4'000'000'000));  // 500M parameters
}

// A kill can stop a save after any of its steps; reproduce the files each state leaves and
// check that the newest complete checkpoint loads.
TEST(Checkpoint, AKillAtAnyStepOfASaveLeavesACompleteCheckpoint) {
  const auto old_bytes = encode_checkpoint(sample(1)), new_bytes = encode_checkpoint(sample(2));
  struct State {
    const char* what;
    bool bin_old, prev_old, next_new, bin_new, tmp_partial;
    std::uint64_t expect;
  };
  const State states[] = {
      {"temporary half written", true, false, false, false, true, 1},
      {"next complete", true, false, true, false, false, 2},
      {"bin moved to prev", false, true, true, false, false, 2},
      {"next moved to bin", false, true, false, true, false, 2},
  };
  for (const auto& s : states) {
    TempDir d;
    if (s.bin_old) write_all(d.path / "checkpoint.bin", old_bytes);
    if (s.prev_old) write_all(d.path / "checkpoint.prev", old_bytes);
    if (s.next_new) write_all(d.path / "checkpoint.next", new_bytes);
    if (s.bin_new) write_all(d.path / "checkpoint.bin", new_bytes);
    if (s.tmp_partial)
      write_all(d.path / "checkpoint.next.tmp.123",
                std::vector<std::uint8_t>(new_bytes.begin(), new_bytes.begin() + 20));
    auto [c, why] = load_latest(d.path);
    ASSERT_TRUE(c) << s.what << ": " << why;
    EXPECT_EQ(c->step, s.expect) << s.what;
  }
}

TEST(Checkpoint, ADamagedNewestFallsBackToThePrevious) {
  TempDir d;
  ASSERT_FALSE(save_checkpoint(d.path, sample(1)));
  ASSERT_FALSE(save_checkpoint(d.path, sample(2)));
  auto b = read_all(d.path / "checkpoint.bin");
  b[b.size() / 2] ^= 1;
  write_all(d.path / "checkpoint.bin", b);
  auto [c, why] = load_latest(d.path);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step, 1u);
  EXPECT_NE(why.find("checkpoint.bin"), std::string::npos) << why;
}

TEST(Checkpoint, ATooLargeFileIsNotRead) {
  TempDir d;
  ASSERT_FALSE(save_checkpoint(d.path, sample(1)));
  auto [c, why] = load_latest(d.path, 16);
  EXPECT_FALSE(c);
  EXPECT_NE(why.find("too large"), std::string::npos) << why;
}

}  // namespace
}  // namespace grove::node
