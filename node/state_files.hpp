// StateFiles: the node's store of state blobs (gossip/state_blob.hpp) and of its model-sized
// float arrays (optim/floats.hpp: φ, the momentum, θ as a round takes it) in unnamed files of its
// state directory (O_TMPFILE: a file exists while a blob holds it and leaves nothing behind when
// the node dies). The state's binary form is written into it piece by piece and read back with
// pread, so it lives in the page cache, which the kernel writes out and reclaims under pressure,
// not in the node's memory: a served snapshot and the state being downloaded cost the node no
// model-sized memory. Where the file system has no O_TMPFILE, a named file is made and unlinked
// at once.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>

#include "gossip/state_blob.hpp"

namespace grove::node {

/// Blobs in files in `dir` (created if missing). Thread-safe.
std::shared_ptr<gossip::BlobStore> state_files(std::filesystem::path dir);

/// Waits until every state file dropped so far (on any thread) has been unmapped and closed by
/// the reaper thread; false if that takes longer than `timeout`.
bool dropped_files_closed(std::chrono::milliseconds timeout);

/// Float arrays in unnamed files of `dir`, mapped shared (optim::FloatPages): a released range's
/// pages leave the process (madvise MADV_DONTNEED) and keep their values in the file. Gives
/// nullptr (the caller uses the heap) when a file cannot be made or mapped, with a warning.
optim::FloatAllocator float_pages(std::filesystem::path dir);

}  // namespace grove::node
