#include "node/state_files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

namespace grove::node {

namespace {
using transport::errc;

std::error_code last_error() {
  return {errno, std::generic_category()};
}

bool in_range(std::uint64_t size, std::uint64_t offset, std::size_t n) {
  return offset <= size && n <= size - offset;
}

// Closing the last descriptor of an unnamed state file frees its blocks and the page cache it
// holds, and unmapping a large mapping walks its page tables: for a file of a few GB on a busy
// disk either takes seconds (a round's θ of 2 GB, freed on the DHT strand, held it for 3.5 s at
// 500M; a download given up, 4.3 s). Whoever drops a state file, on whatever thread, hands both
// to this thread instead. Never destroyed (files may be dropped during static destruction);
// what is still queued when the process exits the kernel frees.
class Reaper {
 public:
  static Reaper& get() {
    static Reaper* const r = new Reaper;
    return *r;
  }
  /// Unmaps [p, p + len) (unless p is null) and closes fd (unless negative), soon.
  void drop(void* p, std::size_t len, int fd) {
    {
      std::lock_guard lk(m_);
      if (q_.size() < kMaxQueued) {
        q_.push_back({p, len, fd});
        cv_.notify_one();
        return;
      }
    }
    reap({p, len, fd});  // (a long queue: the caller waits, as it did before)
  }

 private:
  struct Job {
    void* p = nullptr;
    std::size_t len = 0;
    int fd = -1;
  };
  static constexpr std::size_t kMaxQueued = 256;
  static void reap(const Job& j) {
    if (j.p) ::munmap(j.p, j.len);
    if (j.fd >= 0) ::close(j.fd);
  }
  Reaper() {
    std::thread([this] { run(); }).detach();
  }
  void run() {
    for (;;) {
      Job j;
      {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return !q_.empty(); });
        j = q_.front();
        q_.pop_front();
        busy_ = true;
      }
      reap(j);
      {
        std::lock_guard lk(m_);
        busy_ = false;
      }
      idle_.notify_all();
    }
  }

 public:
  /// Waits until every file dropped so far is unmapped and closed; false at the deadline.
  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock lk(m_);
    return idle_.wait_for(lk, timeout, [&] { return q_.empty() && !busy_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<Job> q_;
  bool busy_ = false;
};

// The open file of one blob; closed (and so gone) with its last holder.
struct File {
  int fd = -1;
  std::uint64_t size = 0;
  ~File() {
    if (fd >= 0) Reaper::get().drop(nullptr, 0, fd);
  }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const {
    if (!in_range(size, offset, out.size())) return {errc::rejected, "read past the blob"};
    for (std::size_t got = 0; got < out.size();) {
      const ssize_t n =
          ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return {last_error(), "reading a state file"};
      if (n == 0) return {std::make_error_code(std::errc::io_error), "a state file is short"};
      got += static_cast<std::size_t>(n);
    }
    return {};
  }
};

class FileBlob final : public gossip::StateBlob {
 public:
  explicit FileBlob(std::shared_ptr<File> f) : f_(std::move(f)) {}
  std::uint64_t size() const override { return f_->size; }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    return f_->read(offset, out);
  }

 private:
  std::shared_ptr<File> f_;
};

class FileWriter final : public gossip::BlobWriter {
 public:
  explicit FileWriter(std::shared_ptr<File> f) : f_(std::move(f)) {}
  std::uint64_t size() const override { return f_->size; }
  transport::Result<void> write(std::uint64_t offset, std::span<const std::uint8_t> d) override {
    if (!f_) return {errc::rejected, "the blob is sealed"};
    if (!in_range(f_->size, offset, d.size())) return {errc::rejected, "write past the blob"};
    for (std::size_t put = 0; put < d.size();) {
      const ssize_t n =
          ::pwrite(f_->fd, d.data() + put, d.size() - put, static_cast<off_t>(offset + put));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return {n < 0 ? last_error() : std::make_error_code(std::errc::io_error),
                "writing a state file"};
      put += static_cast<std::size_t>(n);
    }
    return {};
  }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    if (!f_) return {errc::rejected, "the blob is sealed"};
    return f_->read(offset, out);
  }
  std::shared_ptr<const gossip::StateBlob> seal() override {
    if (!f_) return nullptr;
    return std::make_shared<const FileBlob>(std::exchange(f_, nullptr));
  }

 private:
  std::shared_ptr<File> f_;
};

// An unnamed file in `dir` (O_TMPFILE, or a named one unlinked at once) of `size` bytes,
// reserved (a full disk shows now).
transport::Result<int> unnamed_file(const std::filesystem::path& dir, std::uint64_t size) {
  static std::atomic<std::uint64_t> seq{0};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return {ec, "state files in " + dir.string()};
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {  // no O_TMPFILE here: a named file, unlinked at once
    const auto path = dir / ("blob." + std::to_string(::getpid()) + "." +
                             std::to_string(seq.fetch_add(1)) + ".tmp");
    fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return {last_error(), "creating a state file in " + dir.string()};
    ::unlink(path.c_str());
  }
  if (size > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    const auto e = last_error();
    if (errno != EOPNOTSUPP && errno != ENOSYS) {
      ::close(fd);
      return {e,
              "reserving " + std::to_string(size) + " bytes for a state file in " + dir.string()};
    }
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {  // (a sparse file, then)
      const auto t = last_error();
      ::close(fd);
      return {t, "sizing a state file of " + std::to_string(size) + " bytes"};
    }
  }
  return fd;
}

class FilePages final : public optim::FloatPages {
 public:
  FilePages(int fd, float* p, std::size_t n) : fd_(fd), p_(p), n_(n) {}
  ~FilePages() override { Reaper::get().drop(p_, bytes(), fd_); }
  float* data() override { return p_; }
  std::size_t size() const override { return n_; }
  void release(std::size_t lo, std::size_t hi) override {
    // Whole pages inside [lo, hi) only: a page shared with a neighbouring range stays.
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<std::uintptr_t>(p_);
    const std::uintptr_t a = (base + lo * sizeof(float) + page - 1) / page * page;
    const std::uintptr_t b = (base + hi * sizeof(float)) / page * page;
    if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
  }
  void prefetch(std::size_t lo, std::size_t hi) override {
    // Read-ahead into the page cache (no memory is touched): the pass's faults on these pages
    // are then minor, and a fragment's job does not wait for the disk.
    if (hi > lo)
      ::posix_fadvise(fd_, static_cast<off_t>(lo * sizeof(float)),
                      static_cast<off_t>((hi - lo) * sizeof(float)), POSIX_FADV_WILLNEED);
  }

 private:
  std::size_t bytes() const { return std::max<std::size_t>(n_, 1) * sizeof(float); }
  int fd_;
  float* p_;
  std::size_t n_;
};

class Store final : public gossip::BlobStore {
 public:
  explicit Store(std::filesystem::path dir) : dir_(std::move(dir)) {}

  transport::Result<std::unique_ptr<gossip::BlobWriter>> create(std::uint64_t size) override {
    auto fd = unnamed_file(dir_, size);
    if (!fd) return fd.failure();
    auto f = std::make_shared<File>();
    f->fd = *fd;
    f->size = size;
    return std::unique_ptr<gossip::BlobWriter>(std::make_unique<FileWriter>(std::move(f)));
  }

 private:
  const std::filesystem::path dir_;
};
}  // namespace

bool dropped_files_closed(std::chrono::milliseconds timeout) {
  return Reaper::get().wait_idle(timeout);
}

std::shared_ptr<gossip::BlobStore> state_files(std::filesystem::path dir) {
  return std::make_shared<Store>(std::move(dir));
}

optim::FloatAllocator float_pages(std::filesystem::path dir) {
  return [dir = std::move(dir)](std::size_t n) -> std::unique_ptr<optim::FloatPages> {
    const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(float);
    auto fd = unnamed_file(dir, bytes);
    if (!fd) {
      spdlog::warn("{} values in memory instead of a state file: {}", n, fd.text());
      return nullptr;
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (p == MAP_FAILED) {
      spdlog::warn("{} values in memory instead of a state file: mapping it: {}", n,
                   last_error().message());
      ::close(*fd);
      return nullptr;
    }
    return std::make_unique<FilePages>(*fd, static_cast<float*>(p), n);
  };
}

}  // namespace grove::node
