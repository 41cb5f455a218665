// guarded(alive, f): a callback that does nothing once its owner is gone. The DHT and the
// membership outlive the cores that give them callbacks (a get in flight when the round engine
// is destroyed); the owner holds `alive` and sets it false in its destructor.
#pragma once

#include <memory>
#include <utility>

namespace grove::gossip {

template <class F>
auto guarded(const std::shared_ptr<bool>& alive, F f) {
  return [w = std::weak_ptr<bool>(alive), f = std::move(f)](auto&&... args) mutable {
    if (auto a = w.lock(); a && *a) f(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace grove::gossip
