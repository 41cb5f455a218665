// Small msgpack helpers shared by every wire codec above the transport (dht messages and
// records, gossip messages, ready / mode / state-sync records). Packing writes exactly what is
// given; each get_* checks the object's type and bound and never throws. Decode with
// unpack_bounded (transport/frame.hpp) first.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <msgpack.hpp>

namespace grove::transport::mp {

using Packer = msgpack::packer<msgpack::sbuffer>;
using Obj = msgpack::object;

inline void pack_bin(Packer& p, std::span<const std::uint8_t> b) {
  p.pack_bin(static_cast<std::uint32_t>(b.size()));
  p.pack_bin_body(reinterpret_cast<const char*>(b.data()), static_cast<std::uint32_t>(b.size()));
}
inline void pack_str(Packer& p, const std::string& s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}
/// Always a float64, whatever the value (msgpack-c's pack_double writes whole numbers as integers
/// and converts 2^64 to uint64_t, which is undefined).
inline void pack_f64(Packer& p, double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, 8);
  char b[9] = {static_cast<char>(0xcb)};
  for (int i = 0; i < 8; ++i) b[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
  p.pack_bin_body(b, sizeof b);  // appends the bytes as they are
}
inline std::vector<std::uint8_t> bytes_of(const msgpack::sbuffer& sb) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(sb.data());
  return {p, p + sb.size()};
}

inline bool get_u64(const Obj& o, std::uint64_t& out) {
  if (o.type != msgpack::type::POSITIVE_INTEGER) return false;
  out = o.via.u64;
  return true;
}
/// A number: a float, an integer (a packer may write a whole float as one), or nil (NaN).
inline bool get_number(const Obj& o, double& out) {
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      out = o.via.f64;
      return true;
    case msgpack::type::POSITIVE_INTEGER:
      out = static_cast<double>(o.via.u64);
      return true;
    case msgpack::type::NEGATIVE_INTEGER:
      out = static_cast<double>(o.via.i64);
      return true;
    case msgpack::type::NIL:
      out = __builtin_nan("");
      return true;
    default:
      return false;
  }
}
inline bool get_str(const Obj& o, std::size_t max, std::string& out) {
  if (o.type != msgpack::type::STR || o.via.str.size > max) return false;
  out.assign(o.via.str.ptr, o.via.str.size);
  return true;
}
template <std::size_t N>
bool get_fixed(const Obj& o, std::array<std::uint8_t, N>& out) {
  if (o.type != msgpack::type::BIN || o.via.bin.size != N) return false;
  std::memcpy(out.data(), o.via.bin.ptr, N);
  return true;
}
inline bool get_bytes(const Obj& o, std::size_t max, std::vector<std::uint8_t>& out) {
  if (o.type != msgpack::type::BIN || o.via.bin.size > max) return false;
  const auto* p = reinterpret_cast<const std::uint8_t*>(o.via.bin.ptr);
  out.assign(p, p + o.via.bin.size);
  return true;
}
/// The elements of an array of at most `max` (a non-null pointer even for an empty array:
/// msgpack leaves ptr null), or nullptr.
inline const Obj* get_array(const Obj& o, std::size_t max, std::size_t& n) {
  static const Obj kNone;
  if (o.type != msgpack::type::ARRAY || o.via.array.size > max) return nullptr;
  n = o.via.array.size;
  return n ? o.via.array.ptr : &kNone;
}

}  // namespace grove::transport::mp
