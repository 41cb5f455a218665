#include "node/status.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "transport/schema.hpp"

namespace grove::node {

namespace {
namespace sc = transport::schema;
constexpr std::size_t kMaxText = 256;

/// The answer to "status" (one member) and "swarm_status" (every live member).
struct StatusAnswer {
  std::vector<MemberStatus> members;
};
constexpr sc::Str kText{kMaxText};
constexpr sc::Real kNumber{.nan = true};
constexpr auto kStatusSchema = sc::record<StatusAnswer>(
    "status answer", 1,
    sc::field("members", &StatusAnswer::members,
              sc::list(kMaxStatusMembers,
                       sc::row<MemberStatus>(
                           "member status", sc::field("node", &MemberStatus::node, kText),
                           sc::field("address", &MemberStatus::address, kText),
                           sc::field("status", &MemberStatus::status, kText),
                           sc::field("run", &MemberStatus::run, kText),
                           sc::field("step", &MemberStatus::step, sc::Uint{}),
                           sc::field("round", &MemberStatus::round, sc::Uint{}),
                           sc::field("loss", &MemberStatus::loss, kNumber),
                           sc::field("eval_loss", &MemberStatus::eval_loss, kNumber),
                           sc::field("loss_floor", &MemberStatus::loss_floor, kNumber),
                           sc::field("tokens_per_s", &MemberStatus::tokens_per_s, kNumber),
                           sc::field("last_sync_ms", &MemberStatus::last_sync_ms, kNumber),
                           sc::field("last_partner", &MemberStatus::last_partner, kText),
                           sc::field("bytes_sent", &MemberStatus::bytes_sent, sc::Uint{}),
                           sc::field("bytes_received", &MemberStatus::bytes_received, sc::Uint{}),
                           sc::field("round_s", &MemberStatus::round_s, kNumber),
                           sc::field("uptime_s", &MemberStatus::uptime_s, kNumber),
                           sc::field("reachable", &MemberStatus::reachable, sc::Bool{}),
                           sc::field("sync_bytes", &MemberStatus::sync_bytes, sc::Uint{}),
                           sc::field("sync_total", &MemberStatus::sync_total, sc::Uint{}),
                           sc::field("sync_rate", &MemberStatus::sync_rate, kNumber),
                           sc::field("algorithm", &MemberStatus::algorithm, kText)))));

// A number for the table: `spec` (one double, fmt's syntax), or in {:.3g} when it would be long
// (a peer's numbers are not trusted to be sane), "-" when absent.
std::string num(double v, const char* spec) {
  if (!std::isfinite(v)) return "-";
  std::string s = fmt::format(fmt::runtime(spec), v);
  return s.size() <= 12 ? s : fmt::format("{:.3g}", v);
}

}  // namespace

std::string printable(const std::string& s, std::size_t max) {
  std::string r;
  for (char c : s) {
    if (r.size() == max) break;
    const auto u = static_cast<unsigned char>(c);
    r += u >= 0x20 && u < 0x7f ? c : '?';
  }
  return r;
}

std::string json_string(const std::string& s) {
  std::string r = "\"";
  for (char c : printable(s, s.size())) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.6g}", v);
}

std::string sync_progress_text(const MemberStatus& m) {
  if (m.sync_total == 0) return "-";
  const double done = static_cast<double>(std::min(m.sync_bytes, m.sync_total));
  const double total = static_cast<double>(m.sync_total);
  std::string s = fmt::format("{:.0f}% of {:.2f} GB", 100.0 * done / total, total / 1e9);
  if (std::isfinite(m.sync_rate) && m.sync_rate > 0) {
    const double left_s = (total - done) / m.sync_rate;
    s += " at " + num(m.sync_rate / 1e6, "{:.1f}") + " MB/s, ";
    s += left_s < 120 ? fmt::format("{:.0f} s left", left_s)
                      : num(left_s / 60, "{:.0f}") + " min left";
  }
  return s;
}

std::vector<std::uint8_t> encode_status(const std::vector<MemberStatus>& members) {
  return sc::encode(kStatusSchema, StatusAnswer{members});
}

transport::Result<std::vector<MemberStatus>> decode_status(std::span<const std::uint8_t> bytes) {
  auto a = sc::decode(kStatusSchema, bytes);
  if (!a) return a.failure();
  return std::move(a->members);
}

std::string status_json(const std::vector<MemberStatus>& members) {
  std::string s;
  for (const auto& m : members) {
    s += "{\"node\":" + json_string(m.node) + ",\"address\":" + json_string(m.address) +
         ",\"status\":" + json_string(m.status) + ",\"run\":" + json_string(m.run) +
         ",\"step\":" + std::to_string(m.step) + ",\"round\":" + std::to_string(m.round) +
         ",\"loss\":" + json_number(m.loss) + ",\"eval_loss\":" + json_number(m.eval_loss) +
         ",\"loss_floor\":" + json_number(m.loss_floor) +
         ",\"tokens_per_s\":" + json_number(m.tokens_per_s) +
         ",\"last_sync_ms\":" + json_number(m.last_sync_ms) +
         ",\"last_partner\":" + json_string(m.last_partner) +
         ",\"bytes_sent\":" + std::to_string(m.bytes_sent) +
         ",\"bytes_received\":" + std::to_string(m.bytes_received) +
         ",\"round_s\":" + json_number(m.round_s) + ",\"uptime_s\":" + json_number(m.uptime_s) +
         ",\"reachable\":" + (m.reachable ? "true" : "false") +
         ",\"sync_bytes\":" + std::to_string(m.sync_bytes) +
         ",\"sync_total\":" + std::to_string(m.sync_total) +
         ",\"sync_rate\":" + json_number(m.sync_rate) +
         ",\"algorithm\":" + json_string(m.algorithm) + "}\n";
  }
  return s;
}

std::string status_table(const std::vector<MemberStatus>& members) {
  constexpr auto kRow =
      "{:<16} {:<11} {:>8} {:>6} {:>8} {:>8} {:>8} {:>9} {:<8} {:>9} {:>9} {:>7} {:<10}  {}\n";
  std::string s =
      fmt::format(kRow, "node", "status", "step", "round", "loss", "eval", "tok/s", "sync ms",
                  "partner", "sent MB", "recv MB", "round s", "outer", "address");
  for (const auto& m : members) {
    const std::string outer = m.algorithm.substr(0, m.algorithm.find(' '));
    s += fmt::format(kRow, printable(m.node, 16), printable(m.status, 11), m.step, m.round,
                     num(m.loss, "{:.4f}"), num(m.eval_loss, "{:.4f}"),
                     num(m.tokens_per_s, "{:.0f}"), num(m.last_sync_ms, "{:.0f}"),
                     m.last_partner.empty() ? "-" : printable(m.last_partner, 8),
                     fmt::format("{:.1f}", static_cast<double>(m.bytes_sent) / 1e6),
                     fmt::format("{:.1f}", static_cast<double>(m.bytes_received) / 1e6),
                     num(m.round_s, "{:.1f}"), outer.empty() ? "-" : printable(outer, 10),
                     printable(m.address, 80));
    if (m.sync_total > 0) s += "    state sync: " + sync_progress_text(m) + "\n";
  }
  return s;
}

}  // namespace grove::node
