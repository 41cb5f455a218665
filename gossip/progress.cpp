#include "gossip/progress.hpp"

#include "transport/schema.hpp"

namespace grove::gossip {

namespace {
namespace sc = transport::schema;
constexpr auto kProgressSchema =
    sc::record<Progress>("progress", 1, sc::field("round", &Progress::round, sc::Uint{}),
                         sc::field("weights_hash", &Progress::weights_hash, sc::Bin{32}));
static_assert(sizeof(Progress::weights_hash) + 16 <= dht::kMaxMemberPayload);
}  // namespace

std::vector<std::uint8_t> encode_progress(const Progress& p) {
  return sc::encode(kProgressSchema, p);
}

transport::Result<Progress> decode_progress(std::span<const std::uint8_t> payload) {
  return sc::decode(kProgressSchema, payload);
}

Progress progress_of(const dht::MemberInfo& m) {
  auto p = decode_progress(m.payload);
  return p ? *p : Progress{};
}

OthersView view_of_others(const std::vector<dht::MemberInfo>& live, const NodeId& self,
                          const std::set<NodeId>& departed, std::uint64_t round,
                          const std::set<NodeId>& last_group) {
  OthersView o;
  for (const auto& mem : live) {
    if (mem.id == self || departed.contains(mem.id)) continue;
    const std::uint64_t r = progress_of(mem).round;
    o.ahead |= r > round;
    if (!trains(mem)) continue;  // no partner to wait for
    ++o.live;
    const bool syncing = mem.status == "joining" || mem.status == "syncing";
    o.at_round += r == round && !syncing;
    o.syncing += syncing && r <= round;
    o.finishing += last_group.contains(mem.id) && mem.status == "averaging" && r + 1 == round;
    o.busy += mem.status == "averaging";
  }
  return o;
}

}  // namespace grove::gossip
