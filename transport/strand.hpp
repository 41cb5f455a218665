// Crossing between a strand and a thread that waits for it: the one place the node's threads
// post work to a strand and wait for its result, or wait for a callback that a strand runs.
// Never call these from the strand itself: it would wait on itself.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <type_traits>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>

namespace grove::transport {

/// Runs fn() on `ex` and returns its result (rethrows what it threw). Start-up, shutdown and a
/// training thread's reads of strand-owned state.
template <class F>
auto run_on(const boost::asio::any_io_executor& ex, F fn) -> decltype(fn()) {
  using R = decltype(fn());
  auto p = std::make_shared<std::promise<R>>();
  auto fut = p->get_future();
  boost::asio::post(ex, [p, fn = std::move(fn)]() mutable {
    try {
      if constexpr (std::is_void_v<R>) {
        fn();
        p->set_value();
      } else {
        p->set_value(fn());
      }
    } catch (...) {
      p->set_exception(std::current_exception());
    }
  });
  return fut.get();
}

/// A value a callback delivers once, on another thread, to a thread that waits for it with a
/// deadline. The callback stays valid after the waiter gave up (the state is shared), and a
/// second delivery is ignored.
template <class T>
class Rendezvous {
 public:
  Rendezvous() : state_(std::make_shared<State>()), fut_(state_->p.get_future()) {}
  /// The callback to hand to the asynchronous operation.
  auto callback() const {
    return [s = state_](T v) {
      if (s->set.exchange(true)) return;
      s->p.set_value(std::move(v));
    };
  }
  /// The value, or nullopt when it did not come within `limit`.
  template <class Rep, class Period>
  std::optional<T> wait_for(std::chrono::duration<Rep, Period> limit) {
    if (fut_.wait_for(limit) != std::future_status::ready) return std::nullopt;
    return fut_.get();
  }

 private:
  struct State {
    std::promise<T> p;
    std::atomic<bool> set{false};
  };
  std::shared_ptr<State> state_;
  std::future<T> fut_;
};

}  // namespace grove::transport
