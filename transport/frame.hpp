// Frames: the unit every Link carries.
//
// Memory layout of a Frame buffer (identical on every Link so that nothing is copied):
//   [4: record length, big-endian][2: header length, big-endian][msgpack header][payload][16: tag]
// The record length and the tag belong to the secure channel (tcp_link.cpp): the length is
// sent in clear and authenticated as associated data; everything between it and the tag is
// encrypted in place. An in-memory link hands the same buffer over untouched.
//
// The header is a msgpack array [type, id, arg, text] decoded with explicit unpack_limit
// values; the payload is raw bytes (tensors are never encoded per float).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <msgpack.hpp>

#include "transport/bytes.hpp"
#include "transport/crypto.hpp"
#include "transport/error.hpp"

namespace grove::transport {

constexpr std::size_t kRecordHeader = 4;
constexpr std::size_t kRecordOverhead = kRecordHeader + kTagSize;
constexpr std::size_t kMaxHeaderSize = 1024;
constexpr std::size_t kMaxHeaderText = 256;

enum class FrameType : std::uint8_t {
  request = 1,        // id = request id, arg = deadline in ms, text = method; payload = body
  response = 2,       // id = request id, arg = status (0 ok, else errc), text = error message
  message = 3,        // one-way; text = method; payload = body
  cancel = 4,         // id = request id
  stream_open = 5,    // id = stream id, arg = total bytes, text = kind; payload = metadata
  stream_data = 6,    // id = stream id, arg = offset; payload = chunk
  stream_credit = 7,  // id = stream id, arg = additional bytes the sender may send
  stream_reset = 8,   // id = stream id, arg = errc, text = reason (either side aborts)
  stream_done = 9,    // id = stream id: receiver has every byte (completes the sender)
  ping = 10,          // id = nonce
  pong = 11,          // id = nonce
  goodbye = 12,       // arg = errc (0: normal close), text = reason
};
constexpr std::uint8_t kMaxFrameType = 12;

struct FrameHeader {
  FrameType type = FrameType::ping;
  std::uint64_t id = 0;
  std::uint64_t arg = 0;
  std::string text;
};

/// A frame buffer in the layout above. The plaintext lies between the record prefix and the tag.
struct Frame {
  Bytes buf;
  std::span<std::uint8_t> plaintext() {
    return buf.span().subspan(kRecordHeader, buf.size() - kRecordOverhead);
  }
  std::span<const std::uint8_t> plaintext() const {
    return buf.span().subspan(kRecordHeader, buf.size() - kRecordOverhead);
  }
  std::size_t wire_size() const { return buf.size(); }
};

/// Builds a frame with room for `payload_size` payload bytes; `payload` receives that region.
Frame encode_frame(const FrameHeader& h, std::size_t payload_size,
                   std::span<std::uint8_t>* payload = nullptr);
/// Convenience: a frame with a copied payload.
Frame encode_frame(const FrameHeader& h, std::span<const std::uint8_t> payload);

struct DecodedFrame {
  FrameHeader header;
  std::size_t payload_offset = 0;  ///< into the Frame buffer
  std::size_t payload_size = 0;
};
/// Decodes the plaintext of a frame. Never throws; errc::malformed on anything out of bounds.
Result<DecodedFrame> decode_frame(const Frame& f);
/// The same on a bare plaintext span (fuzzing); payload_offset is relative to `plaintext`.
Result<DecodedFrame> decode_plaintext(std::span<const std::uint8_t> plaintext);

/// Limits for msgpack decoding of untrusted bytes: every decode names them explicitly.
struct UnpackLimits {
  std::size_t array = 64;
  std::size_t map = 64;
  std::size_t str = 4096;
  std::size_t bin = 64 * 1024;
  std::size_t ext = 0;
  std::size_t depth = 4;
  msgpack::unpack_limit to_msgpack() const {
    return msgpack::unpack_limit(array, map, str, bin, ext, depth);
  }
};
/// Unpacks one msgpack object that must span all of `data`; errc::malformed otherwise.
Result<msgpack::object_handle> unpack_bounded(std::span<const std::uint8_t> data,
                                              const UnpackLimits& limits);

}  // namespace grove::transport
