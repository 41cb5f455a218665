// SharedSegment: a shared-memory segment the node creates for its trainer to map (the tensors of
// the trainer's collectives: /dev/shm/grove-<16 hex>-c<n>). The node locks it for its life (a
// segment left by a killed node is swept at the next start: node/shm_segments.hpp) and removes
// it when the last holder lets go: the views a collective's operation reads and writes hold the
// segment, so a call that is still running on the gossip runtime never touches unmapped memory
// when its trainer has gone or the segment was replaced by a larger one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "optim/floats.hpp"
#include "transport/error.hpp"

namespace grove::node {

class SharedSegment : public std::enable_shared_from_this<SharedSegment> {
 public:
  /// Creates (replacing one of the same name) and maps `bytes` bytes; errc::limit_reached and
  /// the reason when it cannot.
  static transport::Result<std::shared_ptr<SharedSegment>> create(const std::string& name,
                                                                  std::size_t bytes);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  const std::string& name() const { return name_; }
  std::size_t bytes() const { return bytes_; }
  std::size_t values() const { return bytes_ / sizeof(float); }
  float* data() { return base_; }

  /// The values [at, at + n) as an array that holds the segment (nothing copied; release()
  /// hands the node's mapping of its pages back, the values stay). Empty when out of range.
  optim::Floats view(std::size_t at, std::size_t n);
  /// Arrays of n values at value `at`, when they fit (else none: the caller's heap).
  optim::FloatAllocator allocator(std::size_t at);

 private:
  SharedSegment() = default;
  std::string name_;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  float* base_ = nullptr;
};

}  // namespace grove::node
