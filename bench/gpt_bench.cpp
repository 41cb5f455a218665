// Training speed and learning of the gpt workload on this machine, through the Workload
// interface only: parameter count, steps/s and tokens/s (median of timed blocks after a warm-up),
// and the held-out loss against the synthetic source's floor after a short run.
//
//   gpt_bench [--model small] [--batch 16] [--seq 128] [--threads 0] [--steps 300]
//             [--lr 0.001] [--warmup 100] [--timed 20] [--eval-every 100]
//
// --steps 0 only times (--timed steps after 3 warm-up steps); otherwise the run trains --steps
// steps with a cosine schedule over them and evaluates every --eval-every steps. Both end with the
// process's peak resident memory (getrusage), the "workload alone" baseline of bench/memory.py.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "node/config.hpp"

#include "node/workload.hpp"

using namespace grove::node;
using Clock = std::chrono::steady_clock;

static void print_peak_rss() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const double peak = static_cast<double>(ru.ru_maxrss) * 1024.0;
  std::printf("peak RSS %.0f bytes (%.1f MB)\n", peak, peak / 1e6);
}

int main(int argc, char** argv) {
  WorkloadSpec spec;
  RunConfig& c = spec.config;
  unsigned steps = 300, timed = 20, eval_every = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      c.model = v;
    else if (k == "--batch")
      c.batch = static_cast<std::uint32_t>(std::stoul(v));
    else if (k == "--seq")
      c.seq_len = static_cast<std::uint32_t>(std::stoul(v));
    else if (k == "--threads")
      spec.threads = static_cast<unsigned>(std::stoul(v));
    else if (k == "--steps")
      steps = static_cast<unsigned>(std::stoul(v));
    else if (k == "--lr")
      c.lr = std::stof(v);
    else if (k == "--warmup")
      c.warmup = static_cast<std::uint32_t>(std::stoul(v));
    else if (k == "--timed")
      timed = static_cast<unsigned>(std::stoul(v));
    else if (k == "--eval-every")
      eval_every = static_cast<unsigned>(std::stoul(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  c.schedule_steps = std::max<std::uint32_t>(steps, c.warmup + 1);
  if (const auto e = c.check(); !e.empty()) {
    std::fprintf(stderr, "bad option: %s\n", e.c_str());
    return 2;
  }
  const auto w = make_gpt_workload(spec);
  std::printf("%s, batch %u x seq %u, threads %u\n", w->describe().c_str(), c.batch, c.seq_len,
              spec.threads);

  if (steps == 0) {
    for (std::uint64_t s = 0; s < 3; ++s) w->train_step(s);
    std::vector<double> t;
    for (std::uint64_t s = 3; s < 3 + timed; ++s) {
      const auto a = Clock::now();
      w->train_step(s);
      t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
    }
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    std::printf("step median %.1f ms (min %.1f, max %.1f): %.2f steps/s, %.0f tokens/s\n",
                med * 1e3, t.front() * 1e3, t.back() * 1e3, 1 / med,
                c.batch * double(c.seq_len) / med);
    print_peak_rss();
    return 0;
  }

  const double floor = w->loss_floor();
  std::printf("step %5u  eval %.4f  floor %.4f\n", 0u, w->evaluate(), floor);
  const auto start = Clock::now();
  double train = 0;
  for (std::uint64_t s = 0; s < steps; ++s) {
    train = w->train_step(s).loss;
    if ((s + 1) % eval_every == 0 || s + 1 == steps) {
      const double el = std::chrono::duration<double>(Clock::now() - start).count();
      const double eval = w->evaluate();
      std::printf("step %5llu  eval %.4f  floor %.4f  gap %.4f  train %.4f  %.1f s\n",
                  static_cast<unsigned long long>(s + 1), eval, floor, eval - floor, train, el);
      std::fflush(stdout);
    }
  }
  print_peak_rss();
  return 0;
}
