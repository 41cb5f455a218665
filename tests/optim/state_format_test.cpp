// The outer state's binary form: round trips, corruption, bounds, and the piece-by-piece forms
// (the same bytes and checksum whatever the pieces; parsing never asks for more than a piece).
#include "optim/state_format.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace grove::optim {
namespace {

std::vector<float> randn(std::mt19937& rng, std::size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// An outer state with `n` random slow weights and momentum values.
OuterState random_state(std::uint64_t round, unsigned seed, std::size_t n) {
  OuterState s;
  s.round = round;
  std::mt19937 rng(seed);
  s.phi = randn(rng, n, 1.0f);
  s.momentum = randn(rng, n, 0.1f);
  return s;
}

TEST(StateFormat, SerialisesAndRejectsCorruption) {
  const OuterState s = random_state(42, 9, 513);
  auto bytes = serialize(s);
  auto back = deserialize(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, s);
  for (std::size_t cut : {std::size_t{0}, std::size_t{10}, bytes.size() - 1})
    EXPECT_FALSE(deserialize(std::span(bytes).first(cut)));
  auto flipped = bytes;
  flipped[100] ^= 1;
  EXPECT_FALSE(deserialize(flipped));
  EXPECT_FALSE(deserialize(bytes, 100));  // over the caller's bound
  OuterState bad = s;
  bad.phi[3] = std::nanf("");
  EXPECT_FALSE(deserialize(serialize(bad)));
  bad = s;
  bad.error = {1.0f};  // size does not match phi
  EXPECT_FALSE(deserialize(serialize(bad)));
  EXPECT_TRUE(all_finite(s.phi));
  EXPECT_FALSE(all_finite(std::vector<float>{1.0f, INFINITY}));
}

// The checksum catches every single-bit flip and the flips that a plain word-wise FNV would let
// cancel (the top bit of two words in one lane); the older GRVOUT01 form (byte-wise FNV-1a 64)
// still reads.
TEST(StateFormat, ChecksumCatchesBitFlipsAndTheOldFormReads) {
  const OuterState s = random_state(7, 3, 300);
  const auto bytes = serialize(s);
  for (std::size_t i = 0; i + 8 < bytes.size(); ++i)
    for (int bit : {0, 3, 7}) {
      auto f = bytes;
      f[i] ^= static_cast<std::uint8_t>(1u << bit);
      ASSERT_FALSE(deserialize(f)) << "byte " << i << " bit " << bit;
    }
  auto two = bytes;
  two[64 + 7] ^= 0x80;       // bit 63 of a word...
  two[64 + 32 + 7] ^= 0x80;  // ...and of the next word of the same lane
  EXPECT_FALSE(deserialize(two));

  std::vector<std::uint8_t> v1(bytes.begin(), bytes.end() - 8);
  v1[7] = '1';  // "GRVOUT01"
  std::uint64_t h = 1469598103934665603ull;
  for (std::uint8_t c : v1) h = (h ^ c) * 1099511628211ull;
  for (int i = 0; i < 8; ++i) v1.push_back(static_cast<std::uint8_t>(h >> (8 * i)));
  auto back = deserialize(v1);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, s);
  v1[7] = '2';  // the old checksum under the new magic
  EXPECT_FALSE(deserialize(v1));
}

// The checksum over pieces cut anywhere equals the one over the whole; serialize_to's pieces
// make serialize's bytes, with the values' pieces taken straight from the vectors.
TEST(StateFormat, PiecesGiveTheSameBytesAndChecksum) {
  const OuterState s = random_state(11, 5, 300'001);  // values past one 1 MiB piece
  const auto whole = serialize(s);
  ASSERT_EQ(whole.size(), serialized_size(s));
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    StateChecksum c;
    for (std::size_t at = 0; at < whole.size();) {
      const std::size_t n = std::min<std::size_t>(whole.size() - at, rng() % 100);
      c.update(std::span(whole).subspan(at, n));
      at += n;
    }
    ASSERT_EQ(c.final(), state_checksum(whole)) << "trial " << trial;
  }
  std::vector<std::uint8_t> joined;
  std::size_t largest = 0;
  bool from_phi = false;
  ASSERT_TRUE(serialize_to(s, [&](std::span<const std::uint8_t> piece) {
    largest = std::max(largest, piece.size());
    from_phi |= piece.data() == reinterpret_cast<const std::uint8_t*>(s.phi.data());
    joined.insert(joined.end(), piece.begin(), piece.end());
    return true;
  }));
  EXPECT_EQ(joined, whole);
  EXPECT_LE(largest, std::size_t{1} << 20);
  if constexpr (std::endian::native == std::endian::little) {
    EXPECT_TRUE(from_phi);
  }
  // A sink that refuses stops the writing.
  int calls = 0;
  EXPECT_FALSE(serialize_to(s, [&](std::span<const std::uint8_t>) { return ++calls < 3; }));
  EXPECT_EQ(calls, 3);
}

// deserialize_from reads a piece at a time (never the whole form) and gives the state back; a
// reader that fails, or a size that does not match, gives nothing.
TEST(StateFormat, ParsesPieceByPieceThroughAReader) {
  const OuterState s = random_state(4, 8, 600'000);
  const auto bytes = serialize(s);
  std::size_t largest = 0, reads = 0;
  const ByteReader reader = [&](std::uint64_t off, std::span<std::uint8_t> out) {
    ++reads;
    largest = std::max(largest, out.size());
    if (off > bytes.size() || out.size() > bytes.size() - off) return false;
    std::memcpy(out.data(), bytes.data() + off, out.size());
    return true;
  };
  auto back = deserialize_from(bytes.size(), reader);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, s);
  EXPECT_LE(largest, std::size_t{1} << 20);
  EXPECT_GT(reads, 4u);
  EXPECT_FALSE(deserialize_from(bytes.size() + 1, reader));
  EXPECT_FALSE(deserialize_from(bytes.size() - 1, reader));
  int left = 3;
  EXPECT_FALSE(deserialize_from(bytes.size(), [&](std::uint64_t off, std::span<std::uint8_t> out) {
    return --left > 0 && reader(off, out);
  }));
  // A count past the bytes there are is refused before anything is sized for it.
  auto lying = bytes;
  lying[16 + 7] = 0x40;  // φ's count: 2^62 values
  EXPECT_FALSE(deserialize(lying));
}

}  // namespace
}  // namespace grove::optim
