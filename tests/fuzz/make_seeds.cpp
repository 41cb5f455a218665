// Writes the seed corpora of the fuzz targets:
//   <out>/frame/      frame plaintexts of every type made by encode_frame, plus malformed variants
//                     and bare msgpack objects (the frame target also feeds unpack_bounded);
//   <out>/handshake/  M1, M2 and M3 of a real handshake and crafted variants of them.
// Usage: make_seeds tests/fuzz/corpus   (the committed seeds were made this way; the handshake
// ones differ on every run since identities and ephemeral keys are random).
#include <sodium.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "transport/frame.hpp"
#include "transport/handshake.hpp"
#include "transport/identity.hpp"

namespace {
namespace fs = std::filesystem;
using namespace grove::transport;
using Buf = std::vector<std::uint8_t>;

// Writes one seed and says how the target's first decoder treats it (frame: decode_plaintext,
// handshake: a fresh responder's M1), so that a seed meant to be valid visibly is.
void write(const fs::path& dir, const std::string& name, std::span<const std::uint8_t> data,
           const char* verdict) {
  const fs::path p = dir / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
  std::printf("%-50s %5zu bytes  %s\n", p.c_str(), data.size(), verdict);
}

std::string verdict_of(std::error_code ec) {
  return ec ? ec.message() : "ok";
}

Buf plaintext_of(const FrameHeader& h, std::span<const std::uint8_t> payload = {}) {
  Frame f = encode_frame(h, payload);
  auto pt = f.plaintext();
  return Buf(pt.begin(), pt.end());
}

Buf bytes_of(const std::string& s) {
  return Buf(s.begin(), s.end());
}

/// A plaintext with a hand-packed msgpack header (for shapes encode_frame never produces).
template <class F>
Buf custom_header(F&& pack_header, std::span<const std::uint8_t> payload = {}) {
  msgpack::sbuffer hb;
  msgpack::packer<msgpack::sbuffer> pk(hb);
  pack_header(pk);
  Buf out{static_cast<std::uint8_t>(hb.size() >> 8), static_cast<std::uint8_t>(hb.size())};
  out.insert(out.end(), hb.data(), hb.data() + hb.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

template <class T>
Buf packed(const T& v) {
  msgpack::sbuffer b;
  msgpack::pack(b, v);
  return Buf(b.data(), b.data() + b.size());
}

void frame_seeds(const fs::path& dir) {
  auto put = [&](const std::string& name, std::span<const std::uint8_t> data) {
    write(dir, name, data, verdict_of(decode_plaintext(data).error()).c_str());
  };
  Buf body(200);
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<std::uint8_t>(i * 7);
  Buf chunk(1024);
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<std::uint8_t>(i);

  // One valid frame of every type, with the fields the type uses.
  put("request.bin", plaintext_of({FrameType::request, 1, 5000, "dht.find_node"}, body));
  put("response_ok.bin", plaintext_of({FrameType::response, 1, 0, ""}, body));
  put("response_err.bin", plaintext_of({FrameType::response, 7, 12, "remote handler failed"}));
  put("message.bin", plaintext_of({FrameType::message, 0, 0, "gossip.ready"}, body));
  put("cancel.bin", plaintext_of({FrameType::cancel, 42, 0, ""}));
  put("stream_open.bin",
      plaintext_of({FrameType::stream_open, 3, 1ull << 33, "tensor"}, bytes_of("f32:4096")));
  put("stream_data.bin", plaintext_of({FrameType::stream_data, 3, 65536, ""}, chunk));
  put("stream_credit.bin", plaintext_of({FrameType::stream_credit, 3, 1u << 20, ""}));
  put("stream_reset.bin", plaintext_of({FrameType::stream_reset, 3, 17, "source failed"}));
  put("stream_done.bin", plaintext_of({FrameType::stream_done, 3, 0, ""}));
  put("ping.bin", plaintext_of({FrameType::ping, 0xdeadbeefcafef00dull, 0, ""}));
  put("pong.bin", plaintext_of({FrameType::pong, 0xdeadbeefcafef00dull, 0, ""}));
  put("goodbye.bin", plaintext_of({FrameType::goodbye, 0, 0, "shutting down"}));
  put("max_text.bin", plaintext_of({FrameType::message, 0, 0, std::string(kMaxHeaderText, 'm')}));

  // Malformed variants.
  const Buf req = plaintext_of({FrameType::request, 9, 100, "rpc.method"}, bytes_of("payload"));
  put("truncated_header.bin", std::span(req).first(8));
  put("truncated_length.bin", std::span(req).first(1));
  Buf zero_len = req;
  zero_len[0] = zero_len[1] = 0;
  put("zero_header_length.bin", zero_len);
  Buf long_len = req;
  long_len[0] = 0x04;
  long_len[1] = 0x01;  // 1025 > kMaxHeaderSize
  put("header_length_over_max.bin", long_len);
  Buf past_end = req;
  past_end[1] = static_cast<std::uint8_t>(req.size());  // header runs past the end
  put("header_past_end.bin", past_end);
  put("type_zero.bin", custom_header([](auto& pk) {
        pk.pack_array(4);
        pk.pack(0);
        pk.pack(1);
        pk.pack(2);
        pk.pack(std::string("x"));
      }));
  put("type_too_big.bin", custom_header([](auto& pk) {
        pk.pack_array(4);
        pk.pack(kMaxFrameType + 1);
        pk.pack(1);
        pk.pack(2);
        pk.pack(std::string("x"));
      }));
  put("five_fields.bin", custom_header([](auto& pk) {
        pk.pack_array(5);
        for (int i = 0; i < 4; ++i) pk.pack(3);
        pk.pack(std::string("x"));
      }));
  put("text_as_bin.bin", custom_header([](auto& pk) {
        pk.pack_array(4);
        pk.pack(3);
        pk.pack(0);
        pk.pack(0);
        pk.pack_bin(3);
        pk.pack_bin_body("abc", 3);
      }));
  put("negative_id.bin", custom_header([](auto& pk) {
        pk.pack_array(4);
        pk.pack(1);
        pk.pack(-1);
        pk.pack(0);
        pk.pack(std::string("m"));
      }));
  put("text_over_max.bin", custom_header([](auto& pk) {
        pk.pack_array(4);
        pk.pack(3);
        pk.pack(0);
        pk.pack(0);
        pk.pack(std::string(kMaxHeaderText + 1, 't'));
      }));
  // Valid but not what encode_frame writes: fixed-width encodings of small numbers.
  put("wide_ints.bin", custom_header(
                           [](auto& pk) {
                             pk.pack_array(4);
                             pk.pack_fix_uint64(2);
                             pk.pack_fix_uint32(5);
                             pk.pack_fix_uint16(0);
                             pk.pack_str(0);
                           },
                           bytes_of("body")));
  put("nested_header.bin", custom_header([](auto& pk) {
        pk.pack_array(4);
        pk.pack_array(1);
        pk.pack_array(1);
        pk.pack(1);
        pk.pack(0);
        pk.pack(0);
        pk.pack(std::string(""));
      }));

  // Bare msgpack objects for the unpack_bounded interpretation of the input.
  put("mp_map.bin", packed(std::map<std::string, int>{{"round", 3}, {"step", 500}}));
  put("mp_nested.bin", packed(std::vector<std::vector<std::vector<int>>>{{{1, 2}, {3}}, {{4}}}));
  put("mp_floats.bin", packed(std::vector<double>{0.5, -1e300, 3.25}));
  msgpack::sbuffer bin;
  msgpack::packer<msgpack::sbuffer>(bin).pack_bin(16).pack_bin_body("0123456789abcdef", 16);
  put("mp_bin.bin", Buf(bin.data(), bin.data() + bin.size()));
}

/// An M1 with a correct open-swarm MAC over arbitrary fields: reaches the responder's checks
/// behind the MAC (suite negotiation, low-order ephemeral keys) that a fuzzer cannot forge.
Buf m1_with(std::uint8_t version, std::uint8_t suites, const std::uint8_t* eph) {
  Buf m(kM1Size, 0);
  std::memcpy(m.data(), "GRV1", 4);
  m[4] = version;
  m[5] = suites;
  std::memcpy(m.data() + 6, eph, 32);
  const std::string open = "grove-open-swarm-v1", label = "grove-m1-v1";
  const Hash256 psk = blake2b_256(bytes_of(open));
  crypto_generichash_state st;
  crypto_generichash_init(&st, psk.data(), psk.size(), 32);
  crypto_generichash_update(&st, reinterpret_cast<const std::uint8_t*>(label.data()), label.size());
  crypto_generichash_update(&st, m.data(), 38);
  crypto_generichash_final(&st, m.data() + 38, 32);
  return m;
}

void handshake_seeds(const fs::path& dir) {
  const Identity id_i = Identity::generate();
  const Identity id_r = Identity::generate();
  HandshakeConfig ci, cr;
  ci.self = &id_i;
  cr.self = &id_r;
  Handshake i(Handshake::Role::initiator, ci);
  Handshake r(Handshake::Role::responder, cr);
  const Buf m1 = i.start();
  auto m2 = r.on_message(m1);
  if (!m2) throw std::runtime_error("responder rejected M1: " + m2.error().message());
  auto m3 = i.on_message(m2->reply);
  if (!m3 || !m3->done) throw std::runtime_error("initiator rejected M2");
  auto fin = r.on_message(m3->reply);
  if (!fin || !fin->done) throw std::runtime_error("responder rejected M3");

  // M1 variants are judged by a fresh responder; M2/M3 ones need the keys of a past handshake.
  auto put = [&](const std::string& name, std::span<const std::uint8_t> data) {
    std::string verdict = "-";
    if (name.starts_with("m1")) {
      Handshake fresh(Handshake::Role::responder, cr);
      verdict = "as M1: " + verdict_of(fresh.on_message(data).error());
    }
    write(dir, name, data, verdict.c_str());
  };
  put("m1.bin", m1);
  put("m2.bin", m2->reply);
  put("m3.bin", m3->reply);
  Buf m1m3 = m1;
  m1m3.insert(m1m3.end(), m3->reply.begin(), m3->reply.end());
  put("m1_then_m3.bin", m1m3);

  const std::uint8_t both = static_cast<std::uint8_t>((1u << 1) | (1u << 2));
  put("m1_aes_only.bin", m1_with(1, 1u << 1, m1.data() + 6));
  put("m1_xchacha_only.bin", m1_with(1, 1u << 2, m1.data() + 6));
  put("m1_no_common_suite.bin", m1_with(1, 1u << 5, m1.data() + 6));
  put("m1_version_2.bin", m1_with(2, both, m1.data() + 6));
  const std::uint8_t zero_point[32] = {};
  put("m1_low_order_point.bin", m1_with(1, both, zero_point));
  Buf bad_mac = m1;
  bad_mac[69] ^= 1;
  put("m1_bad_mac.bin", bad_mac);
  Buf bad_magic = m1;
  bad_magic[3] = '2';
  put("m1_bad_magic.bin", bad_magic);
  put("m1_truncated.bin", std::span(m1).first(kM1Size - 1));

  Buf m2_suite = m2->reply;
  m2_suite[32] = 3;
  put("m2_bad_suite.bin", m2_suite);
  Buf m2_low = m2->reply;
  std::memset(m2_low.data(), 0, 32);
  put("m2_low_order_point.bin", m2_low);
  put("m2_truncated.bin", std::span(m2->reply).first(kM2Size - 1));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR   (e.g. tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out(argv[1]);
    fs::create_directories(out / "frame");
    fs::create_directories(out / "handshake");
    frame_seeds(out / "frame");
    handshake_seeds(out / "handshake");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
