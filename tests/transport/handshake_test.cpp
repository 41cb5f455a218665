#include "transport/handshake.hpp"

#include <gtest/gtest.h>

namespace grove::transport {
namespace {

struct Outcome {
  Result<Handshake::Step> last = errc::ok;
  bool initiator_done = false, responder_done = false;
  std::error_code error;
};

// Runs a full handshake in memory; `mutate` may alter message i (0 = M1, 1 = M2, 2 = M3).
Outcome run(Handshake& i, Handshake& r,
            std::function<void(int, std::vector<std::uint8_t>&)> mutate = {}) {
  Outcome o;
  auto m1 = i.start();
  if (mutate) mutate(0, m1);
  auto s2 = r.on_message(m1);
  if (!s2) return o.error = s2.error(), o;
  auto m2 = s2->reply;
  if (mutate) mutate(1, m2);
  auto s3 = i.on_message(m2);
  if (!s3) return o.error = s3.error(), o;
  o.initiator_done = s3->done;
  auto m3 = s3->reply;
  if (mutate) mutate(2, m3);
  auto s4 = r.on_message(m3);
  if (!s4) return o.error = s4.error(), o;
  o.responder_done = s4->done;
  return o;
}

TEST(Handshake, MutualAuthenticationAndMatchingKeys) {
  auto a = Identity::generate(), b = Identity::generate();
  for (std::uint8_t suites : {std::uint8_t(0), std::uint8_t(1u << int(Suite::xchacha20poly1305))}) {
    Handshake i(Handshake::Role::initiator, {&a, std::nullopt, b.id(), suites});
    Handshake r(Handshake::Role::responder, {&b, std::nullopt, std::nullopt, 0});
    auto o = run(i, r);
    ASSERT_FALSE(o.error) << o.error.message();
    EXPECT_TRUE(o.initiator_done && o.responder_done);
    EXPECT_EQ(i.keys().peer_id, b.id());
    EXPECT_EQ(r.keys().peer_id, a.id());
    EXPECT_EQ(i.keys().tx, r.keys().rx);
    EXPECT_EQ(i.keys().rx, r.keys().tx);
    EXPECT_NE(i.keys().tx, i.keys().rx);
    EXPECT_EQ(i.keys().suite, r.keys().suite);
    if (suites) {
      EXPECT_EQ(i.keys().suite, Suite::xchacha20poly1305);
    }
  }
}

TEST(Handshake, FreshKeysEverySession) {
  auto a = Identity::generate(), b = Identity::generate();
  Handshake i1(Handshake::Role::initiator, {&a, std::nullopt, std::nullopt, 0});
  Handshake r1(Handshake::Role::responder, {&b, std::nullopt, std::nullopt, 0});
  Handshake i2(Handshake::Role::initiator, {&a, std::nullopt, std::nullopt, 0});
  Handshake r2(Handshake::Role::responder, {&b, std::nullopt, std::nullopt, 0});
  ASSERT_FALSE(run(i1, r1).error);
  ASSERT_FALSE(run(i2, r2).error);
  EXPECT_NE(i1.keys().tx, i2.keys().tx);
}

TEST(Handshake, SwarmKeyOnBothSidesWorks) {
  auto a = Identity::generate(), b = Identity::generate();
  auto k = SwarmKey::generate();
  Handshake i(Handshake::Role::initiator, {&a, k, std::nullopt, 0});
  Handshake r(Handshake::Role::responder, {&b, k, std::nullopt, 0});
  EXPECT_FALSE(run(i, r).error);
}

TEST(Handshake, WrongOrMissingSwarmKeyFailsAtFirstMessage) {
  auto a = Identity::generate(), b = Identity::generate();
  std::vector<std::pair<std::optional<SwarmKey>, std::optional<SwarmKey>>> cases = {
      {SwarmKey::generate(), SwarmKey::generate()},
      {std::nullopt, SwarmKey::generate()},
      {SwarmKey::generate(), std::nullopt}};
  for (auto& [ki, kr] : cases) {
    Handshake i(Handshake::Role::initiator, {&a, ki, std::nullopt, 0});
    Handshake r(Handshake::Role::responder, {&b, kr, std::nullopt, 0});
    auto o = run(i, r);
    EXPECT_EQ(o.error, make_error_code(errc::handshake_failed));
    EXPECT_FALSE(r.done());
  }
}

TEST(Handshake, WrongExpectedPeer) {
  auto a = Identity::generate(), b = Identity::generate(), c = Identity::generate();
  Handshake i(Handshake::Role::initiator, {&a, std::nullopt, c.id(), 0});
  Handshake r(Handshake::Role::responder, {&b, std::nullopt, std::nullopt, 0});
  EXPECT_EQ(run(i, r).error, make_error_code(errc::wrong_peer));
}

TEST(Handshake, EveryTamperedByteIsRejected) {
  auto a = Identity::generate(), b = Identity::generate();
  const std::size_t sizes[3] = {kM1Size, kM2Size, kM3Size};
  for (int msg = 0; msg < 3; ++msg) {
    for (std::size_t pos = 0; pos < sizes[msg]; ++pos) {
      Handshake i(Handshake::Role::initiator, {&a, std::nullopt, std::nullopt, 0});
      Handshake r(Handshake::Role::responder, {&b, std::nullopt, std::nullopt, 0});
      auto o = run(i, r, [&](int m, std::vector<std::uint8_t>& bytes) {
        if (m == msg) bytes[pos] ^= 0x01;
      });
      // Flipping a suite bit in M1 may still leave a common suite (then only the MAC breaks it),
      // so every case must end in failure, never in two completed handshakes.
      EXPECT_TRUE(o.error) << "message " << msg << " byte " << pos;
      EXPECT_FALSE(o.responder_done && o.initiator_done);
    }
  }
}

TEST(Handshake, TruncatedAndOutOfOrderMessagesRejected) {
  auto a = Identity::generate(), b = Identity::generate();
  Handshake r(Handshake::Role::responder, {&b, std::nullopt, std::nullopt, 0});
  std::vector<std::uint8_t> short_m1(kM1Size - 1, 0);
  EXPECT_EQ(r.on_message(short_m1).error(), make_error_code(errc::malformed));
  EXPECT_EQ(r.on_message(short_m1).error(), make_error_code(errc::protocol_violation));

  Handshake i(Handshake::Role::initiator, {&a, std::nullopt, std::nullopt, 0});
  std::vector<std::uint8_t> junk(kM2Size, 0);
  EXPECT_TRUE(i.on_message(junk).error());  // before start()
}

}  // namespace
}  // namespace grove::transport
