#include "gossip/wire.hpp"

#include <cstring>
#include <msgpack.hpp>

#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

namespace grove::gossip {

using optim::CodecError;
using transport::errc;

const char* to_string(WireCodec c) {
  switch (c) {
    case WireCodec::fp32:
      return "fp32";
    case WireCodec::fp16:
      return "fp16";
    case WireCodec::bf16:
      return "bf16";
    case WireCodec::e3m0:
      return "e3m0";
    case WireCodec::topk:
      return "topk";
  }
  return "?";
}

std::optional<WireCodec> parse_codec(std::string_view s) {
  for (auto c : {WireCodec::fp32, WireCodec::fp16, WireCodec::bf16, WireCodec::e3m0})
    if (s == to_string(c)) return c;
  return std::nullopt;
}

const char* to_string(MsgKind k) {
  switch (k) {
    case MsgKind::chunk:
      return "chunk";
    case MsgKind::tensor_begin:
      return "tensor_begin";
    case MsgKind::heartbeat:
      return "heartbeat";
    case MsgKind::done:
      return "done";
    case MsgKind::abort:
      return "abort";
    case MsgKind::tensor_end:
      return "tensor_end";
    case MsgKind::join:
      return "join";
    case MsgKind::announce:
      return "announce";
    case MsgKind::welcome:
      return "welcome";
  }
  return "?";
}

std::size_t encoded_size(WireCodec c, std::size_t values) {
  switch (c) {
    case WireCodec::fp32:
      return 4 * values;
    case WireCodec::fp16:
      return optim::fp16_encoded_size(values);
    case WireCodec::bf16:
      return optim::bf16_encoded_size(values);
    case WireCodec::e3m0:
      return optim::e3m0_encoded_size(values);
    case WireCodec::topk:
      break;
  }
  return 0;
}

CodecError encode_values(WireCodec c, std::span<const float> in, std::span<std::uint8_t> out) {
  switch (c) {
    case WireCodec::fp32:
      if (out.size() != 4 * in.size()) return CodecError::size_mismatch;
      if (!optim::all_finite(in)) return CodecError::not_finite;
      if (!in.empty()) std::memcpy(out.data(), in.data(), out.size());  // little-endian hosts
      return CodecError::ok;
    case WireCodec::fp16:
      return optim::fp16_encode(in, out);
    case WireCodec::bf16:
      return optim::bf16_encode(in, out);
    case WireCodec::e3m0:
      return optim::e3m0_encode(in, out);
    case WireCodec::topk:
      break;
  }
  return CodecError::malformed;
}

CodecError decode_values(WireCodec c, std::span<const std::uint8_t> in, std::span<float> out) {
  switch (c) {
    case WireCodec::fp32:
      if (in.size() != 4 * out.size()) return CodecError::size_mismatch;
      if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
      return optim::all_finite(out) ? CodecError::ok : CodecError::not_finite;
    case WireCodec::fp16:
      return optim::fp16_decode(in, out);
    case WireCodec::bf16:
      return optim::bf16_decode(in, out);
    case WireCodec::e3m0:
      return optim::e3m0_decode(in, out);
    case WireCodec::topk:
      break;
  }
  return CodecError::malformed;
}

namespace {
constexpr std::uint8_t kVersion = 2;  // 2: the digest travels in tensor_end, after the chunks

using transport::mp::get_fixed;
using transport::mp::get_u64;
using transport::mp::pack_bin;
}  // namespace

Bytes encode_message(const Header& h, std::size_t payload_size, std::span<std::uint8_t>* payload) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(10);
  pk.pack(kVersion);
  pk.pack(static_cast<std::uint8_t>(h.kind));
  pack_bin(pk, h.op);
  pk.pack(h.tag);
  pk.pack(static_cast<std::uint8_t>(h.phase));
  pk.pack(h.index);
  pk.pack(h.chunk);
  pk.pack(h.count);
  pk.pack(static_cast<std::uint8_t>(h.codec));
  if (h.kind == MsgKind::tensor_end) {
    pack_bin(pk, h.digest);
  } else if (h.kind == MsgKind::abort || h.kind == MsgKind::announce ||
             h.kind == MsgKind::welcome) {
    const auto& ids = h.kind == MsgKind::abort ? h.suspects : h.view;
    pk.pack_array(static_cast<std::uint32_t>(ids.size()));
    for (const auto& id : ids) pack_bin(pk, id);
  } else {
    pk.pack_nil();
  }
  Bytes out(2 + sb.size() + payload_size);
  out.data()[0] = static_cast<std::uint8_t>(sb.size() >> 8);
  out.data()[1] = static_cast<std::uint8_t>(sb.size());
  std::memcpy(out.data() + 2, sb.data(), sb.size());
  if (payload) *payload = std::span(out.data() + 2 + sb.size(), payload_size);
  return out;
}

transport::Result<Message> decode_message(std::span<const std::uint8_t> bytes,
                                          const WireLimits& limits) {
  if (bytes.size() < 2) return errc::malformed;
  const std::size_t hlen = (std::size_t{bytes[0]} << 8) | bytes[1];
  if (hlen == 0 || 2 + hlen > bytes.size()) return errc::malformed;
  transport::UnpackLimits ul{.array = std::max<std::size_t>(10, limits.max_suspects),
                             .map = 0,
                             .str = 0,
                             .bin = 32,
                             .ext = 0,
                             .depth = 2};
  auto oh = transport::unpack_bounded(bytes.subspan(2, hlen), ul);
  if (!oh) return oh.error();
  const msgpack::object& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 10) return errc::malformed;
  const msgpack::object* a = o.via.array.ptr;
  std::uint64_t version = 0, kind = 0, tag = 0, phase = 0, index = 0, chunk = 0, count = 0,
                codec = 0;
  if (!get_u64(a[0], version) || !get_u64(a[1], kind) || !get_u64(a[3], tag) ||
      !get_u64(a[4], phase) || !get_u64(a[5], index) || !get_u64(a[6], chunk) ||
      !get_u64(a[7], count) || !get_u64(a[8], codec))
    return errc::malformed;
  if (version != kVersion) return errc::malformed;
  if (kind < 1 || kind > 9 || phase > 2 || codec > 4 || index > UINT32_MAX || chunk > UINT32_MAX ||
      count > limits.max_values)
    return errc::malformed;
  Message m;
  m.h.kind = static_cast<MsgKind>(kind);
  if (!get_fixed(a[2], m.h.op)) return errc::malformed;
  m.h.tag = tag;
  m.h.phase = static_cast<Phase>(phase);
  m.h.index = static_cast<std::uint32_t>(index);
  m.h.chunk = static_cast<std::uint32_t>(chunk);
  m.h.count = count;
  m.h.codec = static_cast<WireCodec>(codec);
  const msgpack::object& extra = a[9];
  if (m.h.kind == MsgKind::tensor_end) {
    if (!get_fixed(extra, m.h.digest)) return errc::malformed;
  } else if (m.h.kind == MsgKind::abort || m.h.kind == MsgKind::announce ||
             m.h.kind == MsgKind::welcome) {
    if (extra.type != msgpack::type::ARRAY || extra.via.array.size > limits.max_suspects)
      return errc::malformed;
    auto& ids = m.h.kind == MsgKind::abort ? m.h.suspects : m.h.view;
    for (std::uint32_t i = 0; i < extra.via.array.size; ++i) {
      NodeId id;
      if (!get_fixed(extra.via.array.ptr[i], id)) return errc::malformed;
      ids.push_back(id);
    }
  } else if (extra.type != msgpack::type::NIL) {
    return errc::malformed;
  }
  m.payload = bytes.subspan(2 + hlen);
  if (m.payload.size() > limits.max_payload) return errc::frame_too_large;
  if (m.h.kind != MsgKind::chunk && !m.payload.empty()) return errc::malformed;
  return m;
}

}  // namespace grove::gossip
