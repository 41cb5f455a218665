// TopModel (top.hpp): the dashboard's content, from successive swarm_status answers.
#include "node/top.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/fmt/fmt.h>

namespace grove::node {

namespace {

constexpr double kRateWindow = 5;  // seconds of answers a rate is taken over

// A number in at most `w` characters ("-" when absent; a peer's numbers are not trusted to be
// sane: too long for the column, it is shown in {:.2g}).
std::string num(double v, const char* spec, std::size_t w) {
  if (!std::isfinite(v)) return "-";
  std::string s = fmt::format(fmt::runtime(spec), v);
  if (s.size() > w) s = fmt::format("{:.2g}", v);
  return s.size() > w ? std::string(w, '#') : s;
}

// Bytes a second as "812K", "12.5M", "1.2G".
std::string rate(double bps) {
  if (!std::isfinite(bps)) return "-";
  if (bps < 1e3) return fmt::format("{:.0f}", bps);
  if (bps < 1e6) return fmt::format("{:.0f}K", bps / 1e3);
  if (bps < 1e9) return fmt::format("{:.1f}M", bps / 1e6);
  return fmt::format("{:.2f}G", bps / 1e9);
}

std::string state_of(const MemberStatus& m) {
  const std::string s = printable(m.status, 24);
  if (m.sync_total > 0) {
    const double pct = 100.0 * static_cast<double>(std::min(m.sync_bytes, m.sync_total)) /
                       static_cast<double>(m.sync_total);
    return fmt::format("{} {:.0f}%", s == "joining" ? "joining" : "catch-up", pct);
  }
  if (s == "averaging") return "syncing";
  if (s == "waiting for a trainer") return "no trainer";
  return s;
}

constexpr auto kRow =
    "{:<8} {:<13} {:>8} {:>6} {:>7} {:>7} {:>6} {:>7} {:>7} {:<8} {:>6} {:>6} {:>6} {:<3} {}";

double mean_of(const std::vector<double>& v) {
  double s = 0;
  std::size_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / static_cast<double>(n) : NAN;
}

}  // namespace

std::string sparkline(const std::deque<double>& v, std::size_t width) {
  static constexpr char kLevels[] = " .:-=+*#";
  const std::size_t n = std::min(v.size(), width);
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = v.size() - n; i < v.size(); ++i)
    if (std::isfinite(v[i])) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
  std::string s(width - n, ' ');
  for (std::size_t i = v.size() - n; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      s += ' ';
      continue;
    }
    const double f = hi > lo ? (v[i] - lo) / (hi - lo) : 0.5;
    s += kLevels[1 + std::min<std::size_t>(6, static_cast<std::size_t>(f * 7))];
  }
  return s;
}

const char* TopModel::sort_name(Sort s) {
  static constexpr const char* kNames[kSorts] = {"node", "state", "step",   "round",
                                                 "loss", "eval",  "tok/s",  "sync ms",
                                                 "in/s", "out/s", "address"};
  return kNames[static_cast<std::size_t>(s)];
}

void TopModel::update(const std::vector<MemberStatus>& members, double now) {
  error_.clear();
  std::vector<double> losses, syncs;
  for (auto& [id, s] : seen_) {
    if (!s.gone) s.gone_since = now;
    s.gone = true;
  }
  for (const auto& m : members) {
    if (m.node.empty()) continue;
    Seen& s = seen_[printable(m.node, 16)];
    s.gone = false;
    s.samples.emplace_back(now, m);
    while (s.samples.size() > 2 && now - s.samples[1].first >= kRateWindow) s.samples.pop_front();
    const std::uint64_t bytes = m.bytes_sent + m.bytes_received;
    if (!s.round_known || m.round != s.round) {
      if (s.round_known && bytes >= s.bytes_at_round)
        s.last_round_mb = static_cast<double>(bytes - s.bytes_at_round) / 1e6;
      s.round = m.round;
      s.bytes_at_round = bytes;
      s.round_known = true;
    }
    if (m.status != "unreachable") {
      losses.push_back(m.loss);
      syncs.push_back(m.last_sync_ms);
    }
  }
  // Members gone a minute are dropped; and however many ids answers invent, at most twice an
  // answer's members are kept (the gone ones go first).
  std::erase_if(seen_, [&](const auto& e) {
    return e.second.gone &&
           (now - e.second.gone_since > kGoneFor || seen_.size() > 2 * kMaxStatusMembers);
  });
  loss_.push_back(mean_of(losses));
  sync_.push_back(mean_of(syncs));
  while (loss_.size() > kHistory) loss_.pop_front();
  while (sync_.size() > kHistory) sync_.pop_front();
  rebuild();
}

void TopModel::rebuild() {
  rows_.clear();
  for (const auto& [id, s] : seen_) {
    if (s.samples.empty()) continue;
    TopRow r;
    r.m = s.samples.back().second;
    r.m.node = id;
    r.gone = s.gone;
    r.state = s.gone ? "gone" : state_of(r.m);
    r.last_round_mb = s.last_round_mb;
    const auto& [t0, first] = s.samples.front();
    const double dt = s.samples.back().first - t0;
    if (!s.gone && dt > 0 && r.m.bytes_sent >= first.bytes_sent &&
        r.m.bytes_received >= first.bytes_received) {
      r.out_bps = static_cast<double>(r.m.bytes_sent - first.bytes_sent) / dt;
      r.in_bps = static_cast<double>(r.m.bytes_received - first.bytes_received) / dt;
    }
    rows_.push_back(std::move(r));
  }
  const auto key = [&](const TopRow& r) -> double {
    switch (sort_) {
      case Sort::step:
        return static_cast<double>(r.m.step);
      case Sort::round:
        return static_cast<double>(r.m.round);
      case Sort::loss:
        return r.m.loss;
      case Sort::eval:
        return r.m.eval_loss;
      case Sort::tokens:
        return r.m.tokens_per_s;
      case Sort::sync:
        return r.m.last_sync_ms;
      case Sort::in:
        return r.in_bps;
      case Sort::out:
        return r.out_bps;
      default:
        return 0;
    }
  };
  const auto text = [&](const TopRow& r) -> const std::string& {
    return sort_ == Sort::state ? r.state : sort_ == Sort::address ? r.m.address : r.m.node;
  };
  const bool numeric = sort_ != Sort::node && sort_ != Sort::state && sort_ != Sort::address;
  std::stable_sort(rows_.begin(), rows_.end(), [&](const TopRow& a, const TopRow& b) {
    if (numeric) {
      const double x = key(a), y = key(b);
      if (std::isfinite(x) != std::isfinite(y)) return std::isfinite(x);  // absent ones last
      if (std::isfinite(x) && x != y) return descending_ ? x > y : x < y;
      return a.m.node < b.m.node;
    }
    const auto& x = text(a);
    const auto& y = text(b);
    if (x != y) return descending_ ? x > y : x < y;
    return a.m.node < b.m.node;
  });
  if (!rows_.empty() && !selected()) selected_ = rows_.front().m.node;
}

void TopModel::sort_next(int step) {
  const auto n = static_cast<int>(kSorts);
  sort_ = static_cast<Sort>(((static_cast<int>(sort_) + step) % n + n) % n);
  rebuild();
}

std::optional<std::size_t> TopModel::selected() const {
  for (std::size_t i = 0; i < rows_.size(); ++i)
    if (rows_[i].m.node == selected_) return i;
  return std::nullopt;
}

void TopModel::select(int delta) {
  if (rows_.empty()) return;
  const auto at = static_cast<long>(selected().value_or(0)) + delta;
  const auto i =
      static_cast<std::size_t>(std::clamp<long>(at, 0, static_cast<long>(rows_.size()) - 1));
  selected_ = rows_[i].m.node;
}

std::string TopModel::header_line() const {
  return fmt::format(kRow, "node", "state", "step", "round", "loss", "eval", "-floor", "tok/s",
                     "sync ms", "partner", "MB", "in/s", "out/s", "ok", "address");
}

std::string TopModel::row_line(const TopRow& r) const {
  const auto& m = r.m;
  const double over = m.eval_loss - m.loss_floor;
  return fmt::format(
      kRow, printable(m.node, 8), printable(r.state, 13), m.step, m.round, num(m.loss, "{:.4f}", 7),
      num(m.eval_loss, "{:.4f}", 7), num(over, "{:+.3f}", 6), num(m.tokens_per_s, "{:.0f}", 7),
      num(m.last_sync_ms, "{:.0f}", 7), m.last_partner.empty() ? "-" : printable(m.last_partner, 8),
      num(r.last_round_mb, "{:.1f}", 6), rate(r.in_bps), rate(r.out_bps),
      m.reachable ? "yes" : "no", printable(m.address, 64));
}

std::vector<std::string> TopModel::screen(std::size_t width, std::size_t height,
                                          const std::string& target, int& highlight) const {
  highlight = -1;
  std::vector<std::string> out;
  std::size_t training = 0, syncing = 0, joining = 0, idle = 0, gone = 0;
  for (const auto& r : rows_) {
    training += r.state == "training" || r.state == "checkpointing";
    syncing += r.state == "syncing" || r.state.rfind("catch-up", 0) == 0;
    joining += r.state.rfind("joining", 0) == 0;
    idle += r.state == "no trainer";
    gone += r.gone;
  }
  out.push_back(fmt::format(
      "grove-node top: {} ({} members: {} training, {} syncing, {} joining, {} idle, {} gone){}",
      printable(target, 64), rows_.size() - gone, training, syncing, joining, idle, gone,
      error_.empty() ? "" : "  [" + printable(error_, 80) + "]"));
  const std::size_t spark = width > 40 ? std::min<std::size_t>(width - 36, kHistory) : 4;
  const double loss = loss_.empty() ? NAN : loss_.back();
  const double sync = sync_.empty() ? NAN : sync_.back();
  out.push_back("loss    " + sparkline(loss_, spark) + "  " + num(loss, "{:.4f}", 10));
  out.push_back("sync ms " + sparkline(sync_, spark) + "  " + num(sync, "{:.0f}", 10));
  out.push_back("");
  out.push_back(header_line());
  const std::size_t footer = 2;
  const std::size_t room = height > out.size() + footer ? height - out.size() - footer : 0;
  const auto sel = selected();
  // The window of rows that holds the selected one.
  std::size_t first = 0;
  if (sel && *sel >= room && room > 0) first = *sel - room + 1;
  for (std::size_t i = first; i < rows_.size() && i < first + room; ++i) {
    if (sel && *sel == i) highlight = static_cast<int>(out.size());
    out.push_back(row_line(rows_[i]));
  }
  while (out.size() + footer < height) out.push_back("");
  std::string detail;
  if (sel) {
    const auto& m = rows_[*sel].m;
    detail = printable(m.node, 16) + "  " + printable(m.algorithm, 60) + "  run " +
             printable(m.run, 16) + "  up " + num(m.uptime_s / 60, "{:.0f}", 8) + " min  round " +
             num(m.round_s, "{:.1f}", 8) + " s";
    if (m.sync_total > 0) detail += "  state sync: " + sync_progress_text(m);
  }
  out.push_back(detail);
  out.push_back(fmt::format("q quit  up/down select  s/S sort (by {}{})  r reverse",
                            sort_name(sort_), descending_ ? ", descending" : ""));
  for (auto& l : out)
    if (l.size() > width) l.resize(width);
  if (out.size() > height) out.resize(height);
  return out;
}

std::string TopModel::table() const {
  std::string s = header_line() + "\n";
  for (const auto& r : rows_) s += row_line(r) + "\n";
  return s;
}

}  // namespace grove::node
