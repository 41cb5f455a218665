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

#include "bench/args.hpp"
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
  grove::bench::Args args(argc, argv,
                          "[--model small] [--batch 16] [--seq 128] [--threads 0] [--steps 300]\n"
                          "       [--lr 0.001] [--warmup 100] [--timed 20] [--eval-every 100]");
  while (args.next()) {
    if (args.is("--model"))
      c.model = args.value();
    else if (args.is("--batch"))
      c.batch = args.number<std::uint32_t>();
    else if (args.is("--seq"))
      c.seq_len = args.number<std::uint32_t>();
    else if (args.is("--threads"))
      spec.threads = args.number<unsigned>();
    else if (args.is("--steps"))
      steps = args.number<unsigned>();
    else if (args.is("--lr"))
      c.lr = args.number<float>();
    else if (args.is("--warmup"))
      c.warmup = args.number<std::uint32_t>();
    else if (args.is("--timed"))
      timed = args.number<unsigned>();
    else if (args.is("--eval-every"))
      eval_every = args.number(1u);
    else
      args.unknown();
  }
  c.schedule_steps = std::max<std::uint32_t>(steps, c.warmup + 1);
  if (const auto e = c.check(); !e.empty()) args.fail("bad option: " + e);
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
