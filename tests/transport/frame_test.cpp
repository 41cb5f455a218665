#include "transport/frame.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace grove::transport {
namespace {

std::vector<std::uint8_t> plaintext_with_header(const std::vector<std::uint8_t>& header,
                                                const std::vector<std::uint8_t>& payload = {}) {
  std::vector<std::uint8_t> pt{static_cast<std::uint8_t>(header.size() >> 8),
                               static_cast<std::uint8_t>(header.size())};
  pt.insert(pt.end(), header.begin(), header.end());
  pt.insert(pt.end(), payload.begin(), payload.end());
  return pt;
}

std::vector<std::uint8_t> pack(std::function<void(msgpack::packer<msgpack::sbuffer>&)> fn) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  fn(p);
  return {b.data(), b.data() + b.size()};
}

TEST(Frame, RoundTripEveryType) {
  for (std::uint8_t t = 1; t <= kMaxFrameType; ++t) {
    std::vector<std::uint8_t> payload(t * 100, t);
    FrameHeader h{static_cast<FrameType>(t), 1234567890123ull + t, 42u + t,
                  "method/" + std::to_string(t)};
    Frame f = encode_frame(h, payload);
    EXPECT_EQ(f.wire_size(), f.plaintext().size() + kRecordOverhead);
    auto d = decode_frame(f);
    ASSERT_TRUE(d) << d.error().message();
    EXPECT_EQ(d->header.type, h.type);
    EXPECT_EQ(d->header.id, h.id);
    EXPECT_EQ(d->header.arg, h.arg);
    EXPECT_EQ(d->header.text, h.text);
    ASSERT_EQ(d->payload_size, payload.size());
    EXPECT_EQ(0, std::memcmp(f.buf.data() + d->payload_offset, payload.data(), payload.size()));
  }
}

TEST(Frame, PayloadRegionIsWritableInPlace) {
  std::span<std::uint8_t> region;
  Frame f = encode_frame({FrameType::stream_data, 1, 0, {}}, 4096, &region);
  ASSERT_EQ(region.size(), 4096u);
  std::memset(region.data(), 0xAB, region.size());
  auto d = decode_frame(f);
  ASSERT_TRUE(d);
  EXPECT_EQ(f.buf.data()[d->payload_offset + 4095], 0xAB);
}

TEST(Frame, LongTextIsCappedNotRejected) {
  Frame f = encode_frame({FrameType::message, 0, 0, std::string(5000, 'x')}, {});
  auto d = decode_frame(f);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->header.text.size(), kMaxHeaderText);
}

TEST(Frame, MalformedInputsAreRejected) {
  auto valid = pack([](auto& p) {
    p.pack_array(4);
    p.pack(1);
    p.pack(2);
    p.pack(3);
    p.pack(std::string("m"));
  });
  EXPECT_TRUE(decode_plaintext(plaintext_with_header(valid)));

  std::vector<std::vector<std::uint8_t>> bad;
  bad.push_back({});                  // empty
  bad.push_back({0});                 // one byte
  bad.push_back({0, 0});              // zero-length header
  bad.push_back({0xFF, 0xFF, 1, 2});  // header longer than the frame
  {
    auto pt = plaintext_with_header(valid);
    pt[1] += 1;  // header length one too long: swallows a payload byte / truncated header
    bad.push_back(pt);
  }
  bad.push_back(plaintext_with_header(pack([](auto& p) { p.pack(7); })));  // not an array
  bad.push_back(plaintext_with_header(pack([](auto& p) {                   // 3 elements
    p.pack_array(3);
    p.pack(1);
    p.pack(2);
    p.pack(3);
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // unknown type 0
    p.pack_array(4);
    p.pack(0);
    p.pack(2);
    p.pack(3);
    p.pack(std::string("m"));
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // unknown type 99
    p.pack_array(4);
    p.pack(99);
    p.pack(2);
    p.pack(3);
    p.pack(std::string("m"));
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // negative id
    p.pack_array(4);
    p.pack(1);
    p.pack(-2);
    p.pack(3);
    p.pack(std::string("m"));
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // text is a number
    p.pack_array(4);
    p.pack(1);
    p.pack(2);
    p.pack(3);
    p.pack(4);
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // nested array: depth limit
    p.pack_array(4);
    p.pack_array(1);
    p.pack_array(1);
    p.pack(1);
    p.pack(2);
    p.pack(3);
    p.pack(std::string("m"));
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // oversized text (limit 256)
    p.pack_array(4);
    p.pack(1);
    p.pack(2);
    p.pack(3);
    p.pack(std::string(300, 'a'));
  })));
  bad.push_back(plaintext_with_header(pack([](auto& p) {  // map where array expected
    p.pack_map(1);
    p.pack(1);
    p.pack(2);
  })));
  {
    auto h = valid;
    h.push_back(0xC0);  // trailing nil inside the declared header
    bad.push_back(plaintext_with_header(h));
  }
  {
    std::vector<std::uint8_t> h = {0xDD, 0xFF, 0xFF, 0xFF, 0xFF};  // array32 claiming 4G elements
    bad.push_back(plaintext_with_header(h));
  }
  for (std::size_t i = 0; i < bad.size(); ++i) {
    auto d = decode_plaintext(bad[i]);
    EXPECT_FALSE(d) << "case " << i;
    if (!d) {
      EXPECT_EQ(d.error(), make_error_code(errc::malformed)) << "case " << i;
    }
  }
}

TEST(Frame, UnpackBoundedEnforcesLimits) {
  auto arr = pack([](auto& p) {
    p.pack_array(100);
    for (int i = 0; i < 100; ++i) p.pack(i);
  });
  UnpackLimits lim;
  lim.array = 10;
  EXPECT_FALSE(unpack_bounded(arr, lim));
  lim.array = 100;
  EXPECT_TRUE(unpack_bounded(arr, lim));
  auto deep = pack([](auto& p) {
    for (int i = 0; i < 10; ++i) p.pack_array(1);
    p.pack(1);
  });
  lim.depth = 4;
  EXPECT_FALSE(unpack_bounded(deep, lim));
  auto bin = pack([](auto& p) {
    std::vector<char> v(1000, 1);
    p.pack_bin(1000);
    p.pack_bin_body(v.data(), 1000);
  });
  lim.bin = 999;
  EXPECT_FALSE(unpack_bounded(bin, lim));
  lim.bin = 1000;
  EXPECT_TRUE(unpack_bounded(bin, lim));
  EXPECT_FALSE(unpack_bounded(std::vector<std::uint8_t>{0x92, 0x01}, lim));  // truncated
}

}  // namespace
}  // namespace grove::transport
