// Shared-memory segments of external workloads (/dev/shm/grove-<16 hex of the node id>: θ as
// float32, model-sized; grove-<16 hex>-c<n>: the tensors of the trainer's collectives). A node
// holds an exclusive flock on its segment for its life; a node killed (SIGKILL, an OOM kill, a
// power cut of a container) cannot unlink it, and a segment left behind keeps its RAM (tmpfs) until
// someone does. So a node sweeps at start: a grove segment whose lock it can take has no live owner
// and is unlinked (a trainer still mapping it keeps its mapping). Segments younger than `min_age`
// are left alone (a node between creating its segment and locking it).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

namespace grove::node {

/// Takes the owner's lock on a segment this node created (held until the fd is closed).
/// Returns false if another process holds it.
bool lock_segment(int fd);

struct SweepResult {
  int removed = 0;
  std::uint64_t bytes = 0;
};

/// Unlinks the grove segments in `dir` (the shm_open namespace: /dev/shm) that no live node
/// holds and that are older than `min_age`; each one removed is logged.
SweepResult sweep_stale_segments(const std::filesystem::path& dir = "/dev/shm",
                                 std::chrono::seconds min_age = std::chrono::seconds(10));

/// True for the names grove-node gives its segments: "grove-" and 16 hex digits (θ's), then
/// "-c" and 1 to 9 digits for a trainer's collective segment.
bool is_segment_name(const std::string& name);

}  // namespace grove::node
