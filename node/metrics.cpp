#include "node/metrics.hpp"

#include <chrono>
#include <cmath>

#include "node/status.hpp"
#include "transport/error.hpp"

namespace grove::node {

// One JSON object under construction: the progress fields first, then the event's own.
class Metrics::Line {
 public:
  Line(const Progress& p, const char* event) {
    const auto now = std::chrono::system_clock::now();
    const double t = std::chrono::duration<double>(now.time_since_epoch()).count();
    s_ = "{\"time\":" + std::to_string(t);
    str("node", p.node).str("event", event).count("step", p.step).count("round", p.round);
    num("loss", p.loss).num("eval_loss", p.eval_loss);
    std::string partners;
    for (const auto& id : p.partners) partners += (partners.empty() ? "" : ",") + json_string(id);
    raw("partners", "[" + partners + "]");
    count("bytes_sent", p.bytes_sent).count("bytes_received", p.bytes_received);
    raw("sync_ms", std::to_string(p.sync_ms)).count("members", p.members);
    str("param_hash", p.param_hash);
  }
  Line& raw(const char* key, const std::string& v) {
    s_ += std::string(",\"") + key + "\":" + v;
    return *this;
  }
  Line& str(const char* key, const std::string& v) { return raw(key, json_string(v)); }
  Line& num(const char* key, double v) { return raw(key, json_number(v)); }
  Line& count(const char* key, std::uint64_t v) { return raw(key, std::to_string(v)); }
  Line& flag(const char* key, bool v) { return raw(key, v ? "true" : "false"); }
  std::string text() const { return s_ + "}\n"; }

 private:
  std::string s_;
};

Metrics::Metrics(const std::optional<std::string>& path) {
  if (!path) return;
  out_.open(*path, std::ios::app);
  if (!out_) throw transport::ConfigError("cannot open metrics file '" + *path + "'");
}

void Metrics::emit(const Line& l) {
  if (!out_.is_open()) return;
  out_ << l.text();
  out_.flush();
}

void Metrics::write(const Progress& p, const event::Start& e) {
  emit(
      Line(p, "start").str("run", e.run).count("params", e.params).num("loss_floor", e.loss_floor));
}

void Metrics::write(const Progress& p, const event::Eval& e) {
  emit(Line(p, "eval").num("loss_floor", e.loss_floor));
}

void Metrics::write(const Progress& p, const event::Round& e) {
  emit(Line(p, e.synced ? "synced" : "round")
           .str("mode", e.mode)
           .num("tokens_per_s", e.tokens_per_s)
           .count("round_bytes_sent", e.bytes_sent)
           .count("round_bytes_received", e.bytes_received)
           .num("transfer_s", e.transfer_s)
           .flag("local_only", e.local_only)
           .str("note", e.note)
           .num("compute_s", e.compute_s)
           .num("eval_s", e.eval_s)
           .num("wall_s", e.wall_s));
}

void Metrics::write(const Progress& p, const event::Stop& e) {
  emit(Line(p, "stop")
           .num("first_eval_loss", e.first_eval_loss)
           .num("loss_floor", e.loss_floor)
           .count("rounds_averaged", e.rounds_averaged)
           .count("rounds_local", e.rounds_local)
           .count("syncs", e.syncs)
           .num("compute_s", e.compute_s)
           .num("eval_s", e.eval_s)
           .num("wall_s", e.wall_s)
           .num("utilization", e.utilization)
           .num("peak_rss_bytes", e.peak_rss_bytes)
           .num("param_bytes", e.param_bytes)
           .count("checkpoints", e.checkpoints)
           .num("checkpoint_s", e.checkpoint_s));
}

void Metrics::write(const Progress& p, const event::Handoff& e) {
  emit(Line(p, "handoff")
           .num("bytes", e.bytes)
           .num("get_ms", e.get_ms)
           .num("set_ms", e.set_ms)
           .num("set_bytes", e.set_bytes)
           .num("memcpy_ms", e.memcpy_ms));
}

}  // namespace grove::node
