#include "optim/floats.hpp"

#include <algorithm>
#include <cstring>

namespace grove::optim {

Floats::Floats(std::vector<float> v) : heap_(std::move(v)) {
  point_at_storage();
}

void Floats::point_at_storage() {
  if (pages_) {
    data_ = pages_->data();
    size_ = pages_->size();
  } else {
    data_ = heap_.data();
    size_ = heap_.size();
  }
}

Floats Floats::zeros(std::size_t n, const FloatAllocator& alloc) {
  Floats f;
  if (alloc && n > 0) f.pages_ = alloc(n);
  if (!f.pages_) f.heap_.assign(n, 0.0f);
  f.point_at_storage();
  return f;
}

Floats::Floats(const Floats& o) : heap_(o.begin(), o.end()) {
  point_at_storage();
}

Floats& Floats::operator=(const Floats& o) {
  if (this == &o) return *this;
  if (size_ == o.size_ && size_ > 0) {  // keep our storage (pages stay pages)
    std::memcpy(data_, o.data_, size_ * sizeof(float));
    return *this;
  }
  pages_.reset();
  heap_.assign(o.begin(), o.end());
  point_at_storage();
  return *this;
}

Floats::Floats(Floats&& o) noexcept : heap_(std::move(o.heap_)), pages_(std::move(o.pages_)) {
  point_at_storage();
  o.heap_.clear();
  o.point_at_storage();
}

Floats& Floats::operator=(Floats&& o) noexcept {
  if (this == &o) return *this;
  heap_ = std::move(o.heap_);
  pages_ = std::move(o.pages_);
  point_at_storage();
  o.heap_.clear();
  o.point_at_storage();
  return *this;
}

std::vector<float> Floats::take_vector() {
  if (pages_) return to_vector();
  auto v = std::move(heap_);
  heap_.clear();
  point_at_storage();
  return v;
}

void Floats::assign(std::size_t n, float value) {
  if (n != size_) {
    pages_.reset();
    heap_.assign(n, value);
    point_at_storage();
    return;
  }
  by_fragments(n, [&](std::size_t lo, std::size_t hi) { std::fill(data_ + lo, data_ + hi, value); },
               {this});
}

void Floats::release(std::size_t lo, std::size_t hi) const {
  if (pages_ && lo < hi) pages_->release(lo, std::min(hi, size_));
}

void Floats::prefetch(std::size_t lo, std::size_t hi) const {
  hi = std::min(hi, size_);
  if (pages_ && lo < hi) pages_->prefetch(lo, hi);
}

bool operator==(const Floats& a, const Floats& b) {
  return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
}

bool operator==(const Floats& a, const std::vector<float>& b) {
  return a.size_ == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void by_fragments(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn,
                  std::initializer_list<const Floats*> arrays) {
  by_fragments(0, n, fn, arrays);
}

void by_fragments(std::size_t begin, std::size_t n,
                  const std::function<void(std::size_t, std::size_t)>& fn,
                  std::initializer_list<const Floats*> arrays) {
  for (std::size_t lo = begin; lo < n; lo += kFragment) {
    const std::size_t hi = std::min(n, lo + kFragment);
    for (const Floats* a : arrays)
      if (a) a->prefetch(hi, hi + kFragment);
    fn(lo, hi);
    for (const Floats* a : arrays)
      if (a) a->release(lo, hi);
  }
}

}  // namespace grove::optim
