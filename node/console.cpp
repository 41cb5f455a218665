#include "node/console.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <spdlog/fmt/fmt.h>

#include "node/status.hpp"

namespace grove::node {

namespace {
unsigned long long ull(std::uint64_t v) {
  return static_cast<unsigned long long>(v);
}

// "3 members", or "2 members (+1 idle)" when some have no trainer (they train nothing).
std::string members_text(const Progress& p) {
  return fmt::format("{} member{}{}", p.members, p.members == 1 ? "" : "s",
                     p.idle ? fmt::format(" (+{} idle)", p.idle) : std::string());
}

// What is known of the evaluation, never "null": "<label> 2.3456 (floor 2.1)", "<label>
// 2.3456" without a floor (an external trainer's model), "" without an evaluation (the trainer
// reports none).
std::string eval_text(const char* label, double eval, double floor) {
  if (!std::isfinite(eval)) return "";
  std::string s = fmt::format("{} {:.6g}", label, eval);
  if (std::isfinite(floor)) s += fmt::format(" (floor {:.6g})", floor);
  return s;
}
}  // namespace

Console::Console(bool progress) : progress_(progress), tty_(::isatty(STDOUT_FILENO) != 0) {}

void Console::banner(const std::string& node, const std::string& run, const std::string& workload,
                     const std::string& outer, const std::string& codec,
                     const std::string& advertise) {
  std::printf("grove-node %s\n  run      %s (%s, %s outer, %s on the wire)\n  listening %s\n",
              node.c_str(), run.c_str(), workload.c_str(), outer.c_str(), codec.c_str(),
              advertise.c_str());
  std::fflush(stdout);
}

void Console::join_command(const std::string& command) {
  std::printf("  join with: %s\n", command.c_str());
  std::fflush(stdout);
}

void Console::synced(std::uint64_t round, double eval, double floor) {
  const std::string e = eval_text("eval loss", eval, floor);
  std::printf("  synced   round %llu from the swarm%s%s\n", ull(round), e.empty() ? "" : ": ",
              e.c_str());
  std::fflush(stdout);
}

void Console::syncing(std::uint64_t bytes, std::uint64_t total, double rate) {
  const auto now = std::chrono::steady_clock::now();
  if (!progress_ || (bytes < total && now - last_sync_ < std::chrono::seconds(5))) return;
  last_sync_ = now;
  const double left = rate > 0 ? static_cast<double>(total - std::min(bytes, total)) / rate : NAN;
  std::printf("  syncing  %.2f of %.2f GB (%.0f%%)%s\n", bytes / 1e9, total / 1e9,
              total ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total) : 0.0,
              std::isfinite(left)
                  ? fmt::format(" at {:.2f} MB/s, {:.0f} s left", rate / 1e6, left).c_str()
                  : "");
  std::fflush(stdout);
}

void Console::resumed(std::uint64_t round, std::uint64_t step) {
  std::printf("  resumed  round %llu, step %llu from the checkpoint\n", ull(round), ull(step));
  std::fflush(stdout);
}

void Console::started(double eval, double floor) {
  const std::string e = eval_text("eval loss", eval, floor);
  std::printf("  start    %s\n",
              e.empty() ? "training (its trainer reports no evaluation)" : e.c_str());
  std::fflush(stdout);
}

void Console::trainer_socket(const std::string& path) {
  std::printf("  trainer  attach with grove.attach(socket=\"%s\") (waiting for one)\n",
              path.c_str());
  std::fflush(stdout);
}

void Console::live(const Tally& t, double rate, double floor) {
  if (!progress_ || !tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_live_ < std::chrono::seconds(1)) return;
  last_live_ = now;
  const auto& p = t.progress;
  const std::string e = eval_text("  eval", p.eval_loss, floor);
  std::printf("\r\033[Kstep %llu  loss %.4f%s  %.0f tok/s  %s  %s", ull(p.step), p.loss, e.c_str(),
              rate, members_text(p).c_str(),
              t.last_sync.empty() ? "no sync yet" : ("last sync " + t.last_sync).c_str());
  std::fflush(stdout);
}

void Console::round(const Tally& t, const std::string& mode, double floor) {
  if (!progress_) return;
  const auto& p = t.progress;
  const std::string e = eval_text("  eval", p.eval_loss, floor);
  std::printf("%sstep %6llu  round %4llu  loss %.4f%s  %.0f tok/s  %s  %s %s\n",
              tty_ ? "\r\033[K" : "", ull(p.step), ull(p.round), p.loss, e.c_str(), t.tokens_per_s,
              members_text(p).c_str(), mode.c_str(), t.last_sync.c_str());
  std::fflush(stdout);
}

void Console::summary(const Tally& t, const Outcome& o) {
  const auto& p = t.progress;
  const std::uint64_t n_rounds = t.rounds_averaged + t.rounds_local;
  std::string e;  // ": eval loss X (floor F; Y at the first evaluation)", what is known of it
  if (std::isfinite(p.eval_loss)) {
    std::string notes;
    if (std::isfinite(o.loss_floor)) notes = fmt::format("floor {:.6g}", o.loss_floor);
    if (std::isfinite(t.first_eval))
      notes +=
          fmt::format("{}{:.6g} at the first evaluation", notes.empty() ? "" : "; ", t.first_eval);
    e = fmt::format(": eval loss {:.6g}{}", p.eval_loss, notes.empty() ? "" : " (" + notes + ")");
  }
  std::printf("%sstopped at step %llu, round %llu%s\n", progress_ && tty_ ? "\r\033[K" : "",
              ull(p.step), ull(p.round), e.c_str());
  std::printf("  node      %s, run %s, %.2f M tokens trained here\n", p.node.c_str(), o.run.c_str(),
              static_cast<double>(t.tokens) / 1e6);
  std::printf("  rounds    %llu here: %llu averaged, %llu local-only; %llu state sync(s)\n",
              ull(n_rounds), ull(t.rounds_averaged), ull(t.rounds_local), ull(t.syncs));
  const auto& c = o.checkpoints;
  std::printf(
      "  checkpts  %llu written in the background (mean %.2f s each), %llu skipped (a newer "
      "round came while they waited)\n",
      ull(c.written), c.written ? c.mean_s : 0.0, ull(c.skipped));
  std::printf("  traffic   %.1f MB sent, %.1f MB received; mean sync %.0f ms, mean round %.1f s\n",
              static_cast<double>(p.bytes_sent) / 1e6, static_cast<double>(p.bytes_received) / 1e6,
              n_rounds ? t.sync_ms_sum / static_cast<double>(n_rounds) : 0.0,
              t.round_count ? t.round_time_sum / static_cast<double>(t.round_count) : 0.0);
  std::printf("  compute   %.1f%% of %.0f s in inner steps (%.0f s evaluating)\n",
              100 * o.utilization, o.wall_s, t.eval_s);
  std::printf("  memory    peak %.0f MB resident; parameters %.1f MB\n", o.peak_rss_bytes / 1e6,
              o.param_bytes / 1e6);
  if (o.handoff) {
    const auto& h = *o.handoff;
    std::printf(
        "  trainer   %.1f MB of parameters; the node took them %llu time(s), %.1f ms each, gave "
        "them %llu time(s), %.1f ms and %.1f MB each; a memcpy of the same bytes: %.1f ms\n",
        h.bytes / 1e6, ull(h.gets), ms_each(h.get_s, h.gets), ull(h.sets), ms_each(h.set_s, h.sets),
        h.sets ? h.set_bytes / 1e6 / static_cast<double>(h.sets) : 0.0, 1e3 * h.memcpy_s);
  }
  using transport::Reachability;
  std::printf(
      "  network   %s; %llu connection(s) dialed back at our request; relayed for others: %llu "
      "circuit(s), %llu dial-back(s) passed on\n",
      o.reach == Reachability::reachable     ? "reachable"
      : o.reach == Reachability::unreachable ? "not reachable (through relays)"
                                             : "reachability unchecked",
      ull(o.host.dialbacks), ull(o.relay.circuits_total), ull(o.relay.reversals));
  std::fflush(stdout);
}

}  // namespace grove::node
