// State deltas: a DiLoCo round's mean pseudo-gradient Δ̄ (the all-reduce's result, which every
// member of the group applied bit for bit) kept as a blob a member one or two rounds behind can
// replay instead of downloading the whole state. The outer step is a function of (φ, momentum,
// Δ̄) alone, so the state of round r and the deltas of rounds r+1..R give the state of round R
// exactly; the replay checks the φ hash before each delta and after it against the ones the
// delta names, and fails (the caller then downloads the whole state) on any mismatch.
//
// A delta is kept in the all-reduce's wire codec (fp16 by default: its result holds fp16 values
// only, so nothing is lost), 2 bytes per parameter against the state's 8: a joiner whose
// download of the state ended a round after the group moved on catches up with a quarter of
// the bytes. Members serve their last deltas next to their snapshot (StateServer) and list them
// in their offer (StateOffer::deltas).
//
// Blob layout (little-endian): "GRVDELTA", u32 version, u8 codec, 3 zero bytes, u64 round (the
// state round the delta leads to), u64 values (φ's size), 32-byte φ hash before, 32-byte φ hash
// after; version 1: then the values of all of φ in the codec (fp32, fp16 or bf16); version 2 (a
// round of one streaming fragment: it stepped φ[lo, lo + count) only): u64 lo, u64 count, then
// count values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "gossip/protocol.hpp"
#include "gossip/slice.hpp"
#include "gossip/state_blob.hpp"
#include "gossip/wire.hpp"
#include "optim/outer.hpp"

namespace grove::gossip {

inline constexpr std::size_t kDeltaHeaderBytes = 96;        ///< version 1
inline constexpr std::size_t kSliceDeltaHeaderBytes = 112;  ///< version 2

struct DeltaHeader {
  WireCodec codec = WireCodec::fp16;
  std::uint64_t round = 0;          ///< the state round after the delta is applied
  std::uint64_t values = 0;         ///< φ's size
  Digest from{}, to{};              ///< φ's hash before and after
  std::uint64_t lo = 0, count = 0;  ///< the values it steps: φ[lo, lo + count)
  std::size_t header_bytes = kDeltaHeaderBytes;
};

/// The codec a delta of an all-reduce in `c` is kept in: the same for fp32/fp16/bf16 (its
/// values are exact in it), fp32 for block codecs (e3m0).
WireCodec delta_codec(WireCodec c);
/// The bytes of a delta of φ of `values` values; `count` values of it for a slice's delta.
std::uint64_t delta_size(WireCodec c, std::uint64_t values,
                         std::optional<std::uint64_t> count = std::nullopt);

/// Writes a delta a fragment at a time (the values as the step walks them), then its header.
class DeltaWriter {
 public:
  /// A blob of `store` for the step of φ[slice] (φ of `values` values) in `codec`
  /// (delta_codec'ed); the store's error when it cannot hold one.
  static transport::Result<DeltaWriter> create(BlobStore& store, WireCodec codec,
                                               std::uint64_t values, Slice slice = {});
  /// The values at [offset, offset + v.size()) of the slice (errc::rejected past its end, or
  /// when a value does not survive the codec: a delta must replay exactly).
  transport::Result<void> write(std::uint64_t offset, std::span<const float> v);
  /// Writes the header and seals the blob.
  transport::Result<std::shared_ptr<const StateBlob>> seal(std::uint64_t round, const Digest& from,
                                                           const Digest& to);

 private:
  DeltaWriter(std::unique_ptr<BlobWriter> w, WireCodec c, std::uint64_t n, std::uint64_t lo,
              std::uint64_t count)
      : w_(std::move(w)), codec_(c), values_(n), lo_(lo), count_(count) {}
  std::size_t header_bytes() const {
    return lo_ == 0 && count_ == values_ ? kDeltaHeaderBytes : kSliceDeltaHeaderBytes;
  }
  std::unique_ptr<BlobWriter> w_;
  WireCodec codec_;
  std::uint64_t values_, lo_, count_;
  std::vector<std::uint8_t> bytes_;  // one piece's encoding
  std::vector<float> check_;         // its decoding (the exactness check)
};

/// Reads and checks a delta's header (magic, version, codec, size against the values).
transport::Result<DeltaHeader> read_delta_header(const StateBlob& blob);

/// Applies delta `blob` to `s` (DiLoCo's outer step with `cfg`, a fragment at a time) when its
/// `from` is `hash` and it leads to round s.round + 1; then s.round is the delta's round and
/// `hash` φ's new hash. The steps are first made in fragment-sized copies: a delta that does not
/// fit the state, does not parse, steps a value past the float range or does not lead to its `to`
/// is refused (errc::rejected, with the reason) and `s` is left as it was. Only a read of the
/// blob that fails while the delta is being applied leaves `s` changed part way
/// (errc::source_failed; `hash` is then φ's as it stands, and the caller must replace the state).
transport::Result<void> replay_delta(const StateBlob& blob, optim::OuterState& s, Digest& hash,
                                     const optim::DiLoCoConfig& cfg, unsigned threads = 1);

}  // namespace grove::gossip
