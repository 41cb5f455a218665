// Metrics over float32 buffers (codecs.hpp), accumulated in double: l2_norm, rms_distance and
// the mass a top-k message kept.
#include <cmath>

#include "optim/codecs.hpp"

namespace grove::optim {

double l2_norm(const float* x, std::size_t n) {
  // Eight independent partial sums (one dependent add chain made this latency-bound: ~4 cycles
  // per value); in double, so the result is finite exactly when every value is.
  double acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  double s = 0.0;
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  for (const double a : acc) s += a;
  return std::sqrt(s);
}

double rms_distance(const float* a, const float* b, std::size_t n) {
  if (n == 0) return 0.0;
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s / static_cast<double>(n));
}

double mass_kept(const float* e_before, const float* sent, std::size_t n) {
  double eb = 0.0, se = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    eb += static_cast<double>(e_before[i]) * e_before[i];
    se += static_cast<double>(sent[i]) * sent[i];
  }
  if (eb == 0.0) return 1.0;
  return se / eb;
}

}  // namespace grove::optim
