#include "transport/crypto.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "transport/error.hpp"

namespace grove::transport {
namespace {

class CipherTest : public ::testing::TestWithParam<Suite> {};

TEST_P(CipherTest, SealOpenRoundTripInPlace) {
  if (GetParam() == Suite::aes256gcm && !(local_suites() & (1u << int(Suite::aes256gcm))))
    GTEST_SKIP() << "no AES-NI";
  Key k{};
  k[0] = 7;
  CipherState tx(GetParam(), k), rx(GetParam(), k);
  for (int i = 0; i < 5; ++i) {
    std::vector<std::uint8_t> msg(1000 + i, static_cast<std::uint8_t>(i)), orig = msg;
    std::uint8_t ad[4] = {1, 2, 3, 4};
    std::uint8_t tag[kTagSize];
    ASSERT_TRUE(tx.seal(msg, ad, tag));
    EXPECT_NE(msg, orig);
    ASSERT_TRUE(rx.open(msg, ad, tag));
    EXPECT_EQ(msg, orig);
  }
  EXPECT_EQ(tx.counter(), 5u);
}

TEST_P(CipherTest, TamperedReplayedReorderedAndWrongAdFail) {
  if (GetParam() == Suite::aes256gcm && !(local_suites() & (1u << int(Suite::aes256gcm))))
    GTEST_SKIP() << "no AES-NI";
  Key k{};
  CipherState tx(GetParam(), k);
  std::uint8_t ad[4] = {0, 0, 0, 9};
  std::vector<std::vector<std::uint8_t>> c(3, std::vector<std::uint8_t>(64, 0x55));
  std::vector<std::array<std::uint8_t, kTagSize>> tags(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(tx.seal(c[i], ad, tags[i].data()));

  {  // tampered byte
    CipherState rx(GetParam(), k);
    auto m = c[0];
    m[10] ^= 1;
    EXPECT_FALSE(rx.open(m, ad, tags[0].data()));
  }
  {  // wrong associated data (e.g. altered length prefix)
    CipherState rx(GetParam(), k);
    auto m = c[0];
    std::uint8_t bad_ad[4] = {0, 0, 0, 8};
    EXPECT_FALSE(rx.open(m, bad_ad, tags[0].data()));
  }
  {  // replay: frame 0 twice
    CipherState rx(GetParam(), k);
    auto m = c[0], m2 = c[0];
    EXPECT_TRUE(rx.open(m, ad, tags[0].data()));
    EXPECT_FALSE(rx.open(m2, ad, tags[0].data()));
  }
  {  // reorder: frame 1 before frame 0
    CipherState rx(GetParam(), k);
    auto m = c[1];
    EXPECT_FALSE(rx.open(m, ad, tags[1].data()));
  }
  {  // dropped frame: 0 then 2
    CipherState rx(GetParam(), k);
    auto m0 = c[0], m2 = c[2];
    EXPECT_TRUE(rx.open(m0, ad, tags[0].data()));
    EXPECT_FALSE(rx.open(m2, ad, tags[2].data()));
  }
}

INSTANTIATE_TEST_SUITE_P(Suites, CipherTest,
                         ::testing::Values(Suite::aes256gcm, Suite::xchacha20poly1305),
                         [](const auto& i) {
                           return i.param == Suite::aes256gcm ? "aes" : "xchacha";
                         });

TEST(SwarmKey, ParseAndReject) {
  auto k = SwarmKey::generate();
  EXPECT_EQ(SwarmKey::parse(k.hex() + "\n").bytes, k.bytes);
  EXPECT_THROW(SwarmKey::parse("abc"), ConfigError);
  EXPECT_THROW(SwarmKey::parse(std::string(64, 'z')), ConfigError);
  EXPECT_THROW(SwarmKey::load("/nonexistent/grove/key"), ConfigError);
}

}  // namespace
}  // namespace grove::transport
