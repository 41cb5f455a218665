// State blobs: the outer state in its binary form (optim/state_format.hpp) as the engine serves it
// to joiners, downloads it and hands it to the node's checkpoints, kept where its store puts it.
// The node's store keeps blobs in unnamed files (node/state_files.hpp): a model-sized state is
// written once per round from φ and the momentum, piece by piece, and read back by range, so it
// adds nothing model-sized to the node's memory. The simulator and the tests keep them in memory.
//
// A store's operations are blocking file I/O at worst: the engine makes them in the jobs it hands
// its driver (StepWork), and a download writes each verified chunk (a few MiB) as it arrives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "optim/state_format.hpp"
#include "transport/error.hpp"

namespace grove::gossip {

/// An immutable blob of bytes.
class StateBlob {
 public:
  virtual ~StateBlob() = default;
  virtual std::uint64_t size() const = 0;
  /// Copies the bytes at [offset, offset + out.size()) into `out` (errc::rejected past the end;
  /// the system's error, with the reason, when they cannot be read). Thread-safe.
  virtual transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const = 0;
};

/// A blob being filled (a serialisation, a download): pieces at any offset, then sealed.
class BlobWriter {
 public:
  virtual ~BlobWriter() = default;
  virtual std::uint64_t size() const = 0;
  /// Writes `data` at `offset` (errc::rejected past the end; the system's error when the store
  /// fails).
  virtual transport::Result<void> write(std::uint64_t offset,
                                        std::span<const std::uint8_t> data) = 0;
  /// Reads back what was written (the resumed download's bytes; a sealed blob's checks).
  virtual transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const = 0;
  /// The blob, immutable from now on (the writer is spent).
  virtual std::shared_ptr<const StateBlob> seal() = 0;
};

class BlobStore {
 public:
  virtual ~BlobStore() = default;
  /// A new blob of `size` bytes (the system's error, with the reason, when the store cannot
  /// hold it).
  virtual transport::Result<std::unique_ptr<BlobWriter>> create(std::uint64_t size) = 0;
};

/// Blobs in memory (the default; the simulator and the tests).
std::shared_ptr<BlobStore> memory_blob_store();
/// A blob in memory over `bytes` (tests).
std::shared_ptr<const StateBlob> memory_blob(std::vector<std::uint8_t> bytes);

/// `s` in its binary form, written piece by piece into a new blob of `store`.
transport::Result<std::shared_ptr<const StateBlob>> save_state(BlobStore& store,
                                                               const optim::OuterState& s);
/// Parses a blob (optim::deserialize_from: bounded, checked), read piece by piece into arrays
/// made by `alloc` (none: the heap).
std::optional<optim::OuterState> load_state(const StateBlob& blob,
                                            std::size_t max_values = std::size_t{1} << 31,
                                            const optim::FloatAllocator& alloc = {});

}  // namespace grove::gossip
