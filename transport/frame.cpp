#include "transport/frame.hpp"

#include <cstring>

namespace grove::transport {
namespace {
const UnpackLimits kHeaderLimits{/*array=*/4, /*map=*/0,  /*str=*/kMaxHeaderText,
                                 /*bin=*/0,
                                 /*ext=*/0,   /*depth=*/2};
}

Frame encode_frame(const FrameHeader& h, std::size_t payload_size,
                   std::span<std::uint8_t>* payload) {
  msgpack::sbuffer hb(64);
  msgpack::packer<msgpack::sbuffer> pk(hb);
  pk.pack_array(4);
  pk.pack(static_cast<std::uint8_t>(h.type));
  pk.pack(h.id);
  pk.pack(h.arg);
  const std::string_view text =
      std::string_view(h.text).substr(0, std::min(h.text.size(), kMaxHeaderText));
  pk.pack_str(static_cast<std::uint32_t>(text.size()));
  pk.pack_str_body(text.data(), static_cast<std::uint32_t>(text.size()));

  Frame f{Bytes(kRecordOverhead + 2 + hb.size() + payload_size)};
  std::uint8_t* p = f.buf.data() + kRecordHeader;
  p[0] = static_cast<std::uint8_t>(hb.size() >> 8);
  p[1] = static_cast<std::uint8_t>(hb.size());
  std::memcpy(p + 2, hb.data(), hb.size());
  if (payload) *payload = {p + 2 + hb.size(), payload_size};
  return f;
}

Frame encode_frame(const FrameHeader& h, std::span<const std::uint8_t> payload) {
  std::span<std::uint8_t> dst;
  Frame f = encode_frame(h, payload.size(), &dst);
  if (!payload.empty()) std::memcpy(dst.data(), payload.data(), payload.size());
  return f;
}

Result<msgpack::object_handle> unpack_bounded(std::span<const std::uint8_t> data,
                                              const UnpackLimits& limits) {
  try {
    std::size_t off = 0;
    msgpack::object_handle oh =
        msgpack::unpack(reinterpret_cast<const char*>(data.data()), data.size(), off, nullptr,
                        nullptr, limits.to_msgpack());
    if (off != data.size()) return errc::malformed;  // trailing bytes
    return oh;
  } catch (const std::exception&) {
    // msgpack-c reports every malformed or over-limit input as an exception; contain it here.
    return errc::malformed;
  }
}

Result<DecodedFrame> decode_plaintext(std::span<const std::uint8_t> pt) {
  if (pt.size() < 2) return errc::malformed;
  const std::size_t hlen = (std::size_t{pt[0]} << 8) | pt[1];
  if (hlen == 0 || hlen > kMaxHeaderSize || hlen > pt.size() - 2) return errc::malformed;
  auto oh = unpack_bounded(pt.subspan(2, hlen), kHeaderLimits);
  if (!oh) return oh.error();
  const msgpack::object& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 4) return errc::malformed;
  const msgpack::object* a = o.via.array.ptr;
  for (int i = 0; i < 3; ++i)
    if (a[i].type != msgpack::type::POSITIVE_INTEGER) return errc::malformed;
  if (a[3].type != msgpack::type::STR) return errc::malformed;
  const std::uint64_t type = a[0].via.u64;
  if (type == 0 || type > kMaxFrameType) return errc::malformed;
  DecodedFrame d;
  d.header.type = static_cast<FrameType>(type);
  d.header.id = a[1].via.u64;
  d.header.arg = a[2].via.u64;
  d.header.text.assign(a[3].via.str.ptr, a[3].via.str.size);
  d.payload_offset = 2 + hlen;
  d.payload_size = pt.size() - 2 - hlen;
  return d;
}

Result<DecodedFrame> decode_frame(const Frame& f) {
  if (f.buf.size() < kRecordOverhead) return errc::malformed;
  auto d = decode_plaintext(f.plaintext());
  if (d) d->payload_offset += kRecordHeader;
  return d;
}

}  // namespace grove::transport
