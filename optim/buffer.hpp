// Vectors whose resize() leaves new elements uninitialised: a 256 MiB result buffer that every
// element of is written before it is read costs nothing to size (no memset, and its pages are
// faulted in only as they are first written), and one kept from the previous round is reused
// as it is (its pages already mapped).
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace grove::optim {

template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;  // default-init: no zeroing for arithmetic types
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// A float vector whose resize() does not zero (see above).
using FloatBuffer = std::vector<float, DefaultInitAllocator<float>>;
/// A byte vector whose resize() does not zero.
using ByteBuffer = std::vector<std::uint8_t, DefaultInitAllocator<std::uint8_t>>;

}  // namespace grove::optim
