#include "optim/state_format.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace grove::optim {

namespace {
constexpr char kMagic[8] = {'G', 'R', 'V', 'O', 'U', 'T', '0', '2'};
constexpr char kMagicV1[8] = {'G', 'R', 'V', 'O', 'U', 'T', '0', '1'};  // still read
constexpr std::uint64_t kFnvBasis = 1469598103934665603ull, kFnvPrime = 1099511628211ull;
constexpr std::size_t kHead = 8 + 8;     // magic, round
constexpr std::size_t kTrailer = 8;      // checksum
constexpr std::size_t kPiece = 1 << 20;  // bytes read or converted at a time

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, 8);
  } else {
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  }
  return v;
}

void store_le64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// GRVOUT01's checksum: FNV-1a 64, a byte at a time (about 1 s for 800 MB: one dependent
// multiply per byte).
struct Fnv1a {
  std::uint64_t h = kFnvBasis;
  void update(std::span<const std::uint8_t> b) {
    for (std::uint8_t c : b) h = (h ^ c) * kFnvPrime;
  }
};
}  // namespace

// ---- checksum ----

void StateChecksum::block(const std::uint8_t* p) {
  for (int j = 0; j < 4; ++j) {
    h_[j] = (h_[j] ^ load_le64(p + 8 * j)) * kFnvPrime;
    h_[j] ^= h_[j] >> 29;
  }
}

void StateChecksum::update(std::span<const std::uint8_t> b) {
  // Four independent lanes over little-endian 64-bit words (word i to lane i mod 4), each step an
  // FNV-style multiply and an xor-shift (so high bits reach the low ones); a piece's bytes that do
  // not fill a 32-byte block wait for the next piece.
  if (b.empty()) return;  // (an empty span's data() may be null: no memcpy from it)
  length_ += b.size();
  if (carried_) {
    const std::size_t take = std::min(b.size(), 32 - carried_);
    std::memcpy(carry_ + carried_, b.data(), take);
    carried_ += take;
    b = b.subspan(take);
    if (carried_ < 32) return;
    block(carry_);
    carried_ = 0;
  }
  const std::size_t blocks = b.size() / 32;
  for (std::size_t i = 0; i < blocks; ++i) block(b.data() + 32 * i);
  carried_ = b.size() - 32 * blocks;
  if (carried_) std::memcpy(carry_, b.data() + 32 * blocks, carried_);
}

std::uint64_t StateChecksum::final() const {
  // The tail (under 32 bytes) a byte at a time into the first lane; then the lanes and the
  // length folded together.
  std::uint64_t h0 = h_[0];
  for (std::size_t i = 0; i < carried_; ++i) h0 = (h0 ^ carry_[i]) * kFnvPrime;
  std::uint64_t r = kFnvBasis;
  for (const std::uint64_t v : {h0, h_[1], h_[2], h_[3], length_}) {
    r = (r ^ v) * kFnvPrime;
    r ^= r >> 31;
  }
  return r;
}

std::uint64_t state_checksum(std::span<const std::uint8_t> bytes) {
  StateChecksum c;
  c.update(bytes);
  return c.final();
}

// ---- layout ----

static_assert(kPhiCountOffset == kHead && kPhiValuesOffset == kHead + 8 && kRoundOffset == 8);

bool is_state_form(std::span<const std::uint8_t> head) {
  return head.size() >= 8 &&
         (std::memcmp(head.data(), kMagic, 8) == 0 || std::memcmp(head.data(), kMagicV1, 8) == 0);
}

// ---- writing ----

std::uint64_t serialized_size(const OuterState& s) {
  return kHead + 3 * 8 + 4 * std::uint64_t{s.phi.size() + s.momentum.size() + s.error.size()} +
         kTrailer;
}

bool serialize_to(const OuterState& s, const ByteSink& sink) {
  StateChecksum sum;
  const auto out = [&](std::span<const std::uint8_t> piece) {
    sum.update(piece);
    return sink(piece);
  };
  std::uint8_t head[kHead];
  std::memcpy(head, kMagic, 8);
  store_le64(head + 8, s.round);
  if (!out(head)) return false;
  for (const Floats* v : {&s.phi, &s.momentum, &s.error}) {
    std::uint8_t count[8];
    store_le64(count, v->size());
    if (!out(count)) return false;
    if constexpr (std::endian::native == std::endian::little) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(v->data());
      for (std::size_t off = 0; off < v->size() * 4; off += kPiece) {
        const std::size_t len = std::min(kPiece, v->size() * 4 - off);
        if (!out({p + off, len})) return false;
        v->release(off / 4, (off + len) / 4);  // (paged arrays leave memory piece by piece)
      }
    } else {
      std::vector<std::uint8_t> le;
      for (std::size_t at = 0; at < v->size(); at += kPiece / 4) {
        const std::size_t n = std::min(kPiece / 4, v->size() - at);
        le.resize(4 * n);
        for (std::size_t i = 0; i < n; ++i) {
          std::uint32_t u;
          std::memcpy(&u, &(*v)[at + i], 4);
          for (int k = 0; k < 4; ++k) le[4 * i + k] = static_cast<std::uint8_t>(u >> (8 * k));
        }
        if (!out(le)) return false;
        v->release(at, at + n);
      }
    }
  }
  std::uint8_t trailer[kTrailer];
  store_le64(trailer, sum.final());
  return sink(trailer);
}

std::vector<std::uint8_t> serialize(const OuterState& s) {
  std::vector<std::uint8_t> b;
  b.reserve(serialized_size(s));
  serialize_to(s, [&](std::span<const std::uint8_t> piece) {
    b.insert(b.end(), piece.begin(), piece.end());
    return true;
  });
  return b;
}

// ---- reading ----

std::optional<OuterState> deserialize_from(std::uint64_t size, const ByteReader& read,
                                           std::size_t max_values, const FloatAllocator& alloc) {
  if (size < kHead + 3 * 8 + kTrailer) return std::nullopt;
  std::uint8_t head[kHead];
  if (!read(0, head)) return std::nullopt;
  const bool v1 = std::memcmp(head, kMagicV1, 8) == 0;
  if (!v1 && std::memcmp(head, kMagic, 8) != 0) return std::nullopt;
  StateChecksum sum;
  Fnv1a fnv;
  const auto take = [&](std::span<const std::uint8_t> b) {
    if (v1)
      fnv.update(b);
    else
      sum.update(b);
  };
  take(head);
  const std::uint64_t body = size - kTrailer;
  std::uint64_t at = kHead;
  OuterState s;
  s.round = load_le64(head + 8);
  for (Floats* v : {&s.phi, &s.momentum, &s.error}) {
    std::uint8_t count[8];
    if (body - at < 8 || !read(at, count)) return std::nullopt;
    take(count);
    at += 8;
    const std::uint64_t n = load_le64(count);
    if (n > max_values || n > (body - at) / 4) return std::nullopt;
    *v = Floats::zeros(static_cast<std::size_t>(n), alloc);
    auto* dst = reinterpret_cast<std::uint8_t*>(v->data());
    for (std::size_t off = 0; off < v->size() * 4; off += kPiece) {
      const std::span<std::uint8_t> piece(dst + off, std::min(kPiece, v->size() * 4 - off));
      if (!read(at + off, piece)) return std::nullopt;
      take(piece);
      if constexpr (std::endian::native != std::endian::little) {
        for (std::size_t i = 0; i < piece.size(); i += 4) {
          std::uint32_t u = 0;
          for (int k = 0; k < 4; ++k) u |= std::uint32_t{piece[i + k]} << (8 * k);
          std::memcpy(piece.data() + i, &u, 4);
        }
      }
      if (!all_finite({reinterpret_cast<const float*>(piece.data()), piece.size() / 4}))
        return std::nullopt;
      v->release(off / 4, (off + piece.size()) / 4);
    }
    at += 4 * n;
  }
  if (at != body) return std::nullopt;
  std::uint8_t trailer[kTrailer];
  if (!read(body, trailer)) return std::nullopt;
  if ((v1 ? fnv.h : sum.final()) != load_le64(trailer)) return std::nullopt;
  if ((!s.momentum.empty() && s.momentum.size() != s.phi.size()) ||
      (!s.error.empty() && s.error.size() != s.phi.size()))
    return std::nullopt;
  return s;
}

std::optional<OuterState> deserialize(std::span<const std::uint8_t> bytes, std::size_t max_values) {
  return deserialize_from(
      bytes.size(),
      [&](std::uint64_t offset, std::span<std::uint8_t> out) {
        if (offset > bytes.size() || out.size() > bytes.size() - offset) return false;
        std::memcpy(out.data(), bytes.data() + offset, out.size());
        return true;
      },
      max_values);
}

}  // namespace grove::optim
