// Fuzz target for the MemberStatus wire form (node/status.hpp): the answer to a "status" or
// "swarm_status" request, which `grove-node status` decodes and prints, and which a node decodes
// when it asks the other members of its swarm.
//
// Properties checked on every input (a violation traps, so libFuzzer records a crash):
//   - decode_status never crashes; a rejection says why;
//   - what it accepts is within its limits: at most kMaxStatusMembers entries, strings of at most
//     256 bytes, numbers finite or NaN (absent);
//   - encoding the decoded list and decoding that gives the same fields (NaN for NaN), and
//     encoding is canonical (the second encoding has the same bytes as the first);
//   - both renderings of a decoded list never crash; the JSON one is one line per member, the
//     table one row per member plus a line for each member's state sync under way.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "node/status.hpp"

namespace {
using namespace grove::node;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr std::size_t kMaxText = 256;

bool same_number(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

bool same(const MemberStatus& a, const MemberStatus& b) {
  return a.node == b.node && a.address == b.address && a.status == b.status && a.run == b.run &&
         a.step == b.step && a.round == b.round && same_number(a.loss, b.loss) &&
         same_number(a.eval_loss, b.eval_loss) && same_number(a.loss_floor, b.loss_floor) &&
         same_number(a.tokens_per_s, b.tokens_per_s) &&
         same_number(a.last_sync_ms, b.last_sync_ms) && a.last_partner == b.last_partner &&
         a.bytes_sent == b.bytes_sent && a.bytes_received == b.bytes_received &&
         same_number(a.round_s, b.round_s) && same_number(a.uptime_s, b.uptime_s) &&
         a.reachable == b.reachable && a.sync_bytes == b.sync_bytes &&
         a.sync_total == b.sync_total && same_number(a.sync_rate, b.sync_rate) &&
         a.algorithm == b.algorithm;
}

bool within_limits(const MemberStatus& m) {
  for (const std::string* s :
       {&m.node, &m.address, &m.status, &m.run, &m.last_partner, &m.algorithm})
    if (s->size() > kMaxText) return false;
  for (double v : {m.loss, m.eval_loss, m.loss_floor, m.tokens_per_s, m.last_sync_ms, m.round_s,
                   m.uptime_s, m.sync_rate})
    if (std::isinf(v)) return false;
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> in(data, size);
  auto members = decode_status(in);
  const std::string why = members.why();
  if (!members) {
    check(!why.empty());
    return 0;
  }
  check(members->size() <= kMaxStatusMembers);
  check(std::all_of(members->begin(), members->end(), within_limits));

  const auto bytes = encode_status(*members);
  auto again = decode_status(bytes);
  check(again.has_value());
  check(again->size() == members->size());
  for (std::size_t i = 0; i < members->size(); ++i) check(same((*members)[i], (*again)[i]));
  check(encode_status(*again) == bytes);

  const std::string json = status_json(*members);
  check(static_cast<std::size_t>(std::count(json.begin(), json.end(), '\n')) == members->size());
  // Nothing a peer sends reaches the terminal as a control character, and every member is one
  // row of the table (header + one newline-terminated line each, + one for a sync under way).
  const std::string table = status_table(*members);
  for (const std::string* text : {&json, &table})
    check(std::all_of(text->begin(), text->end(), [](char c) {
      const auto u = static_cast<unsigned char>(c);
      return c == '\n' || (u >= 0x20 && u < 0x7f);
    }));
  const auto syncing = std::count_if(members->begin(), members->end(),
                                     [](const MemberStatus& m) { return m.sync_total > 0; });
  check(static_cast<std::size_t>(std::count(table.begin(), table.end(), '\n')) ==
        members->size() + 1 + static_cast<std::size_t>(syncing));
  check(!table.empty() && table.back() == '\n');
  return 0;
}
