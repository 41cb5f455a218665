// The process's resident memory, for tests that bound what a model-sized operation holds: the
// figure now, the highest one seen over an interval, and whether a sanitizer's allocator (which
// keeps freed memory resident) makes such bounds meaningless.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <thread>

namespace grove::node::testing {

// Resident bytes now.
inline std::uint64_t rss_now() {
  std::ifstream f("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// The highest resident memory seen while it lives: sampled every millisecond until stop(),
// which wakes the sampler at once.
class PeakRss {
 public:
  PeakRss() : peak_(rss_now()) {
    t_ = std::thread([this] {
      std::unique_lock lk(mu_);
      do {
        peak_ = std::max(peak_, rss_now());
      } while (!cv_.wait_for(lk, std::chrono::milliseconds(1), [this] { return done_; }));
    });
  }
  ~PeakRss() { stop(); }
  PeakRss(const PeakRss&) = delete;
  PeakRss& operator=(const PeakRss&) = delete;
  std::uint64_t stop() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (t_.joinable()) t_.join();
    return peak_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::uint64_t peak_;
  std::thread t_;
};

inline bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

}  // namespace grove::node::testing
