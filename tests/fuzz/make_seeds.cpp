// Writes the seed corpora of the fuzz targets:
//   <out>/frame/      frame plaintexts of every type made by encode_frame, plus malformed variants
//                     and bare msgpack objects (the frame target also feeds unpack_bounded);
//   <out>/handshake/  M1, M2 and M3 of a real handshake and crafted variants of them;
//   <out>/dht/        [selector][DHT message] inputs (see dht_fuzz.hpp): every message type with
//                     signed records, reply-mode variants, invalid records, malformed messages;
//   <out>/gossip/     [selector][gossip message] inputs (see gossip_fuzz.hpp): what real ring and
//                     exchange peers send, control messages, malformed variants;
//   <out>/run_config/ run config texts: valid ones of every workload, outer mode, codec and data
//                     kind, and non-canonical, out-of-range and truncated variants;
//   <out>/checkpoint/ checkpoint files ("file-*", whole), file bodies without their hash
//                     ("body-*", which the target seals): valid, reordered, damaged, truncated;
//                     and outer states without their checksum ("outer-*");
//   <out>/status/     MemberStatus lists made by encode_status, and malformed variants.
// Usage: make_seeds tests/fuzz/corpus [NAME]...   (NAME: frame, handshake, dht, gossip, run_config,
// checkpoint or status; no names = all; the committed seeds were made this way; the handshake ones
// differ on every run since identities and ephemeral keys are random, the others are
// reproducible).
#include <sodium.h>

#include <algorithm>
#include <cmath>
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

#include "dht/membership.hpp"
#include "dht/messages.hpp"
#include "gossip/allgather.hpp"
#include "gossip/allreduce.hpp"
#include "gossip/exchange.hpp"
#include "gossip/matchmaking.hpp"
#include "gossip/progress.hpp"
#include "gossip/state_check.hpp"
#include "gossip/state_delta.hpp"
#include "gossip/state_sync.hpp"
#include "node/checkpoint.hpp"
#include "node/config.hpp"
#include "node/status.hpp"
#include "node/trainer_protocol.hpp"
#include "tests/fuzz/dht_fuzz.hpp"
#include "tests/fuzz/gossip_fuzz.hpp"
#include "transport/crypto.hpp"
#include "transport/frame.hpp"
#include "transport/handshake.hpp"
#include "transport/identity.hpp"
#include "transport/reach.hpp"
#include "transport/relay.hpp"

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

  // The reachability check's request and reply (the frame target decodes them too).
  put("reach_request.bin",
      encode_reach_request({{"192.0.2.7:7400", "[2001:db8::7]:7400", "10.0.0.2:7400"}}));
  put("relay_dialback.bin",
      encode_relay_dialback({NodeId{7, 7, 7}, {"192.0.2.7:7400", "[2001:db8::7]:7400"}}));
  put("reach_reply.bin", encode_reach_reply({"192.0.2.7:51234",
                                             {{"192.0.2.7:7400", ReachCode::ok},
                                              {"[2001:db8::7]:7400", ReachCode::timed_out},
                                              {"10.0.0.2:7400", ReachCode::not_checked}}}));

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

// ---- dht ----
namespace dz = grove::fuzz::dht_fuzz;
namespace dht = grove::dht;

dht::Message dht_message(dht::MsgType type, std::size_t peer, std::uint64_t txid) {
  dht::Message m;
  m.type = type;
  m.txid = txid;
  m.sender_address = dz::peer_address(peer);
  return m;
}

dht::Record signed_record(std::size_t owner, const dht::Key& key, std::string subkey,
                          std::uint64_t seq, std::size_t value_size,
                          dht::Time expires = dz::kEpoch + dz::kRecordTtl) {
  Buf value(value_size);
  for (std::size_t i = 0; i < value.size(); ++i)
    value[i] = static_cast<std::uint8_t>(i * 13 + owner);
  return dht::make_record(dz::peer_identity(owner), key, std::move(subkey), seq, expires,
                          std::move(value));
}

std::vector<dht::Contact> dht_contacts(std::size_t first, std::size_t n,
                                       std::size_t address_size = 0) {
  std::vector<dht::Contact> cs;
  for (std::size_t i = first; i < first + n; ++i) {
    std::string a = dz::peer_address(i);
    if (address_size > a.size()) a.append(address_size - a.size(), 'a');
    cs.push_back({dz::peer_identity(i).id(), std::move(a)});
  }
  return cs;
}

/// A DHT message hand-packed with msgpack (shapes dht::encode never produces).
template <class F>
Buf dht_custom(F&& pack) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> pk(b);
  pack(pk);
  return Buf(b.data(), b.data() + b.size());
}

void dht_seeds(const fs::path& dir) {
  const dht::WireLimits lim;
  auto put_raw = [&](const std::string& name, std::uint8_t sel, const Buf& msg) {
    Buf data{sel};
    data.insert(data.end(), msg.begin(), msg.end());
    const std::string verdict = "message: " + verdict_of(dht::decode(msg, lim).error());
    write(dir, name, data, verdict.c_str());
  };
  auto put = [&](const std::string& name, std::uint8_t sel, const dht::Message& m) {
    put_raw(name, sel, dht::encode(m));
  };
  // Bare encodings: the first byte doubles as the selector; decode() sees a whole message.
  auto put_bare = [&](const std::string& name, const dht::Message& m) {
    const Buf msg = dht::encode(m);
    write(dir, name, msg, ("whole input: " + verdict_of(dht::decode(msg, lim).error())).c_str());
  };
  using dht::MsgType;
  using dz::selector;
  const dht::Key key0 = dz::fuzz_key(0), key1 = dz::fuzz_key(1);
  const dht::Time expires = dz::kEpoch + dz::kRecordTtl;

  // Requests, from every fixed peer (each enters the node's routing table).
  for (std::size_t p = 0; p < dz::kPeers; ++p)
    put("ping_peer" + std::to_string(p) + ".bin", selector(p, false),
        dht_message(MsgType::ping, p, 100 + p));
  {
    auto m = dht_message(MsgType::find_node, 1, 201);
    m.target = dht::key_of("some target");
    put("find_node.bin", selector(1, false), m);
    m.target = dz::node_identity().id();
    put("find_node_self.bin", selector(2, false, 0), m);
  }
  {
    auto m = dht_message(MsgType::find_value, 2, 301);
    m.target = key0;
    put("find_value.bin", selector(2, false), m);
    m.cursor = dht::Cursor{dz::peer_identity(4).public_key(), "member/1"};
    put("find_value_cursor.bin", selector(2, false), m);
  }
  {
    auto m = dht_message(MsgType::store, 3, 401);
    m.records = {signed_record(4, key0, "", 1, 32), signed_record(5, key0, "member/1", 7, 100)};
    put("store.bin", selector(3, false), m);
    m.records.clear();
    for (std::size_t o = 4; o < 12; ++o)
      m.records.push_back(signed_record(o, key1, "member/" + std::to_string(o), o, 64));
    put("store_dictionary.bin", selector(0, false), m);
    m.records.clear();
    for (int i = 0; i < 16; ++i)
      m.records.push_back(signed_record(6, key0, "s" + std::to_string(i), 1, 512));
    put("store_max.bin", selector(1, false), m);
    m.records = {signed_record(7, key1, "big", 1, lim.record.max_value)};
    put("store_large_value.bin", selector(2, false), m);
    // Invalid records next to a valid one: expired, too far ahead, bad signature.
    m.records = {signed_record(8, key0, "expired", 1, 8, dz::kEpoch - dht::Time(1000)),
                 signed_record(8, key0, "future", 1, 8, dz::kEpoch + std::chrono::hours(48)),
                 signed_record(8, key0, "badsig", 1, 8), signed_record(8, key0, "ok", 1, 8)};
    m.records[2].sig[0] ^= 1;
    put("store_invalid.bin", selector(3, false), m);
    // A slot twice, newer first: the older one is stale (a replay).
    m.records = {signed_record(9, key0, "slot", 5, 8), signed_record(9, key0, "slot", 3, 8),
                 signed_record(9, key0, "slot", 5, 8)};
    put("store_replay.bin", selector(0, false), m);
  }

  // Replies (reply mode: the harness gives them the txid of a request the node sent).
  {
    auto m = dht_message(MsgType::pong, 0, 0);
    m.observed = "me:1";
    put("pong.bin", selector(0, true), m);
  }
  {
    auto m = dht_message(MsgType::nodes, 1, 0);
    m.contacts = dht_contacts(0, 20);
    put("nodes.bin", selector(1, true), m);
    m.contacts = dht_contacts(20, lim.max_contacts, lim.max_address);
    put("nodes_max.bin", selector(1, true, 1), m);
    // Ourselves and a contact without an address: both skipped by lookups.
    m.contacts = dht_contacts(40, 3);
    m.contacts.push_back({dz::node_identity().id(), dz::kSelfAddress});
    m.contacts.push_back({dz::peer_identity(43).id(), ""});
    put("nodes_self_and_no_address.bin", selector(2, true), m);
    m.contacts.clear();
    put("nodes_empty.bin", selector(3, true), m);
  }
  {
    auto m = dht_message(MsgType::value, 2, 0);
    m.records = {signed_record(4, key0, "", 2, 16), signed_record(10, key0, "member/10", 1, 40),
                 signed_record(11, key0, "member/11", 3, 8)};
    m.contacts = dht_contacts(50, 5);
    put("value.bin", selector(2, true), m);
    m.contacts.clear();
    m.cursor = dht::Cursor{dz::peer_identity(11).public_key(), "member/11"};
    put("value_page.bin", selector(2, true, 1), m);
    m.cursor.reset();
    m.records = {signed_record(4, key1, "", 2, 16), signed_record(5, key1, "x", 1, 16)};
    put("value_key1.bin", selector(3, true, 2), m);
    m.records = {signed_record(8, key0, "expired", 1, 8, dz::kEpoch - dht::Time(1000)),
                 signed_record(8, key0, "badsig", 1, 8)};
    m.records[1].sig[5] ^= 0x40;
    put("value_invalid.bin", selector(0, true), m);
    m.records.clear();
    m.contacts = dht_contacts(60, 8);
    put("value_contacts_only.bin", selector(1, true), m);
  }
  {
    auto m = dht_message(MsgType::stored, 3, 0);
    m.codes = {dht::StoreCode::stored};
    put("stored.bin", selector(3, true), m);
    m.codes = {dht::StoreCode::stored,    dht::StoreCode::updated, dht::StoreCode::unchanged,
               dht::StoreCode::stale,     dht::StoreCode::invalid, dht::StoreCode::over_quota,
               dht::StoreCode::unchanged, dht::StoreCode::stored};
    put("stored_all_codes.bin", selector(0, true), m);
    m.codes.clear();
    put("stored_empty.bin", selector(1, true), m);
  }
  {
    auto m = dht_message(MsgType::error, 0, 0);
    m.error = dht::ErrorCode::rate_limited;
    m.text = "rate limited";
    put("error.bin", selector(0, true), m);
    m.error = dht::ErrorCode::malformed;
    m.text = std::string(200, 'e');
    put("error_malformed.bin", selector(1, true), m);
  }
  // Reply mode without a message: the send of a pending request fails.
  write(dir, "send_failed.bin", Buf{selector(2, true)}, "-");
  // A reply outside reply mode: unexpected (no such request).
  put("unexpected_nodes.bin", selector(1, false), [&] {
    auto m = dht_message(MsgType::nodes, 1, 12345);
    m.contacts = dht_contacts(0, 4);
    return m;
  }());

  // Malformed messages.
  put_raw("bad_version.bin", selector(0, false), dht_custom([](auto& pk) {
            pk.pack_array(4);
            pk.pack(2);
            pk.pack(1);
            pk.pack(1);
            pk.pack(std::string("peer0:1"));
          }));
  put_raw("unknown_type.bin", selector(1, false), dht_custom([](auto& pk) {
            pk.pack_array(4);
            pk.pack(1);
            pk.pack(10);
            pk.pack(1);
            pk.pack(std::string("peer1:1"));
          }));
  put_raw("ping_extra_field.bin", selector(2, false), dht_custom([](auto& pk) {
            pk.pack_array(5);
            pk.pack(1);
            pk.pack(1);
            pk.pack(1);
            pk.pack(std::string("peer2:1"));
            pk.pack_nil();
          }));
  put_raw("contact_short_id.bin", selector(3, true), dht_custom([](auto& pk) {
            pk.pack_array(5);
            pk.pack(1);
            pk.pack(static_cast<int>(MsgType::nodes));
            pk.pack(1);
            pk.pack(std::string("peer3:1"));
            pk.pack_array(1);
            pk.pack_array(2);
            pk.pack_bin(31);
            pk.pack_bin_body(std::string(31, 'i').data(), 31);
            pk.pack(std::string("x:1"));
          }));
  put_raw("stored_bad_code.bin", selector(0, true), dht_custom([](auto& pk) {
            pk.pack_array(5);
            pk.pack(1);
            pk.pack(static_cast<int>(MsgType::stored));
            pk.pack(1);
            pk.pack(std::string("peer0:1"));
            pk.pack_bin(2);
            pk.pack_bin_body("\x00\x09", 2);
          }));
  {
    auto m = dht_message(MsgType::store, 0, 501);
    m.records = {signed_record(4, key0, "", 1, 32)};
    const Buf full = dht::encode(m);
    put_raw("store_truncated.bin", selector(0, false),
            Buf(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(full.size() / 2)));
    // Bare encodings (no selector byte) for the decoder's view of the whole input.
    put_bare("bare_store.bin", m);
    put_bare("bare_ping.bin", dht_message(MsgType::ping, 0, 7));
    auto v = dht_message(MsgType::value, 1, 8);
    v.records = {signed_record(5, key0, "member/1", 7, 24)};
    v.contacts = dht_contacts(0, 2);
    v.cursor = dht::Cursor{dz::peer_identity(5).public_key(), "member/1"};
    put_bare("bare_value.bin", v);
  }
}
}  // namespace

// ---- gossip ----
namespace gz = grove::fuzz::gossip_fuzz;

void gossip_seeds(const fs::path& dir) {
  namespace g = grove::gossip;
  int k = 0;
  auto put = [&](const std::string& name, std::uint8_t sel, std::span<const std::uint8_t> msg) {
    Buf b{sel};
    b.insert(b.end(), msg.begin(), msg.end());
    const auto r = g::decode_message(msg);
    write(dir, std::to_string(k++) + "-" + name, b, r ? "ok" : verdict_of(r.error()).c_str());
  };
  // What the other members of the fuzzed ring and pair really send to peer 1.
  g::AllReduceOptions ao;
  ao.chunk_values = gz::kChunk;
  for (int p : {0, 2}) {
    auto r_core =
        g::RingAllReduce::create(gz::op(), gz::peer(p), {gz::peer(0), gz::peer(1), gz::peer(2)},
                                 std::vector<float>(gz::kRingValues, 0.25f), ao, g::Time(0))
            .value();
    auto& r = *r_core;
    r.on_timer(g::Time(1500));  // a heartbeat too
    for (auto& o : r.take_outgoing())
      if (o.to == gz::peer(1))
        put("ring-from-" + std::to_string(p), static_cast<std::uint8_t>(p), o.data.span());
  }
  // ... and the other members of the fuzzed all-gathers (selector bit 4, bits 5-6 the codec).
  for (int c = 0; c < gz::kGathers; ++c) {
    g::AllGatherOptions go;
    go.codec = gz::gather_codec(c);
    go.piece_values = gz::kChunk;
    std::vector<float> in(gz::kRingValues);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;
    auto a = g::RingAllGather::create(gz::op(), gz::peer(0),
                                      {gz::peer(0), gz::peer(1), gz::peer(2)}, in, go, g::Time(0))
                 .value();
    for (auto& o : a->take_outgoing())
      if (o.to == gz::peer(1))
        put("gather" + std::to_string(c) + "-from-0", static_cast<std::uint8_t>(16 | (c << 5)),
            o.data.span());
  }
  g::ExchangeOptions eo;
  eo.codec = g::WireCodec::fp32;
  eo.chunk_values = gz::kChunk;
  auto e_core = g::GroupExchange::create(
                    gz::op(), gz::peer(0), {gz::peer(1), gz::peer(0)},
                    std::vector<std::vector<float>>{std::vector<float>(gz::kExchangeValues, 0.4f)},
                    eo, g::Time(0))
                    .value();
  auto& e = *e_core;
  for (auto& o : e.take_outgoing()) put("exchange", 4, o.data.span());
  // Control messages and malformed variants.
  g::Header h;
  h.op = gz::op();
  h.kind = g::MsgKind::abort;
  h.suspects = {gz::peer(2)};
  put("abort-peer2", 0, g::encode_message(h, 0).span());
  h.suspects = {gz::peer(1)};
  put("abort-self", 2, g::encode_message(h, 0).span());
  h.suspects.clear();
  h.kind = g::MsgKind::done;
  put("done", 0, g::encode_message(h, 0).span());
  // The step group's: a join, the sequencer's announcement and a welcome naming peer 1.
  h.kind = g::MsgKind::join;
  put("group-join", 2, g::encode_message(h, 0).span());
  h.kind = g::MsgKind::announce;
  h.count = 2;
  h.view = {gz::peer(0), gz::peer(1), gz::peer(2)};
  std::sort(h.view.begin(), h.view.end());
  put("group-announce", 0, g::encode_message(h, 0).span());
  h.kind = g::MsgKind::welcome;
  put("group-welcome", 0, g::encode_message(h, 0).span());
  h.view.clear();
  h.count = 0;
  h.kind = g::MsgKind::chunk;
  h.phase = g::Phase::all_gather;
  h.codec = g::WireCodec::fp16;
  h.index = 1;
  h.count = gz::kChunk;
  put("ag-zero", 0, g::encode_message(h, 2 * gz::kChunk).span());
  // DHT-record and state-sync inputs (selector bit 3).
  auto put_rec = [&](const std::string& name, const std::vector<std::uint8_t>& v) {
    Buf b{8};
    b.insert(b.end(), v.begin(), v.end());
    write(dir, std::to_string(k++) + "-" + name, b, "record");
  };
  put_rec("ready",
          g::encode_ready({{}, {"127.0.0.1:4000"}, "fuzz", 3, 99, true, false, {}, 4, true, true}));
  const g::StateSnapshot snap("fuzz", 1, std::vector<std::uint8_t>(1000, 7), 256);
  put_rec("offer", g::encode_offer(
                       {{}, "a:1", "fuzz", 1, 1000, snap.root(), {{1, 400, snap.root(), {}, {}}}}));
  put_rec("state-request", g::encode_state_request({snap.root(), 2}));
  put_rec("manifest", snap.manifest_bytes());
  put_rec("state-probe", g::encode_probe({1, 77, g::kProbeSamples}));
  put_rec("probe-answer", g::encode_probe_answer({1, {1, 2, 3}, 1, 250, {0.5f, -1.0f, 2.0f}}));
  grove::dht::MemberInfo member;
  member.addresses = {"192.0.2.1:7400", "[2001:db8::1]:7400"};
  member.run_id = "fuzz";
  member.status = "training";
  member.payload = g::encode_progress({3, {}});
  member.reach = grove::transport::Reachability::reachable;
  put_rec("member", grove::dht::encode_member(member));
  put_rec("progress", g::encode_progress({7, snap.root()}));
  {  // a real delta of 300 values (fp16), as a member keeps a DiLoCo round's mean Δ
    auto store = g::memory_blob_store();
    auto w = g::DeltaWriter::create(*store, g::WireCodec::fp16, 300).value();
    std::vector<float> d(300);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = 0.0625f * static_cast<float>(i % 7) - 0.125f;
    (void)w.write(0, d);
    auto blob = w.seal(2, snap.root(), snap.root()).value();
    std::vector<std::uint8_t> bytes(blob->size());
    (void)blob->read(0, bytes);
    put_rec("delta", bytes);
    // A streaming fragment's delta (version 2): values 100..250 of 300.
    auto ws = g::DeltaWriter::create(*store, g::WireCodec::fp16, 300, {100, 250}).value();
    (void)ws.write(0, std::span(d).first(150));
    auto sb = ws.seal(2, snap.root(), snap.root()).value();
    bytes.assign(sb->size(), 0);
    (void)sb->read(0, bytes);
    put_rec("delta-fragment", bytes);
  }
  auto bad = g::encode_message(h, 10);
  bad.data()[3] = 0xff;
  put("bad-version", 0, bad.span());
  put("short", 0, bad.span().first(5));
}

// ---- node ----
namespace {
namespace node = grove::node;

node::RunConfig mlp_config() {
  node::RunConfig c;
  c.workload = node::WorkloadKind::mlp;
  c.model = "tiny";
  c.seed = 7;
  c.nonce = "0123456789abcdef";
  c.inner_steps = 10;
  c.batch = 32;
  c.lr = 3e-3f;
  c.warmup = 0;
  c.schedule_steps = 1000;
  c.clip = 0;
  c.outer = node::OuterMode::diloco;
  c.codec = node::WireCodec::bf16;
  c.window_ms = 500;
  c.eval_every = 10;
  c.eval_batches = 1;
  return c;
}

void run_config_seeds(const fs::path& dir) {
  auto put = [&](const std::string& name, const std::string& text) {
    const auto r = node::parse_run_config(text);
    const bool ok = r.has_value();
    const std::string why = r.why();
    write(dir, name, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()},
          ok ? "ok" : why.c_str());
  };
  // Valid configs: the defaults, and one of each other value of every enumerated field.
  const node::RunConfig gpt;
  put("gpt-default.txt", gpt.to_text());
  node::RunConfig mlp = mlp_config();
  put("mlp-diloco-bf16.txt", mlp.to_text());
  node::RunConfig sparse = mlp;
  sparse.set_outer("sparseloco");
  sparse.topk = 32;
  sparse.topk_chunk = 1024;
  sparse.topk_bits = 2;
  sparse.error_decay = 0.9f;
  sparse.fragments = 5;  // (dividing mlp_config's 10 inner steps)
  put("mlp-sparseloco-2bit.txt", sparse.to_text());
  node::RunConfig files = gpt;
  files.model = "base";
  files.seed = 18446744073709551615ull;
  files.codec = node::WireCodec::e3m0;
  files.data = node::DataKind::files;
  files.lr = 1;
  files.lr_min_ratio = 0;
  files.beta2 = 0.999f;
  files.window_ms = 600000;
  put("gpt-files-e3m0.txt", files.to_text());
  mlp.codec = node::WireCodec::fp32;
  mlp.outer = node::OuterMode::noloco;
  mlp.noloco_gamma = 0;
  put("mlp-noloco-fp32.txt", mlp.to_text());

  // Malformed variants of the default text.
  const std::string t = gpt.to_text();
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string r = t;
    const auto at = r.find(from);
    if (at == std::string::npos) throw std::runtime_error("run_config seed: no '" + from + "'");
    return r.replace(at, from.size(), to);
  };
  put("no-final-newline.txt", t.substr(0, t.size() - 1));
  put("truncated.txt", t.substr(0, t.size() / 2));
  put("float-not-canonical.txt", replaced("\nclip 1\n", "\nclip 1.0\n"));
  put("leading-zero.txt", replaced("\nbatch 16\n", "\nbatch 016\n"));
  put("window-out-of-range.txt", replaced("\nwindow_ms 10000\n", "\nwindow_ms 100\n"));
  put("nonce-uppercase.txt", replaced("\nnonce 0000000000000000\n", "\nnonce 000000000000000A\n"));
  put("fields-swapped.txt", replaced("\nbeta1 0.899999976\nbeta2 0.949999988\n",
                                     "\nbeta2 0.949999988\nbeta1 0.899999976\n"));
  put("unknown-field.txt", t + "extra 1\n");
  put("other-magic.txt", replaced("grove-run v1\n", "grove-run v2\n"));
  put("crlf.txt", replaced("\nseed 1\n", "\nseed 1\r\n"));
  put("empty.txt", "");
  put("over-size-bound.txt", t + std::string(node::kMaxConfigText - t.size(), 'x') + "\n");
}

/// The sections of an encoded checkpoint file (each with its tag and length), in file order.
std::vector<Buf> checkpoint_sections(const Buf& file) {
  std::vector<Buf> out;
  for (std::size_t at = 8; at + 32 < file.size();) {
    std::uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | file[at + 4 + static_cast<std::size_t>(i)];
    const auto end = at + 12 + static_cast<std::size_t>(len);
    out.emplace_back(file.begin() + static_cast<std::ptrdiff_t>(at),
                     file.begin() + static_cast<std::ptrdiff_t>(end));
    at = end;
  }
  if (out.size() != 4) throw std::runtime_error("checkpoint seed: not four sections");
  return out;
}

void checkpoint_seeds(const fs::path& dir) {
  // A whole file as it lies on disk; a body is a file without its hash (the target appends it).
  auto put_file = [&](const std::string& name, const Buf& file) {
    const auto r = node::decode_checkpoint(file);
    const bool ok = r.has_value();
    const std::string why = r.why();
    write(dir, "file-" + name, file, ok ? "ok" : why.c_str());
  };
  auto put_body = [&](const std::string& name, const Buf& body) {
    Buf file = body;
    const auto h = grove::transport::blake2b_256(body);
    file.insert(file.end(), h.begin(), h.end());
    const auto r = node::decode_checkpoint(file);
    const bool ok = r.has_value();
    const std::string why = r.why();
    write(dir, "body-" + name, body, ok ? "ok (sealed)" : why.c_str());
  };
  auto body_of = [](const Buf& file) { return Buf(file.begin(), file.end() - 32); };

  node::Checkpoint c;
  c.config_text = mlp_config().to_text();
  c.step = 1234;
  c.round = 12;
  c.tokens = 1'000'000;
  c.outer.round = 12;
  c.outer.phi.assign(8, 0.0f);
  c.outer.momentum.assign(8, 0.0f);
  for (int i = 0; i < 8; ++i) {
    c.outer.phi[i] = 0.125f * static_cast<float>(i) - 0.5f;
    c.outer.momentum[i] = 0.01f * static_cast<float>(i);
  }
  for (int i = 0; i < 40; ++i) c.workload.push_back(static_cast<std::uint8_t>(i * 13));
  const Buf file = node::encode_checkpoint(c);
  put_file("mlp.bin", file);
  put_body("mlp.bin", body_of(file));

  node::Checkpoint sparse = c;
  sparse.outer.momentum.clear();
  sparse.outer.phi.assign(24, 0.75f);  // more values than the target's small max_values
  sparse.outer.error.assign(24, -0.25f);
  put_body("error-buffer.bin", body_of(node::encode_checkpoint(sparse)));
  node::Checkpoint nan = c;
  nan.outer.momentum[3] = NAN;  // a consistent outer checksum over a non-finite value
  put_body("outer-nan.bin", body_of(node::encode_checkpoint(nan)));
  // Outer states without their checksum (the target appends it).
  auto put_outer = [&](const std::string& name, const grove::optim::OuterState& o) {
    const auto full = grove::optim::serialize(o);
    const bool ok = grove::optim::deserialize(full).has_value();
    write(dir, "outer-" + name, std::span(full).first(full.size() - 8),
          ok ? "ok (checksummed)" : "bad outer state");
  };
  put_outer("mlp.bin", c.outer);
  put_outer("error-buffer.bin", sparse.outer);
  put_outer("nan.bin", nan.outer);
  const node::Checkpoint empty;
  put_body("empty.bin", body_of(node::encode_checkpoint(empty)));
  put_file("empty.bin", node::encode_checkpoint(empty));

  // Damaged and truncated files.
  put_file("truncated.bin", Buf(file.begin(), file.end() - 1));
  put_file("half.bin",
           Buf(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(file.size() / 2)));
  Buf flipped = file;
  flipped[file.size() / 2] ^= 0x10;
  put_file("flipped.bin", flipped);
  put_file("magic-only.bin", Buf(file.begin(), file.begin() + 8));

  // Bodies with their sections rearranged (a valid hash, so only the section parser decides).
  const auto sec = checkpoint_sections(file);
  const Buf magic(file.begin(), file.begin() + 8);
  auto body_with = [&](std::initializer_list<Buf> parts) {
    Buf b = magic;
    for (const auto& p : parts) b.insert(b.end(), p.begin(), p.end());
    return b;
  };
  put_body("reordered.bin", body_with({sec[3], sec[1], sec[0], sec[2]}));
  put_body("repeated-section.bin", body_with({sec[0], sec[1], sec[2], sec[3], sec[1]}));
  put_body("missing-section.bin", body_with({sec[0], sec[1], sec[2]}));
  Buf unknown = sec[3];
  unknown[0] ^= 0x20;
  put_body("unknown-tag.bin", body_with({sec[0], sec[1], sec[2], unknown}));
  Buf long_meta = sec[1];
  long_meta.push_back(0);
  long_meta[4] = static_cast<std::uint8_t>(long_meta.size() - 12);
  put_body("meta-25-bytes.bin", body_with({sec[0], long_meta, sec[2], sec[3]}));
  Buf bad_outer = sec[2];
  bad_outer[12 + 20] ^= 0x01;  // inside the outer state: its own checksum no longer matches
  put_body("outer-checksum.bin", body_with({sec[0], sec[1], bad_outer, sec[3]}));
  Buf past_end = sec[3];
  past_end[4] = 0xff;
  put_body("section-past-end.bin", body_with({sec[0], sec[1], sec[2], past_end}));
  put_body("section-header-cut.bin",
           body_with({sec[0], sec[1], sec[2], Buf(sec[3].begin(), sec[3].begin() + 7)}));
}

void status_seeds(const fs::path& dir) {
  auto put = [&](const std::string& name, const Buf& data) {
    const auto r = node::decode_status(data);
    const bool ok = r.has_value();
    const std::string why = r.why();
    write(dir, name, data, ok ? "ok" : why.c_str());
  };
  node::MemberStatus a;
  a.node = "0123456789abcdef";
  a.address = "192.0.2.7:4001";
  a.status = "training";
  a.run = "mlp-0123456789ab";
  a.step = 420;
  a.round = 42;
  a.loss = 0.0123;
  a.eval_loss = 0.0131;
  a.loss_floor = 0.01;
  a.tokens_per_s = 51234.5;
  a.last_sync_ms = 812;
  a.last_partner = "fedcba98";
  a.bytes_sent = 123456789;
  a.bytes_received = 987654321;
  a.round_s = 12.5;
  a.uptime_s = 3600;
  node::MemberStatus b;  // a member listed from its DHT record: most numbers absent
  b.node = "89abcdef01234567";
  b.address = "[2001:db8::1]:4001";
  b.status = "unreachable";
  b.run = a.run;
  b.reachable = false;
  node::MemberStatus c = a;
  c.node = std::string(256, 'n');
  c.address = std::string(256, 'a');
  c.status = "averaging";
  c.step = c.round = c.bytes_sent = c.bytes_received = 18446744073709551615ull;
  c.loss = -1e300;
  c.last_partner.clear();
  put("empty.bin", node::encode_status({}));
  put("one.bin", node::encode_status({a}));
  put("three.bin", node::encode_status({a, b, c}));

  // Malformed variants.
  const Buf one = node::encode_status({a});
  put("truncated.bin", Buf(one.begin(), one.end() - 3));
  put("not-a-list.bin", packed(std::map<std::string, int>{{"step", 1}}));
  put("short-entry.bin", packed(std::vector<std::vector<int>>{{1, 2, 3}}));
  put("bare-entry.bin", Buf(one.begin() + 1, one.end()));  // the member without its list
  // One member whose field `index` pack_value(packer, buffer) writes; the others are valid.
  auto with_field = [&](std::size_t index, auto&& pack_value) {
    msgpack::sbuffer sb;
    msgpack::packer<msgpack::sbuffer> pk(sb);
    pk.pack_array(1);
    pk.pack_array(17);
    for (std::size_t i = 0; i < 17; ++i) {
      if (i == index)
        pack_value(pk, sb);
      else if (i < 4 || i == 11)
        pk.pack(std::string("x"));
      else if (i == 16)
        pk.pack_true();
      else
        pk.pack_uint64(i);
    }
    return Buf(sb.data(), sb.data() + sb.size());
  };
  put("integer-loss.bin", with_field(6, [](auto& pk, auto&) { pk.pack_uint64(3); }));
  put("negative-step.bin", with_field(4, [](auto& pk, auto&) { pk.pack_int64(-1); }));
  put("infinite-loss.bin", with_field(7, [](auto& pk, auto&) { pk.pack_double(HUGE_VAL); }));
  put("float32-uptime.bin", with_field(15, [](auto& pk, auto&) { pk.pack_float(1.5f); }));
  put("long-string.bin", with_field(0, [](auto& pk, auto&) { pk.pack(std::string(257, 's')); }));
  put("bin-address.bin", with_field(1, [](auto& pk, auto&) {
        pk.pack_bin(3);
        pk.pack_bin_body("abc", 3);
      }));
  // Numbers a member may send and the node relays in its swarm_status answer (encode_status):
  // a whole negative float64, which msgpack-c packs as a negative integer, and 2^64 (as a float64
  // and as UINT64_MAX), which msgpack-c's pack_double would convert to uint64_t.
  const auto raw_f64 = [](msgpack::sbuffer& sb, double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    char b[9] = {static_cast<char>(0xcb)};
    for (int i = 0; i < 8; ++i) b[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
    sb.write(b, sizeof b);
  };
  put("float-minus-two.bin", with_field(14, [&](auto&, auto& sb) { raw_f64(sb, -2.0); }));
  put("float-two-to-64.bin", with_field(6, [&](auto&, auto& sb) { raw_f64(sb, 0x1p64); }));
  put("integer-loss-max.bin",
      with_field(9, [](auto& pk, auto&) { pk.pack_uint64(18446744073709551615ull); }));
  put("reachable-integer.bin", with_field(16, [](auto& pk, auto&) { pk.pack_uint64(1); }));
}
}  // namespace

void trainer_seeds(const fs::path& dir) {
  auto put = [&](const std::string& name, const Buf& data) {
    const auto r = node::decode_trainer_message(data);
    const bool ok = r.has_value();
    const std::string why = r.why();
    write(dir, name, data, ok ? "ok" : why.c_str());
  };
  node::TrainerHello h;
  h.version = node::kTrainerProtocol;
  h.model.tensors = {{"0.weight", {32, 8}, "float32"},
                     {"0.bias", {32}, "float32"},
                     {"2.weight", {1, 32}, "bfloat16"},
                     {"2.bias", {1}, "float16"}};
  h.outer = "noloco";
  h.inner_steps = 50;
  h.noloco_alpha = 0.5f;
  h.pid = 4242;
  put("hello.bin", node::encode_trainer_message(h));
  h.outer = "diloco";
  h.outer_lr = 0.7f;
  h.outer_momentum = 0.9f;
  h.noloco_alpha.reset();
  put("hello_diloco.bin", node::encode_trainer_message(h));
  {
    auto sl = h;
    sl.outer = "sparseloco";
    sl.topk = 64;
    sl.topk_chunk = 4096;
    sl.topk_bits = 2;
    sl.error_decay = 0.95f;
    put("hello_sparseloco.bin", node::encode_trainer_message(sl));
    sl.fragments = 4;
    put("hello_sparseloco_fragments.bin", node::encode_trainer_message(sl));
    sl.fragments = 0;
    sl.outer = "diloco";
    sl.codec = node::WireCodec::e3m0;
    put("hello_diloco_e3m0.bin", node::encode_trainer_message(sl));
  }
  h.model.tensors[0].dtype = "int64";
  put("hello_int_dtype.bin", node::encode_trainer_message(h));
  h.model.tensors[0].dtype = "float32";
  h.model.tensors[0].shape = {1ull << 20, 1ull << 20};  // 2^40 parameters: too many
  put("hello_too_big.bin", node::encode_trainer_message(h));
  node::TrainerStep st;
  st.loss = 0.125;
  st.tokens = 4096;
  put("step.bin", node::encode_trainer_message(st));
  put("step_nan.bin", node::encode_trainer_message(node::TrainerStep{}));
  put("stored.bin", node::encode_trainer_message(node::TrainerStored{}));
  put("saved.bin", node::encode_trainer_message(node::TrainerSaved{"disk full"}));
  node::TrainerCollective col;
  col.kind = node::CollectiveKind::all_reduce;
  col.mean = true;
  col.wire = node::WireCodec::fp16;
  col.n = 1000;
  put("collective_all_reduce.bin", node::encode_trainer_message(col));
  col = {};
  col.kind = node::CollectiveKind::recv;
  col.peer = 2;
  col.n = 64;
  col.timeout_s = 5;
  put("collective_recv.bin", node::encode_trainer_message(col));
  put("buffer.bin", node::encode_trainer_message(node::TrainerBuffer{1u << 20}));
  // What the node sends is not a trainer message: rejected.
  put("go.bin", node::encode_go(true));
  put("welcome.bin", node::encode_welcome("/grove-0123456789abcdef", 4096, "external-0123456789ab",
                                          node::RunConfig{}, "/var/lib/grove/trainer.state"));
}

int main(int argc, char** argv) {
  const std::map<std::string, void (*)(const fs::path&)> corpora{
      {"frame", frame_seeds},   {"handshake", handshake_seeds},   {"dht", dht_seeds},
      {"gossip", gossip_seeds}, {"run_config", run_config_seeds}, {"checkpoint", checkpoint_seeds},
      {"status", status_seeds}, {"trainer", trainer_seeds}};
  std::vector<std::string> names(argv + std::min(argc, 2), argv + argc);
  bool known = argc >= 2;
  for (const auto& n : names) known = known && corpora.count(n);
  if (!known) {
    std::fprintf(stderr,
                 "usage: %s OUT_DIR [frame|handshake|dht|gossip|run_config|checkpoint|status]...   "
                 "(e.g. tests/fuzz/corpus)\n",
                 argv[0]);
    return 2;
  }
  if (names.empty())
    for (const auto& [n, fn] : corpora) names.push_back(n);
  try {
    const fs::path out(argv[1]);
    for (const auto& n : names) {
      fs::create_directories(out / n);
      corpora.at(n)(out / n);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
