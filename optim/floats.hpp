// Floats: a model-sized float32 array (φ, the momentum, θ as a round takes it) that lives either
// on the heap or in pages its owner can hand back (FloatPages: the node maps unnamed files of its
// state directory, node/state_files.hpp). The outer loop walks such arrays a fragment at a time
// and releases each fragment when it is done with it (release()): the values stay in the file
// (the page cache, written out and reclaimed by the kernel under pressure) and leave the
// process's memory, so a node holds a few fragments of its state in memory, not the state.
//
// On the heap (the simulator, the tests, small models) release() does nothing. A copy is always
// on the heap; a move keeps the pages.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

namespace grove::optim {

/// Pages that hold an array of floats (zero-initialised), and can be handed back.
class FloatPages {
 public:
  virtual ~FloatPages() = default;
  virtual float* data() = 0;
  virtual std::size_t size() const = 0;
  /// The values in [lo, hi) are not needed for a while: their pages may leave the process's
  /// memory (the values are kept). Pages that straddle the range's ends stay.
  virtual void release(std::size_t lo, std::size_t hi) = 0;
  /// The values in [lo, hi) will be needed soon: start reading them in, without waiting (a pass
  /// over a paged array reads its next fragment while it works on this one).
  virtual void prefetch(std::size_t /*lo*/, std::size_t /*hi*/) {}
};
/// Makes pages for n floats (nullptr: none could be made; the caller falls back to the heap).
using FloatAllocator = std::function<std::unique_ptr<FloatPages>(std::size_t n)>;

/// Values per fragment of the passes that walk a model-sized array (32 MiB of floats).
inline constexpr std::size_t kFragment = std::size_t{1} << 23;

class Floats {
 public:
  Floats() = default;
  Floats(std::vector<float> v);  // NOLINT: adopts the vector's storage
  Floats(std::initializer_list<float> v) : Floats(std::vector<float>(v)) {}
  Floats(std::size_t n, float value) : Floats(std::vector<float>(n, value)) {}
  /// n zeros in pages of `alloc` (on the heap when there is no allocator or it gives none).
  static Floats zeros(std::size_t n, const FloatAllocator& alloc);
  Floats(const Floats& o);
  Floats& operator=(const Floats& o);
  Floats(Floats&& o) noexcept;
  Floats& operator=(Floats&& o) noexcept;
  ~Floats() = default;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* data() { return data_; }
  const float* data() const { return data_; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  float& operator[](std::size_t i) { return data_[i]; }
  const float& operator[](std::size_t i) const { return data_[i]; }
  operator std::span<float>() { return {data_, size_}; }              // NOLINT
  operator std::span<const float>() const { return {data_, size_}; }  // NOLINT
  /// n copies of `value`; the pages are kept when the size stays.
  void assign(std::size_t n, float value);
  void clear() { *this = Floats(); }
  std::vector<float> to_vector() const { return {begin(), end()}; }
  /// The values as a vector: the storage itself when on the heap (this is empty after), else a
  /// copy.
  std::vector<float> take_vector();

  /// See FloatPages::release (nothing on the heap). Const: the values do not change.
  void release(std::size_t lo, std::size_t hi) const;
  void release() const { release(0, size_); }
  /// See FloatPages::prefetch (nothing on the heap).
  void prefetch(std::size_t lo, std::size_t hi) const;
  bool paged() const { return pages_ != nullptr; }

  friend bool operator==(const Floats& a, const Floats& b);
  friend bool operator==(const Floats& a, const std::vector<float>& b);

 private:
  void point_at_storage();
  std::vector<float> heap_;
  std::unique_ptr<FloatPages> pages_;
  float* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Runs fn(lo, hi) over [0, n) a fragment at a time (kFragment values), then releases that
/// fragment of every array in `arrays` (the values fn touched); their next fragment is
/// prefetched before fn runs.
void by_fragments(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn,
                  std::initializer_list<const Floats*> arrays = {});
/// The same over [begin, end): fn gets absolute indices (fragments start at `begin`).
void by_fragments(std::size_t begin, std::size_t end,
                  const std::function<void(std::size_t, std::size_t)>& fn,
                  std::initializer_list<const Floats*> arrays = {});

}  // namespace grove::optim
