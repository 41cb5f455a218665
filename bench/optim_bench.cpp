// Outer-step throughput on flat float32 buffers, as a ratio to single-threaded memcpy bandwidth
// measured in the same run (target: outer steps >= 0.5x memcpy). Two ratios per row:
//   params  parameter bytes processed per second (n * 4 / time) over bytes copied per second;
//   traffic bytes the step reads and writes per second (streams * n * 4 / time) over memcpy's
//           (2 * n * 4 / time): how close the step runs to the memory bandwidth memcpy gets.
// A step over k buffers cannot beat 2/k on the first ratio once both are memory-bound.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "optim/outer.hpp"

using namespace grove::optim;
using Clock = std::chrono::steady_clock;

namespace {

// Median seconds of `reps` runs of fn.
double time_median(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{16} << 20;  // 16M floats = 64 MiB per buffer (beyond any cache)
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--values" && i + 1 < argc)
      n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--values N] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  if (n == 0 || reps <= 0) {
    std::fprintf(stderr, "optim_bench: --values and --reps must be positive\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> a(n), b(n), c(n), e(n);
  for (auto* v : {&a, &b, &c, &e})
    for (auto& x : *v) x = d(rng) * 0.01f;
  const double gb = static_cast<double>(n) * 4 / 1e9;

  const double t_memcpy = time_median(reps, [&] { std::memcpy(e.data(), a.data(), n * 4); });
  const double memcpy_gbs = gb / t_memcpy;
  std::printf(
      "optim outer steps, %zu float32 values (%.0f MiB per buffer), median of %d, 1 thread\n", n,
      n * 4 / 1048576.0, reps);
  std::printf("  %-38s %8.2f GB/s   (baseline)\n", "memcpy", memcpy_gbs);
  struct Row {
    const char* name;
    int streams;  // buffers read + buffers written
    std::function<void()> fn;
  };
  std::vector<float> phi = a, m(n, 0.0f);
  const std::vector<Row> rows = {
      {"DiLoCo Nesterov step", 5, [&] { diloco_step(phi, m, b, DiLoCoConfig{}); }},
      {"NoLoCo step (two tensors)", 6, [&] { noloco_step(phi, m, b, c, NoLoCoConfig{}); }},
      {"NoLoCo step (one tensor, beta = gamma)", 5,
       [&] { noloco_step_theta(phi, m, b, NoLoCoConfig{}); }},
      {"SparseLoCo error feedback e = b*e + d", 3, [&] { error_feedback_accumulate(e, b, 0.95f); }},
      {"apply mean update phi -= lr*u", 3, [&] { apply_mean_update(phi, b, 1.0f); }},
      {"overlap mix", 5, [&] { overlap_mix(e, phi, b, 0.5f); }},
      {"pseudo-gradient d = phi - theta", 3, [&] { pseudo_gradient(a, b, c); }},
  };
  std::printf("  %-38s %8s %8s %8s\n", "", "GB/s", "params", "traffic");
  double worst = 1e9, worst_traffic = 1e9;
  for (const auto& r : rows) {
    const double gbs = gb / time_median(reps, r.fn);
    const double ratio = gbs / memcpy_gbs, traffic = ratio * r.streams / 2.0;
    worst = std::min(worst, ratio);
    worst_traffic = std::min(worst_traffic, traffic);
    std::printf("  %-38s %8.2f %7.2fx %7.2fx  (%d buffers)\n", r.name, gbs, ratio, traffic,
                r.streams);
  }
  std::printf(
      "  worst: %.2fx memcpy in parameter bytes (target >= 0.5x), %.2fx in memory traffic\n", worst,
      worst_traffic);
  return 0;
}
