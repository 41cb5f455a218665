#include "node/workload.hpp"

#include <atomic>
#include <cmath>

#include "transport/error.hpp"

namespace grove::node {

namespace {
std::atomic<WorkloadFactory> gpt_factory{nullptr};
}

void set_gpt_factory(WorkloadFactory f) {
  gpt_factory.store(f);
}

std::unique_ptr<Workload> make_workload(const WorkloadSpec& spec) {
  if (auto e = spec.config.check(); !e.empty()) throw transport::ConfigError("run config: " + e);
  if (spec.config.data == DataKind::files && spec.data_files.empty())
    throw transport::ConfigError(
        "this run trains on files: give this node its own text with --data FILE...");
  if (spec.config.data == DataKind::synthetic && !spec.data_files.empty())
    throw transport::ConfigError(
        "this run trains on its built-in synthetic corpus: --data is not used (bootstrap a run "
        "with --data to train on files)");
  switch (spec.config.workload) {
    case WorkloadKind::mlp:
      return make_mlp_workload(spec);
    case WorkloadKind::external:
      throw transport::ConfigError("an external workload is the trainer's (ExternalWorkload)");
    case WorkloadKind::gpt:
      if (auto f = gpt_factory.load()) return f(spec);
      throw transport::ConfigError(
          "this grove-node was built without libtorch: the gpt workload is not available");
  }
  throw transport::ConfigError("unknown workload");
}

double inner_lr(const RunConfig& c, std::uint64_t step) {
  const double peak = c.lr;
  if (c.warmup > 0 && step < c.warmup)
    return peak * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  if (step >= c.schedule_steps) return peak * c.lr_min_ratio;
  const double span = static_cast<double>(c.schedule_steps - c.warmup);
  const double t = span > 0 ? static_cast<double>(step - c.warmup) / span : 1.0;
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * t));
  return peak * (c.lr_min_ratio + (1.0 - c.lr_min_ratio) * cosine);
}

}  // namespace grove::node
