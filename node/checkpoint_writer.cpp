#include "node/checkpoint_writer.hpp"

#include <chrono>
#include <cmath>

#include <spdlog/spdlog.h>

namespace grove::node {

void CheckpointWriter::add(Checkpoint c) {
  if (last_ == std::pair{c.round, c.step}) return;
  last_ = {c.round, c.step};
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    if (job_) ++skipped_;
    job_ = std::move(c);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
}

void CheckpointWriter::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || job_.has_value(); });
    if (!job_) return;
    const Checkpoint c = std::move(*job_);
    job_.reset();
    busy_ = true;
    lk.unlock();
    if (on_busy_) on_busy_(true);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ec =
        save_checkpoint(dir_, c,
                        keeps_previous_checkpoint(c.outer_blob ? c.outer_blob->size()
                                                               : optim::serialized_size(c.outer)));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ec) spdlog::error("checkpoint not written ({}); the previous one stays", ec.message());
    if (on_busy_) on_busy_(false);
    lk.lock();
    busy_ = false;
    if (!ec) {
      ++written_;
      seconds_ += s;
    }
    cv_.notify_all();
  }
}

void CheckpointWriter::stop() {
  {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !busy_ && !job_; });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CheckpointWriter::Stats CheckpointWriter::stats() const {
  std::lock_guard lk(mu_);
  return {written_, skipped_, written_ ? seconds_ / static_cast<double>(written_) : NAN};
}

}  // namespace grove::node
