// Record schemas: every record and small message the node signs, stores or answers (member,
// progress, ready, mode, offer, manifest, state request, status, reach, relay dial-back) is
// declared once as a schema — its name, its version and its fields, each with its bound — and
// encoded and decoded by the two functions below, so a record's encoder and decoder cannot
// disagree and every decode is bounded the same way.
//
// Wire form: a msgpack array [version, field...]; nested rows (Row) are arrays of their fields
// without a version. Decoding accepts exactly the declared shape (no optional trailing fields:
// a format change is a new version, and a record of another version is refused with its
// reason). The unpack limits (array, string and bin sizes, depth) are derived from the fields'
// bounds, so no decode allocates more than the schema allows.
//
//   constexpr auto kModeSchema = transport::schema::record<ModeRequest>(
//       "mode", 1, field("run", &ModeRequest::run_id, Str{64}),
//       field("mode", &ModeRequest::mode, Uint{1}),
//       field("from_round", &ModeRequest::from_round, Uint{}));
//   encode(kModeSchema, r);  decode(kModeSchema, bytes) -> Result<ModeRequest>
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "transport/error.hpp"
#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

namespace grove::transport::schema {

using mp::Obj;
using mp::Packer;
namespace mt = msgpack::type;

/// What a field's bounds add to the unpack limits.
struct Limits {
  std::size_t array = 0, str = 0, bin = 0, depth = 0;
  Limits& merge(const Limits& o) {
    array = std::max(array, o.array);
    str = std::max(str, o.str);
    bin = std::max(bin, o.bin);
    depth = std::max(depth, o.depth);
    return *this;
  }
};

// ---- field kinds: each packs a value, reads it back within its bound, and names its limits ----

/// An unsigned integer (or an enum) of at most `max`.
struct Uint {
  std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  template <class T>
  void pack(Packer& p, const T& v) const {
    p.pack_uint64(static_cast<std::uint64_t>(v));
  }
  template <class T>
  const char* read(const Obj& o, T& out) const {
    std::uint64_t v = 0;
    if (!mp::get_u64(o, v)) return "not an unsigned integer";
    if (v > max) return "out of range";
    if constexpr (std::is_integral_v<T>) {
      if (v > std::numeric_limits<T>::max()) return "out of range";
    }
    out = static_cast<T>(v);
    return nullptr;
  }
  Limits limits() const { return {}; }
};

struct Bool {
  void pack(Packer& p, bool v) const {
    if (v)
      p.pack_true();
    else
      p.pack_false();
  }
  const char* read(const Obj& o, bool& out) const {
    if (o.type != mt::BOOLEAN) return "not a boolean";
    out = o.via.boolean;
    return nullptr;
  }
  Limits limits() const { return {}; }
};

/// A finite double in [min, max], or NaN (nil) when `nan`. Any non-finite value is written as
/// nil; finite ones always as float64 (msgpack-c's pack_double writes whole numbers as integers
/// and converts 2^64 to uint64_t, which is undefined).
struct Real {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool nan = false;
  void pack(Packer& p, double v) const {
    if (!std::isfinite(v)) return (void)p.pack_nil();
    mp::pack_f64(p, v);
  }
  const char* read(const Obj& o, double& out) const {
    if (!mp::get_number(o, out)) return "not a number";
    if (std::isnan(out)) return nan && o.type == mt::NIL ? nullptr : "NaN where none is allowed";
    if (!std::isfinite(out)) return "not finite";
    if (out < min || out > max) return "out of range";
    return nullptr;
  }
  Limits limits() const { return {}; }
};

/// A string of `min` to `max` bytes.
struct Str {
  std::size_t max = 0;
  std::size_t min = 0;
  void pack(Packer& p, const std::string& v) const { mp::pack_str(p, v); }
  const char* read(const Obj& o, std::string& out) const {
    if (!mp::get_str(o, max, out)) return "not a string of the allowed size";
    if (out.size() < min) return "too short";
    return nullptr;
  }
  Limits limits() const { return {.str = max}; }
};

/// Bytes: at most `max` into a vector, or exactly N into a std::array<uint8_t, N> (give max = N).
struct Bin {
  std::size_t max = 0;
  void pack(Packer& p, std::span<const std::uint8_t> v) const { mp::pack_bin(p, v); }
  const char* read(const Obj& o, std::vector<std::uint8_t>& out) const {
    return mp::get_bytes(o, max, out) ? nullptr : "not bytes of the allowed size";
  }
  template <std::size_t N>
  const char* read(const Obj& o, std::array<std::uint8_t, N>& out) const {
    return mp::get_fixed(o, out) ? nullptr : "not bytes of the fixed size";
  }
  Limits limits() const { return {.bin = max}; }
};
/// A value or nil.
template <class K>
struct Maybe {
  K kind{};
  template <class T>
  void pack(Packer& p, const std::optional<T>& v) const {
    if (v)
      kind.pack(p, *v);
    else
      p.pack_nil();
  }
  template <class T>
  const char* read(const Obj& o, std::optional<T>& out) const {
    if (o.type == mt::NIL) {
      out.reset();
      return nullptr;
    }
    T v{};
    if (const char* why = kind.read(o, v)) return why;
    out = std::move(v);
    return nullptr;
  }
  Limits limits() const { return kind.limits(); }
};

/// A list of `min` to `max` elements of kind K.
template <class K>
struct List {
  std::size_t max = 0;
  K elem{};
  std::size_t min = 0;
  template <class T>
  void pack(Packer& p, const std::vector<T>& v) const {
    p.pack_array(static_cast<std::uint32_t>(v.size()));
    for (const auto& e : v) elem.pack(p, e);
  }
  template <class T>
  const char* read(const Obj& o, std::vector<T>& out) const {
    std::size_t n = 0;
    const Obj* a = mp::get_array(o, max, n);
    if (!a) return "not a list of the allowed length";
    if (n < min) return "too few elements";
    out.assign(n, T{});
    for (std::size_t i = 0; i < n; ++i)
      if (const char* why = elem.read(a[i], out[i])) return why;
    return nullptr;
  }
  Limits limits() const {
    Limits l = elem.limits();
    l.depth += 1;
    return l.merge({.array = max, .depth = l.depth});
  }
};

template <class K>
constexpr List<K> list(std::size_t max, K elem, std::size_t min = 0) {
  return {max, elem, min};
}

// ---- fields and records ----

template <class Rec, class T, class K>
struct Field {
  const char* name;
  T Rec::*member;
  K kind;
};
template <class Rec, class T, class K>
constexpr Field<Rec, T, K> field(const char* name, T Rec::*member, K kind) {
  return {name, member, kind};
}

template <class Rec, class... Fs>
struct Schema {
  const char* name;
  std::uint8_t version;  ///< 0: a row (no version element; nested in a record)
  std::tuple<Fs...> fields;
  static constexpr std::size_t kFields = sizeof...(Fs);
  std::size_t width() const { return kFields + (version ? 1 : 0); }
  Limits limits() const {
    Limits l{.array = width(), .depth = 1};
    std::apply([&](const auto&... f) { (l.merge(deeper(f.kind.limits())), ...); }, fields);
    return l;
  }

 private:
  static Limits deeper(Limits l) {
    l.depth += 1;
    return l;
  }
};

/// A versioned record.
template <class Rec, class... Fs>
constexpr Schema<Rec, Fs...> record(const char* name, std::uint8_t version, Fs... fs) {
  return {name, version, {fs...}};
}

namespace detail {
template <class Rec, class... Fs>
void pack_fields(Packer& p, const Schema<Rec, Fs...>& s, const Rec& r) {
  p.pack_array(static_cast<std::uint32_t>(s.width()));
  if (s.version) p.pack_uint8(s.version);
  std::apply([&](const auto&... f) { (f.kind.pack(p, r.*(f.member)), ...); }, s.fields);
}

/// The first failure as "<record> field <name>: <why>", or "" when all fields read.
template <class Rec, class... Fs>
std::string read_fields(const Obj& o, const Schema<Rec, Fs...>& s, Rec& r) {
  std::size_t n = 0;
  const Obj* a = mp::get_array(o, s.width(), n);
  if (!a || n != s.width())
    return std::string(s.name) + ": expected a list of " + std::to_string(s.width()) + " elements";
  std::size_t i = 0;
  if (s.version) {
    std::uint64_t v = 0;
    if (!mp::get_u64(a[0], v) || v != s.version)
      return std::string(s.name) + ": version is not " + std::to_string(s.version);
    i = 1;
  }
  std::string out;
  const auto one = [&](const auto& f) {
    if (!out.empty()) return;
    if (const char* why = f.kind.read(a[i++], r.*(f.member)))
      out = std::string(s.name) + " field " + f.name + ": " + why;
  };
  std::apply([&](const auto&... f) { (one(f), ...); }, s.fields);
  return out;
}
}  // namespace detail

/// A nested row of another schema's list (no version element).
template <class Rec, class... Fs>
struct RowKind {
  Schema<Rec, Fs...> schema;
  void pack(Packer& p, const Rec& v) const { detail::pack_fields(p, schema, v); }
  const char* read(const Obj& o, Rec& out) const {
    // The reason is kept per thread: read() returns a C string like the other kinds.
    thread_local std::string why;
    why = detail::read_fields(o, schema, out);
    return why.empty() ? nullptr : why.c_str();
  }
  Limits limits() const { return schema.limits(); }
};
template <class Rec, class... Fs>
constexpr RowKind<Rec, Fs...> row(const char* name, Fs... fs) {
  return {Schema<Rec, Fs...>{name, 0, {fs...}}};
}

template <class Rec, class... Fs>
std::vector<std::uint8_t> encode(const Schema<Rec, Fs...>& s, const Rec& r) {
  msgpack::sbuffer sb;
  Packer p(sb);
  detail::pack_fields(p, s, r);
  return mp::bytes_of(sb);
}

template <class Rec, class... Fs>
Result<Rec> decode(const Schema<Rec, Fs...>& s, std::span<const std::uint8_t> bytes) {
  const Limits l = s.limits();
  auto oh = unpack_bounded(
      bytes, {.array = l.array, .map = 0, .str = l.str, .bin = l.bin, .ext = 0, .depth = l.depth});
  if (!oh) return Failure{oh.error(), std::string(s.name) + ": does not decode within its bounds"};
  Rec r{};
  if (auto why = detail::read_fields(oh->get(), s, r); !why.empty()) return {errc::malformed, why};
  return r;
}

}  // namespace grove::transport::schema
