// splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", 2014): the
// one 64-bit mixing function of the project. It turns a counter or a seed into well-spread bits
// with integer operations only, so every machine draws the same values: a round's NoLoCo
// fragment from its window, the positions a state probe samples, a workload's initial θ and data
// order, a benchmark's tensor contents.
#pragma once

#include <cstdint>

namespace grove::optim {

/// The golden-ratio increment: value k of a stream seeded s is splitmix64(s + k * γ).
inline constexpr std::uint64_t kSplitmixGamma = 0x9e3779b97f4a7c15ull;

/// splitmix64's output for the state x (the mix of x + γ).
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += kSplitmixGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace grove::optim
