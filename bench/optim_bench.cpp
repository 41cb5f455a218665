// Outer-step and codec throughput on flat float32 buffers, as a ratio to single-threaded memcpy
// bandwidth measured in the same run (targets: outer steps >= 0.5x, codecs >= 0.25x). Outer steps:
//   params  parameter bytes processed per second (n * 4 / time) over bytes copied per second;
//   traffic bytes the step reads and writes per second (streams * n * 4 / time) over memcpy's
//           (2 * n * 4 / time): how close the step runs to the memory bandwidth memcpy gets.
// A step over k buffers cannot beat 2/k on the first ratio once both are memory-bound, and one
// core does not reach the memory bandwidth here, so each step runs on 1 thread and on every
// hardware thread (what the node does); memcpy stays single-threaded, the baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/args.hpp"
#include "optim/codecs.hpp"
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
  unsigned threads = 0;  // the threaded rows: 0 = every hardware thread
  grove::bench::Args args(argc, argv, "[--values N] [--reps R] [--threads T]");
  while (args.next()) {
    if (args.is("--values"))
      n = args.number<std::size_t>(1);
    else if (args.is("--reps"))
      reps = args.number(1);
    else if (args.is("--threads"))
      threads = args.number(0u);
    else
      args.unknown();
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> a(n), b(n), c(n), e(n);
  for (auto* v : {&a, &b, &c, &e})
    for (auto& x : *v) x = d(rng) * 0.01f;
  const double gb = static_cast<double>(n) * 4 / 1e9;

  const double t_memcpy = time_median(reps, [&] { std::memcpy(e.data(), a.data(), n * 4); });
  const double memcpy_gbs = gb / t_memcpy;
  std::printf("optim, %zu float32 values (%.0f MiB per buffer), median of %d\n", n,
              n * 4 / 1048576.0, reps);
  std::printf("  %-40s %8.2f GB/s   (baseline, 1 thread)\n", "memcpy", memcpy_gbs);
  struct Row {
    const char* name;
    int streams;  // buffers read + buffers written
    std::function<void(unsigned)> fn;
  };
  std::vector<float> phi = a, m(n, 0.0f);
  const std::vector<Row> rows = {
      {"DiLoCo Nesterov step", 5, [&](unsigned t) { diloco_step(phi, m, b, {}, t); }},
      {"NoLoCo step (two tensors)", 6, [&](unsigned t) { noloco_step(phi, m, b, c, {}, t); }},
      {"NoLoCo step (one tensor, beta = gamma)", 5,
       [&](unsigned t) { noloco_step_theta(phi, m, b, {}, t); }},
      {"SparseLoCo error feedback e = b*e + d", 3,
       [&](unsigned t) { error_feedback_accumulate(e, b, 0.95f, t); }},
      {"apply mean update phi -= lr*u", 3, [&](unsigned t) { apply_mean_update(phi, b, 1.0f, t); }},
      {"overlap mix", 5, [&](unsigned t) { overlap_mix(e, phi, b, 0.5f, t); }},
      {"pseudo-gradient d = phi - theta", 3, [&](unsigned t) { pseudo_gradient(a, b, c, t); }},
  };
  const unsigned all = threads ? threads : std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  std::printf("  outer steps %28s %8s %8s %8s   %s\n", "", "GB/s", "params", "traffic",
              "(params ratio at 1 thread)");
  double worst = 1e9, worst1 = 1e9;
  for (const auto& r : rows) {
    const double r1 = gb / time_median(reps, [&] { r.fn(1); }) / memcpy_gbs;
    const double gbs = gb / time_median(reps, [&] { r.fn(all); });
    const double ratio = gbs / memcpy_gbs, traffic = ratio * r.streams / 2.0;
    worst = std::min(worst, ratio);
    worst1 = std::min(worst1, r1);
    std::printf("  %-40s %8.2f %7.2fx %7.2fx   (%.2fx)  %d buffers\n", r.name, gbs, ratio, traffic,
                r1, r.streams);
  }
  std::printf("  outer steps worst: %.2fx memcpy on %u threads (target >= 0.5x), %.2fx on 1\n",
              worst, all, worst1);

  // Codecs, one thread: GB/s of float32 input (encode) or output (decode).
  const TopKCodec topk{4096, 64, false}, topk2{4096, 64, true};
  std::vector<std::uint8_t> wire(std::max(
      {fp16_encoded_size(n), e3m0_encoded_size(n), topk.encoded_size(n), topk2.encoded_size(n)}));
  auto must = [](CodecError err) {
    if (err != CodecError::ok) {
      std::fprintf(stderr, "optim_bench: codec failed: %s\n", to_string(err));
      std::exit(1);
    }
  };
  auto w = [&](std::size_t size) { return std::span(wire).first(size); };
  std::vector<float> err_buf = b;
  struct Codec {
    const char* name;
    std::size_t wire_bytes;
    std::function<void()> enc, dec;
  };
  const std::vector<Codec> codecs = {
      {"fp16", fp16_encoded_size(n), [&] { must(fp16_encode(a, w(fp16_encoded_size(n)))); },
       [&] { must(fp16_decode(w(fp16_encoded_size(n)), c)); }},
      {"bf16", bf16_encoded_size(n), [&] { must(bf16_encode(a, w(bf16_encoded_size(n)))); },
       [&] { must(bf16_decode(w(bf16_encoded_size(n)), c)); }},
      {"E3M0 4-bit (block 256)", e3m0_encoded_size(n),
       [&] { must(e3m0_encode(a, w(e3m0_encoded_size(n)))); },
       [&] { must(e3m0_decode(w(e3m0_encoded_size(n)), c)); }},
      {"top-k 64/4096 fp32 values", topk.encoded_size(n),
       [&] { must(topk.encode(err_buf, w(topk.encoded_size(n)))); },
       [&] { must(topk.decode(w(topk.encoded_size(n)), c)); }},
      {"top-k 64/4096 2-bit values", topk2.encoded_size(n),
       [&] { must(topk2.encode(err_buf, w(topk2.encoded_size(n)))); },
       [&] { must(topk2.decode(w(topk2.encoded_size(n)), c)); }},
  };
  std::printf("  codecs (1 thread) %22s %8s %8s %8s %8s  %s\n", "", "enc GB/s", "ratio", "dec GB/s",
              "ratio", "wire bytes/value");
  double worst_codec = 1e9;
  for (const auto& k : codecs) {
    err_buf = b;
    const double enc = gb / time_median(reps, k.enc);
    const double dec = gb / time_median(reps, k.dec);
    worst_codec = std::min({worst_codec, enc / memcpy_gbs, dec / memcpy_gbs});
    std::printf("  %-40s %8.2f %7.2fx %8.2f %7.2fx  %.3f\n", k.name, enc, enc / memcpy_gbs, dec,
                dec / memcpy_gbs, static_cast<double>(k.wire_bytes) / static_cast<double>(n));
  }
  std::printf("  codecs worst: %.2fx memcpy (target >= 0.25x)\n", worst_codec);
  return 0;
}
