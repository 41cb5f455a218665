#include "gossip/wire.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace grove::gossip {
namespace {

TEST(GossipWire, RoundTripsEveryKind) {
  Header h;
  h.op[3] = 9;
  h.tag = 0x1234567890ull;
  h.phase = Phase::all_gather;
  h.index = 7;
  h.chunk = 3;
  h.count = 1000;
  h.codec = WireCodec::bf16;
  for (auto kind : {MsgKind::chunk, MsgKind::tensor_begin, MsgKind::heartbeat, MsgKind::done,
                    MsgKind::abort, MsgKind::tensor_end}) {
    h.kind = kind;
    h.digest.fill(kind == MsgKind::tensor_end ? 0xab : 0);
    h.suspects.clear();
    if (kind == MsgKind::abort) h.suspects = {NodeId{1}, NodeId{2}};
    const std::size_t pl = kind == MsgKind::chunk ? 2000 : 0;
    std::span<std::uint8_t> payload;
    Bytes b = encode_message(h, pl, &payload);
    ASSERT_EQ(payload.size(), pl);
    for (std::size_t i = 0; i < pl; ++i) payload[i] = static_cast<std::uint8_t>(i);
    auto m = decode_message(b.span());
    ASSERT_TRUE(m) << to_string(kind);
    EXPECT_EQ(m->h.kind, kind);
    EXPECT_EQ(m->h.op, h.op);
    EXPECT_EQ(m->h.tag, h.tag);
    EXPECT_EQ(m->h.phase, h.phase);
    EXPECT_EQ(m->h.index, 7u);
    EXPECT_EQ(m->h.chunk, 3u);
    EXPECT_EQ(m->h.count, 1000u);
    EXPECT_EQ(m->h.codec, WireCodec::bf16);
    EXPECT_EQ(m->h.digest, h.digest);
    EXPECT_EQ(m->h.suspects, h.suspects);
    ASSERT_EQ(m->payload.size(), pl);
    if (pl) {
      EXPECT_EQ(m->payload[1999], static_cast<std::uint8_t>(1999));
    }
  }
}

TEST(GossipWire, RejectsWhatNoEncoderProduces) {
  Header h;
  h.kind = MsgKind::heartbeat;
  Bytes ok = encode_message(h, 0);
  ASSERT_TRUE(decode_message(ok.span()));
  // Truncations anywhere in the header.
  for (std::size_t cut = 0; cut < ok.size(); ++cut)
    EXPECT_FALSE(decode_message(ok.span().first(cut))) << cut;
  // A payload on a message kind that has none.
  Bytes extra = encode_message(h, 4);
  EXPECT_FALSE(decode_message(extra.span()));
  // Too many suspects, over the caller's bound.
  h.kind = MsgKind::abort;
  h.suspects.assign(20, NodeId{});
  Bytes many = encode_message(h, 0);
  EXPECT_FALSE(decode_message(many.span(), WireLimits{.max_suspects = 10}));
  EXPECT_TRUE(decode_message(many.span()));
  // A chunk payload over the bound.
  h.kind = MsgKind::chunk;
  Bytes big = encode_message(h, 5000);
  EXPECT_FALSE(decode_message(big.span(), WireLimits{.max_payload = 4096}));
  // An unknown kind / codec byte.
  Bytes bad = encode_message(Header{}, 0);
  bad.data()[2 + 2] = 9;  // [array10, version, kind...] -> kind 9
  EXPECT_FALSE(decode_message(bad.span()));
}

TEST(GossipWire, CodecsRoundTripAndRejectNonFinite) {
  std::vector<float> v(512);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>(i) - 0.2f;
  for (auto c : {WireCodec::fp32, WireCodec::fp16, WireCodec::bf16, WireCodec::e3m0}) {
    std::vector<std::uint8_t> enc(encoded_size(c, v.size()));
    ASSERT_EQ(encode_values(c, v, enc), optim::CodecError::ok) << to_string(c);
    std::vector<float> back(v.size());
    ASSERT_EQ(decode_values(c, enc, back), optim::CodecError::ok);
    if (c == WireCodec::fp32) {
      EXPECT_EQ(back, v);
    }
    EXPECT_EQ(parse_codec(to_string(c)), c);
    auto bad = v;
    bad[5] = INFINITY;
    EXPECT_EQ(encode_values(c, bad, enc), optim::CodecError::not_finite);
    EXPECT_NE(decode_values(c, std::span(enc).first(enc.size() - 1), back), optim::CodecError::ok);
  }
  EXPECT_FALSE(parse_codec("fp8"));
}

}  // namespace
}  // namespace grove::gossip
