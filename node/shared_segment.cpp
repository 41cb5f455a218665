// SharedSegment (shared_segment.hpp).
#include "node/shared_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "node/shm_segments.hpp"

namespace grove::node {

namespace {

// Pages of a segment: values [at, at + n) of its mapping, holding the segment.
class SegmentPages final : public optim::FloatPages {
 public:
  SegmentPages(std::shared_ptr<SharedSegment> seg, std::size_t at, std::size_t n)
      : seg_(std::move(seg)), p_(seg_->data() + at), n_(n) {}
  float* data() override { return p_; }
  std::size_t size() const override { return n_; }
  void release(std::size_t lo, std::size_t hi) override {
    static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<std::uintptr_t>(p_);
    const std::uintptr_t a = (base + lo * sizeof(float) + page - 1) / page * page;
    const std::uintptr_t b = (base + hi * sizeof(float)) / page * page;
    if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
  }

 private:
  std::shared_ptr<SharedSegment> seg_;
  float* p_;
  std::size_t n_;
};

}  // namespace

transport::Result<std::shared_ptr<SharedSegment>> SharedSegment::create(const std::string& name,
                                                                        std::size_t bytes) {
  const auto fail = [&](const char* what) {
    return transport::Result<std::shared_ptr<SharedSegment>>(
        transport::errc::limit_reached, "shared memory " + name + " (" + std::to_string(bytes) +
                                            " bytes): " + what + ": " + std::strerror(errno));
  };
  std::shared_ptr<SharedSegment> s(new SharedSegment());
  s->name_ = name;
  s->bytes_ = bytes;
  ::shm_unlink(name.c_str());
  s->fd_ = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (s->fd_ < 0) return fail("shm_open");
  if (!lock_segment(s->fd_)) return fail("locked by another process");
  if (::ftruncate(s->fd_, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  if (bytes > 0) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
    if (p == MAP_FAILED) return fail("mmap");
    s->base_ = static_cast<float*>(p);
  }
  return s;
}

SharedSegment::~SharedSegment() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) {
    ::close(fd_);
    ::shm_unlink(name_.c_str());
  }
}

optim::Floats SharedSegment::view(std::size_t at, std::size_t n) {
  if (n == 0 || at > values() || n > values() - at) return {};
  auto self = shared_from_this();
  return optim::Floats::zeros(
      n, [self, at](std::size_t m) { return std::make_unique<SegmentPages>(self, at, m); });
}

optim::FloatAllocator SharedSegment::allocator(std::size_t at) {
  std::weak_ptr<SharedSegment> w = weak_from_this();
  return [w, at](std::size_t n) -> std::unique_ptr<optim::FloatPages> {
    auto s = w.lock();
    if (!s || at > s->values() || n > s->values() - at) return nullptr;
    return std::make_unique<SegmentPages>(s, at, n);
  };
}

}  // namespace grove::node
