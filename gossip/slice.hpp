// Streaming fragments (Streaming DiLoCo, arXiv 2501.18512): the parameters cut into F contiguous
// fragments; a DiLoCo-mode round of a run with fragments averages and steps one of them
// (RoundOptions::fragments), so a sync sends and holds ~1/F of the model.
#pragma once

#include <algorithm>
#include <cstddef>

namespace grove::gossip {

/// The values a round averages and steps: [lo, hi) of φ (by default all of it).
struct Slice {
  static constexpr std::size_t kEnd = static_cast<std::size_t>(-1);
  std::size_t lo = 0, hi = kEnd;
  std::size_t end(std::size_t n) const { return std::min(hi, n); }
  std::size_t size(std::size_t n) const { return end(n) - std::min(lo, end(n)); }
  bool whole(std::size_t n) const { return lo == 0 && end(n) == n; }
};

/// Fragments are multiples of this many values (but the last) when φ holds that many per
/// fragment.
inline constexpr std::size_t kSliceAlign = 4096;

/// Fragment f (< fragments) of `fragments` of n values: contiguous, in order, about equal,
/// none empty when n >= fragments.
inline Slice slice_of(std::size_t n, std::size_t fragments, std::size_t f) {
  if (fragments <= 1) return {0, n};
  const std::size_t unit = n >= fragments * kSliceAlign ? kSliceAlign : 1;
  const std::size_t units = (n + unit - 1) / unit;
  const auto at = [&](std::size_t k) { return std::min(n, units * k / fragments * unit); };
  return {at(f), f + 1 >= fragments ? n : at(f + 1)};
}

}  // namespace grove::gossip
