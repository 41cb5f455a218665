#include "transport/bytes.hpp"

#include <map>
#include <mutex>
#include <vector>

namespace grove::transport::detail {
namespace {
// Capacities are rounded up to 64 KiB steps so that frames of one stream (chunk size plus a
// few header bytes) share a size class. At most kMaxCached bytes are kept in total.
constexpr std::size_t kStep = 64u << 10;
constexpr std::size_t kMaxCached = 64u << 20;
constexpr std::size_t kMaxPooled = 32u << 20;  // larger buffers are never cached

struct Pool {
  std::mutex mu;
  std::map<std::size_t, std::vector<std::uint8_t*>> free;
  std::size_t cached = 0;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may be returned during static teardown
  return *p;
}
}  // namespace

std::uint8_t* pool_take(std::size_t n, std::size_t* cap) {
  const std::size_t c = (n + kStep - 1) / kStep * kStep;
  *cap = c;
  if (c <= kMaxPooled) {
    Pool& p = pool();
    std::lock_guard lk(p.mu);
    auto it = p.free.find(c);
    if (it != p.free.end() && !it->second.empty()) {
      std::uint8_t* b = it->second.back();
      it->second.pop_back();
      p.cached -= c;
      return b;
    }
  }
  return new std::uint8_t[c];
}

void pool_give(std::uint8_t* b, std::size_t cap) noexcept {
  if (cap <= kMaxPooled) {
    Pool& p = pool();
    std::lock_guard lk(p.mu);
    if (p.cached + cap <= kMaxCached) {
      p.free[cap].push_back(b);
      p.cached += cap;
      return;
    }
  }
  delete[] b;
}

}  // namespace grove::transport::detail
