// Checkpoints: everything a node needs to resume after a crash or a restart, written atomically.
//
// File: "GRVCKPT1", then sections (u32 tag, u64 length, bytes), then the BLAKE2b-256 of
// everything before it. Sections: the run config text, the node's counters (inner step, round,
// tokens), the outer state (optim's checksummed form) and the workload's own blob (the inner
// optimiser's state and data position; θ is not stored: a checkpoint is written right after a
// round, when θ restarts from φ). Loading checks the magic, every length against the file and
// against `max_bytes`, and the hash, before anything is parsed.
//
// Writing: the new checkpoint is first written atomically as `checkpoint.next` (temporary file,
// fsync, rename, fsync of the directory); then `checkpoint.bin` is renamed to `checkpoint.prev`
// and `checkpoint.next` to `checkpoint.bin` (for a state of 1 GB or more no `.prev` is kept:
// `checkpoint.next` replaces `checkpoint.bin` in one rename). A kill at any instant leaves a
// complete checkpoint; load_latest() tries next, bin, prev in that order (newest first) and skips
// damaged files and temporaries.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "gossip/state_blob.hpp"
#include "optim/state_format.hpp"
#include "transport/error.hpp"

namespace grove::node {

struct Checkpoint {
  std::string config_text;  ///< RunConfig::to_text() of the run
  std::uint64_t step = 0;   ///< inner steps done by this node
  std::uint64_t round = 0;  ///< outer rounds done (== outer.round)
  std::uint64_t tokens = 0;
  optim::OuterState outer;
  /// When set, written in place of `outer`: its binary form (the round engine's state blob,
  /// shared, and copied into the file piece by piece: a model-sized state is neither copied in
  /// memory nor serialised again for its checkpoint). decode_checkpoint() fills `outer` and
  /// leaves this empty.
  std::shared_ptr<const gossip::StateBlob> outer_blob;
  std::vector<std::uint8_t> workload;  ///< Workload::save() (optimiser state, not θ)
  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c);
/// Parses a checkpoint file's bytes (errc::malformed with the reason).
transport::Result<Checkpoint> decode_checkpoint(std::span<const std::uint8_t> bytes,
                                                std::size_t max_values = std::size_t{1} << 31);
/// The same over a file of `size` bytes read through `read` piece by piece (load_latest): the
/// hash is checked in one pass, then the outer state is read straight into its vectors.
transport::Result<Checkpoint> decode_checkpoint_from(std::uint64_t size,
                                                     const optim::ByteReader& read,
                                                     std::size_t max_values = std::size_t{1} << 31,
                                                     const optim::FloatAllocator& alloc = {});

/// Writes `c` into `dir` atomically (see above). Returns the error, if any (logged by the caller:
/// a failed checkpoint is not fatal, the previous one stays). With `keep_previous` the one it
/// replaces stays as checkpoint.prev (a fallback should the newest be damaged later); without,
/// the new file replaces it in one rename and no .prev is kept: the disk holds one checkpoint,
/// two while one is written.
std::error_code save_checkpoint(const std::filesystem::path& dir, const Checkpoint& c,
                                bool keep_previous = true);
/// Whether a checkpoint of `outer_bytes` keeps the previous one: below 1 GB (at 8B parameters
/// a second copy would be 64 GB).
inline bool keeps_previous_checkpoint(std::uint64_t outer_bytes) {
  return outer_bytes < 1'000'000'000;
}
/// Whether a model of `params` parameters has a large outer state (φ and the momentum, 8 bytes a
/// parameter: 1 GB or more). Its node checkpoints by time and snapshots its state only for its
/// checkpoints (node/training_loop.cpp, gossip::RoundOptions::snapshot_every).
inline bool large_state(std::size_t params) {
  return !keeps_previous_checkpoint(8 * std::uint64_t{params});
}
/// The newest complete checkpoint in `dir` (checkpoint.bin, else checkpoint.prev); nullopt when
/// there is none. A damaged file is passed over and reported in `skipped`.
struct LoadedCheckpoint {
  std::optional<Checkpoint> checkpoint;  ///< nullopt: none, or none that is whole
  std::string skipped;                   ///< damaged or unreadable files passed over, and why
};
/// The outer state's arrays are made by `alloc` (none: the heap).
LoadedCheckpoint load_latest(const std::filesystem::path& dir,
                             std::uint64_t max_bytes = std::uint64_t{64} << 30,
                             const optim::FloatAllocator& alloc = {});

/// Writes `data` to `path` atomically: temporary file, fsync, rename, fsync of the directory.
std::error_code write_file_atomically(const std::filesystem::path& path,
                                      std::span<const std::uint8_t> data);

}  // namespace grove::node
