// The outer state's binary form (checkpoints, the snapshots served to joiners), written and read
// piece by piece: a model-sized state is never assembled in memory a second time.
//
// "GRVOUT02", u64 round, three (u64 count, float32 LE values) arrays (φ, momentum, error), and
// state_checksum() of everything before it (optim links no crypto library; the checkpoint and
// the state sync seal these bytes with BLAKE2b as well). Parsing is bounded by `max_values` per
// array and rejects non-finite values, bad sizes and bad checksums. "GRVOUT01" (the same with a
// byte-wise FNV-1a 64, ~1 s per 800 MB) is still read.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "optim/outer.hpp"

namespace grove::optim {

/// Where things lie in the binary form (GRVOUT02 and 01 alike), for readers of a few values of a
/// stored state (gossip/state_check.hpp) that do not parse it: the round (u64 LE), φ's count
/// (u64 LE), φ's values (float32 LE).
inline constexpr std::uint64_t kRoundOffset = 8;
inline constexpr std::uint64_t kPhiCountOffset = 16;
inline constexpr std::uint64_t kPhiValuesOffset = 24;
/// True when `head` begins with a binary form's magic (GRVOUT02, or 01).
bool is_state_form(std::span<const std::uint8_t> head);

/// Bytes of s's binary form.
std::uint64_t serialized_size(const OuterState& s);
/// Hands the binary form to `sink` in order, in pieces (the values straight from the vectors on
/// a little-endian machine). A sink that returns false stops it: serialize_to returns false.
using ByteSink = std::function<bool(std::span<const std::uint8_t>)>;
bool serialize_to(const OuterState& s, const ByteSink& sink);
std::vector<std::uint8_t> serialize(const OuterState& s);

/// Fills `out` with the binary form's bytes at `offset` (false: they cannot be read).
using ByteReader = std::function<bool(std::uint64_t offset, std::span<std::uint8_t> out)>;
/// Parses a binary form of `size` bytes read through `read`, piece by piece straight into the
/// state's arrays (their size is checked against `size` and `max_values` before any is made),
/// made by `alloc` when given (each piece released once read).
std::optional<OuterState> deserialize_from(std::uint64_t size, const ByteReader& read,
                                           std::size_t max_values = std::size_t{1} << 31,
                                           const FloatAllocator& alloc = {});
std::optional<OuterState> deserialize(std::span<const std::uint8_t> bytes,
                                      std::size_t max_values = std::size_t{1} << 31);

/// GRVOUT02's checksum: FNV-style steps over 64-bit words in four independent lanes (tens of
/// ms for 800 MB), length folded in. Detects damage; not a defence against forgery.
std::uint64_t state_checksum(std::span<const std::uint8_t> bytes);

/// state_checksum taken over pieces handed in order (equal to it over their concatenation).
class StateChecksum {
 public:
  void update(std::span<const std::uint8_t> b);
  std::uint64_t final() const;

 private:
  void block(const std::uint8_t* p);
  std::uint64_t h_[4] = {1469598103934665603ull, 1469598103934665603ull ^ 1,
                         1469598103934665603ull ^ 2, 1469598103934665603ull ^ 3};
  std::uint8_t carry_[32] = {};
  std::size_t carried_ = 0;
  std::uint64_t length_ = 0;
};

}  // namespace grove::optim
