#include "node/status.hpp"

#include <cstdio>
#include <cstring>

#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

namespace grove::node {

namespace {
namespace mp = transport::mp;
constexpr std::size_t kFields = 17;
constexpr std::size_t kMaxText = 256;

// `p` packs into `sb`. A relayed status ("swarm_status") holds numbers other members sent.
void pack_f64(msgpack::sbuffer& sb, mp::Packer& p, double v) {
  if (!std::isfinite(v)) {
    p.pack_nil();
  } else if (v == 0x1p64) {
    // msgpack-c's pack_double admits 2^64 to its whole-number path (its bound, UINT64_MAX as a
    // double, rounds up to 2^64) and converts it to uint64_t: undefined. Write the float64 here.
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    char b[9] = {static_cast<char>(0xcb)};
    for (int i = 0; i < 8; ++i) b[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
    sb.write(b, sizeof b);
  } else {
    p.pack_double(v);
  }
}

// Floats must be finite (NaN travels as nil); pack_double writes a whole number as an integer,
// so -2.0 comes back as a negative one.
bool get_f64(const mp::Obj& o, double& out) {
  if ((o.type == msgpack::type::FLOAT32 || o.type == msgpack::type::FLOAT64) &&
      !std::isfinite(o.via.f64))
    return false;
  return mp::get_number(o, out);
}

std::string num(double v, const char* fmt) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

}  // namespace

namespace {
// A peer's string as shown to the user: printable ASCII only (every field we send is ASCII), at
// most `max` characters, so that nothing received can move the cursor, recolour the terminal or
// break a table row.
std::string printable(const std::string& s, std::size_t max) {
  std::string r;
  for (char c : s) {
    if (r.size() == max) break;
    const auto u = static_cast<unsigned char>(c);
    r += u >= 0x20 && u < 0x7f ? c : '?';
  }
  return r;
}
}  // namespace

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
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::vector<std::uint8_t> encode_status(const std::vector<MemberStatus>& members) {
  msgpack::sbuffer sb;
  mp::Packer p(sb);
  p.pack_array(static_cast<std::uint32_t>(members.size()));
  for (const auto& m : members) {
    p.pack_array(kFields);
    mp::pack_str(p, m.node);
    mp::pack_str(p, m.address);
    mp::pack_str(p, m.status);
    mp::pack_str(p, m.run);
    p.pack_uint64(m.step);
    p.pack_uint64(m.round);
    pack_f64(sb, p, m.loss);
    pack_f64(sb, p, m.eval_loss);
    pack_f64(sb, p, m.loss_floor);
    pack_f64(sb, p, m.tokens_per_s);
    pack_f64(sb, p, m.last_sync_ms);
    mp::pack_str(p, m.last_partner);
    p.pack_uint64(m.bytes_sent);
    p.pack_uint64(m.bytes_received);
    pack_f64(sb, p, m.round_s);
    pack_f64(sb, p, m.uptime_s);
    if (m.reachable)
      p.pack_true();
    else
      p.pack_false();
  }
  return mp::bytes_of(sb);
}

transport::Result<std::vector<MemberStatus>> decode_status(std::span<const std::uint8_t> bytes) {
  const auto bad = [](const char* w) -> transport::Result<std::vector<MemberStatus>> {
    return {transport::errc::malformed, w};
  };
  transport::UnpackLimits lim;
  lim.array = kMaxStatusMembers;
  lim.map = 0;
  lim.str = kMaxText;
  lim.bin = 0;
  lim.depth = 2;
  auto oh = transport::unpack_bounded(bytes, lim);
  if (!oh) return bad("status answer does not decode within its limits");
  std::size_t n = 0;
  const auto* arr = mp::get_array(oh->get(), kMaxStatusMembers, n);
  if (!arr) return bad("status answer is not a list of members");
  std::vector<MemberStatus> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t k = 0;
    const auto* f = mp::get_array(arr[i], kFields, k);
    if (!f || k != kFields) return bad("a member entry has the wrong shape");
    MemberStatus m;
    if (!mp::get_str(f[0], kMaxText, m.node) || !mp::get_str(f[1], kMaxText, m.address) ||
        !mp::get_str(f[2], kMaxText, m.status) || !mp::get_str(f[3], kMaxText, m.run) ||
        !mp::get_u64(f[4], m.step) || !mp::get_u64(f[5], m.round) || !get_f64(f[6], m.loss) ||
        !get_f64(f[7], m.eval_loss) || !get_f64(f[8], m.loss_floor) ||
        !get_f64(f[9], m.tokens_per_s) || !get_f64(f[10], m.last_sync_ms) ||
        !mp::get_str(f[11], kMaxText, m.last_partner) || !mp::get_u64(f[12], m.bytes_sent) ||
        !mp::get_u64(f[13], m.bytes_received) || !get_f64(f[14], m.round_s) ||
        !get_f64(f[15], m.uptime_s) || f[16].type != msgpack::type::BOOLEAN)
      return bad("a member entry has a field of the wrong type or size");
    m.reachable = f[16].via.boolean;
    out.push_back(std::move(m));
  }
  return out;
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
         ",\"reachable\":" + (m.reachable ? "true" : "false") + "}\n";
  }
  return s;
}

std::string status_table(const std::vector<MemberStatus>& members) {
  std::string s;
  char line[320];
  std::snprintf(line, sizeof line, "%-16s %-11s %8s %6s %8s %8s %8s %9s %-8s %9s %9s %7s  %s\n",
                "node", "status", "step", "round", "loss", "eval", "tok/s", "sync ms", "partner",
                "sent MB", "recv MB", "round s", "address");
  s += line;
  for (const auto& m : members) {
    std::snprintf(
        line, sizeof line, "%-16s %-11s %8llu %6llu %8s %8s %8s %9s %-8s %9.1f %9.1f %7s  %s\n",
        printable(m.node, 16).c_str(), printable(m.status, 11).c_str(),
        static_cast<unsigned long long>(m.step), static_cast<unsigned long long>(m.round),
        num(m.loss, "%.4f").c_str(), num(m.eval_loss, "%.4f").c_str(),
        num(m.tokens_per_s, "%.0f").c_str(), num(m.last_sync_ms, "%.0f").c_str(),
        m.last_partner.empty() ? "-" : printable(m.last_partner, 8).c_str(),
        static_cast<double>(m.bytes_sent) / 1e6, static_cast<double>(m.bytes_received) / 1e6,
        num(m.round_s, "%.1f").c_str(), printable(m.address, 80).c_str());
    s += line;
  }
  return s;
}

}  // namespace grove::node
