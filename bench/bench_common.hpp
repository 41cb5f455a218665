// Helpers shared by the benchmark programs: argument parsing (bench/args.hpp), medians, pipes
// between forked processes, children bound to the parent's life, and a Host running on its own
// io thread.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "bench/args.hpp"
#include "transport/host.hpp"

namespace grove::bench {

namespace asio = boost::asio;
using transport::Clock;
using transport::Duration;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Reads --chunk and --window (a session's stream chunk and flow-control window, bytes) and
/// --workers (transport worker pool threads, at most 256), the options of the programs that
/// stream over the transport; false when the current option is none of them.
inline bool read_stream_option(Args& args, std::size_t& chunk, std::size_t& window,
                               std::size_t& workers) {
  if (args.is("--chunk")) {
    chunk = args.size(1);
  } else if (args.is("--window")) {
    window = args.size(1);
  } else if (args.is("--workers")) {
    workers = std::min<std::uint64_t>(args.size(1), 256);
  } else {
    return false;
  }
  return true;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// "1.00 GiB", "256 MiB", "1 MiB", "4096 B".
inline std::string human_bytes(std::uint64_t n) {
  char buf[64];
  if (n >= (1ull << 30) && n % (1ull << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / (1ull << 30));
  } else if (n >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / (1ull << 20));
  } else if (n >= (1ull << 10) && n % 1024 == 0) {
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(n >> 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  }
  return buf;
}

// --- processes and pipes ------------------------------------------------------------------------

/// fork() whose child is killed (SIGKILL) when the parent dies. Flush stdio before calling.
/// Returns the pid in the parent, 0 in the child, -1 on failure.
inline pid_t fork_bound_child() {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ::_exit(120);
    if (::getppid() != parent) ::_exit(121);  // the parent died before prctl took effect
  }
  return pid;
}

/// Kills (if still running) and reaps a child; returns its exit status (-1 if killed/unknown).
inline int reap_child(pid_t pid, bool kill_first) {
  if (pid <= 0) return -1;
  if (kill_first) ::kill(pid, SIGKILL);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return -1;
}

/// Waits up to `grace` for a child to exit on its own (pidfd + poll, no sleeping), then kills it
/// if it has not; reaps it and returns its exit status (-1 if killed/unknown).
inline int reap_child_within(pid_t pid, Duration grace) {
  if (pid <= 0) return -1;
  const int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  bool exited = false;
  if (pfd >= 0) {
    pollfd p{pfd, POLLIN, 0};
    int rc;
    while ((rc = ::poll(&p, 1, static_cast<int>(grace.count()))) < 0 && errno == EINTR) {
    }
    exited = rc > 0;
    ::close(pfd);
  }
  return reap_child(pid, !exited);
}

struct Pipe {
  int r = -1, w = -1;
  static Pipe make() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("pipe2");
      std::exit(2);
    }
    return {fds[0], fds[1]};
  }
  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

inline bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    s.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

/// Reads one '\n'-terminated line (without the '\n'). nullopt on EOF, error or timeout.
inline std::optional<std::string> read_line(int fd, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string line;
  for (;;) {
    const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now()).count();
    if (left <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return std::nullopt;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    line.push_back(c);
    if (line.size() > 4096) return std::nullopt;
  }
}

/// Blocks until the other end of the pipe is closed (or the parent died, which closes it too).
inline void wait_for_eof(int fd) {
  char buf[64];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR)) return;
  }
}

// --- a Host on its own io_context thread --------------------------------------------------------

class HostThread {
 public:
  HostThread() : guard_(asio::make_work_guard(io_)) {}
  ~HostThread() { stop(Duration(5000)); }
  HostThread(const HostThread&) = delete;
  HostThread& operator=(const HostThread&) = delete;

  /// Creates the host (throws transport::ConfigError). Register handlers, then start() and run().
  transport::Host& create(transport::Identity id, transport::HostOptions opts) {
    host_ = transport::Host::create(io_, std::move(id), std::move(opts));
    return *host_;
  }
  transport::Host& host() { return *host_; }
  std::shared_ptr<transport::Host> host_ptr() { return host_; }

  /// Starts the io thread (call after Host::start(), which is not thread-safe with the strand).
  void run() {
    thread_ = std::thread([this] { io_.run(); });
  }

  /// host->shutdown(), waits (at most `max`) until every session is gone, stops the io_context,
  /// joins its thread and drains the worker pool. Returns false if sessions were still open.
  bool stop(Duration max) {
    if (stopped_) return clean_;
    stopped_ = true;
    if (host_ && thread_.joinable()) {
      host_->shutdown();
      clean_ = wait_closed(max);
    }
    guard_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
    transport::quiesce_worker_pool();
    host_.reset();
    return clean_;
  }

 private:
  // Polls the host's session table on its strand until it is empty (shutdown only).
  struct Poller : std::enable_shared_from_this<Poller> {
    std::shared_ptr<transport::Host> host;
    asio::steady_timer timer;
    std::promise<void> done;
    bool set = false;
    explicit Poller(std::shared_ptr<transport::Host> h)
        : host(std::move(h)), timer(host->executor()) {}
    void check() {
      const auto st = host->stats();
      if (st.sessions == 0 && st.half_open == 0) {
        if (!set) done.set_value();
        set = true;
        return;
      }
      timer.expires_after(std::chrono::milliseconds(2));
      timer.async_wait([w = weak_from_this()](boost::system::error_code ec) {
        if (auto self = w.lock(); self && !ec) self->check();
      });
    }
  };

  bool wait_closed(Duration max) {
    auto p = std::make_shared<Poller>(host_);
    auto fut = p->done.get_future();
    asio::post(host_->executor(), [w = std::weak_ptr<Poller>(p)] {
      if (auto self = w.lock()) self->check();
    });
    const bool ok = fut.wait_for(max) == std::future_status::ready;
    // Cancel the timer on the strand before dropping the poller.
    auto cancelled = std::make_shared<std::promise<void>>();
    auto cf = cancelled->get_future();
    asio::post(host_->executor(), [p, cancelled] {
      p->timer.cancel();
      cancelled->set_value();
    });
    cf.wait_for(Duration(1000));
    return ok;
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::shared_ptr<transport::Host> host_;
  std::thread thread_;
  bool stopped_ = false;
  bool clean_ = true;
};

/// Waits for a future with a deadline; nullopt on timeout.
template <class T>
std::optional<T> wait_value(std::future<T>& f, Duration timeout) {
  if (f.wait_for(timeout) != std::future_status::ready) return std::nullopt;
  return f.get();
}

}  // namespace grove::bench
