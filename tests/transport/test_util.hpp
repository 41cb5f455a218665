// Shared helpers for transport tests: an io_context on its own thread, host factories, and
// waiting on a condition with a deadline (never a bare sleep).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "transport/host.hpp"

namespace grove::transport::test {

using namespace std::chrono_literals;

/// Runs `fn` on `ex` and returns its result (blocking the test thread, with a deadline).
template <class F>
auto run_on(const boost::asio::any_io_executor& ex, F fn, std::chrono::seconds limit = 30s) {
  using R = decltype(fn());
  std::promise<R> p;
  auto fut = p.get_future();
  boost::asio::post(ex, [&] {
    try {
      if constexpr (std::is_void_v<R>) {
        fn();
        p.set_value();
      } else {
        p.set_value(fn());
      }
    } catch (...) {
      p.set_exception(std::current_exception());
    }
  });
  if (fut.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "run_on: deadline exceeded";
    std::abort();  // the lambda references this frame; cannot return safely
  }
  return fut.get();
}

/// Waits for a future with a deadline; fails the test (and returns nullopt) when it expires.
template <class T>
std::optional<T> await(std::future<T>& f, std::chrono::milliseconds limit = 30s) {
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "await: deadline exceeded";
    return std::nullopt;
  }
  return f.get();
}

/// Polls `pred` on `ex` until it holds or the deadline passes.
template <class P>
bool eventually(const boost::asio::any_io_executor& ex, P pred,
                std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (run_on(ex, pred)) return true;
    std::this_thread::yield();
  }
  return false;
}

/// An io_context running on a background thread, plus the hosts that use it. The destructor
/// shuts the hosts down, waits for their sessions to close, drains the worker pool and stops.
class World {
 public:
  World() : work_(io_.get_executor()), thread_([this] { io_.run(); }) {}
  ~World() { stop(); }

  std::shared_ptr<Host> host(HostOptions o = {}, std::optional<Identity> id = std::nullopt) {
    if (mem_) o.mem_network = mem_;
    auto h = Host::create(io_, id ? *id : Identity::generate(), std::move(o));
    hosts_.push_back(h);
    return h;
  }
  /// start() on the strand (listening binds there).
  void start(const std::shared_ptr<Host>& h) {
    run_on(h->executor(), [&] { h->start(); });
  }
  void use_memory_network() { mem_ = std::make_shared<MemNetwork>(); }
  boost::asio::io_context& io() { return io_; }

  void stop() {
    if (stopped_) return;
    stopped_ = true;
    for (auto& h : hosts_) h->shutdown();
    for (auto& h : hosts_)
      eventually(
          h->executor(), [&] { return h->stats().sessions == 0; }, 10s);
    quiesce_worker_pool();
    work_.reset();
    io_.stop();
    thread_.join();
    hosts_.clear();
  }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  std::vector<std::shared_ptr<Host>> hosts_;
  std::shared_ptr<MemNetwork> mem_;
  bool stopped_ = false;
};

/// Request helper: blocks the test thread until the response arrives (or the deadline).
inline Result<std::string> call(const std::shared_ptr<Host>& h, const PeerRef& to,
                                const std::string& method, const std::string& body,
                                std::chrono::milliseconds timeout = 5s) {
  std::promise<Result<std::string>> p;
  auto f = p.get_future();
  h->request(to, method,
             Bytes::copy_of({reinterpret_cast<const std::uint8_t*>(body.data()), body.size()}),
             timeout, [&p](Result<Payload> r) {
               if (!r) return p.set_value(r.error());
               auto b = r->bytes();
               p.set_value(std::string(b.begin(), b.end()));
             });
  auto r = await(f, timeout + 20s);
  return r ? *r : Result<std::string>(errc::timed_out);
}

inline std::span<const std::uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// Registers an "echo" method.
inline void add_echo(const std::shared_ptr<Host>& h) {
  h->handle("echo", [](const PeerInfo&, Payload body, Responder r) { r.reply(body.bytes()); });
}

/// A stream source over a deterministic pseudo-random byte pattern (no big allocation).
class PatternSource : public StreamSource {
 public:
  PatternSource(std::uint64_t size, std::uint64_t seed) : size_(size), seed_(seed) {}
  std::uint64_t size() const override { return size_; }
  Result<void> read(std::uint64_t off, std::span<std::uint8_t> out) override {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = byte_at(off + i, seed_);
    return {};
  }
  static std::uint8_t byte_at(std::uint64_t i, std::uint64_t seed) {
    std::uint64_t x = (i / 8) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return static_cast<std::uint8_t>(x >> (8 * (i % 8)));
  }

 private:
  std::uint64_t size_, seed_;
};

}  // namespace grove::transport::test
