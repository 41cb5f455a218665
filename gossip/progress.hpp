// What a member of a run says about its training in its member record: the payload the DHT's
// membership carries without reading it (dht/membership: MemberInfo::payload). The round it is
// at and the BLAKE2b-256 of its slow weights, which DiLoCo's consistency judge compares and the
// round engine reads to see members ahead of it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "dht/membership.hpp"
#include "gossip/protocol.hpp"

namespace grove::gossip {

struct Progress {
  std::uint64_t round = 0;  ///< the outer round the member is in
  Digest weights_hash{};    ///< of its slow weights φ (all zero: not known yet)
  friend bool operator==(const Progress&, const Progress&) = default;
};

/// The payload's value (schema in progress.cpp); decoding is bounded.
std::vector<std::uint8_t> encode_progress(const Progress& p);
transport::Result<Progress> decode_progress(std::span<const std::uint8_t> payload);
/// A member's progress; a member whose payload is empty or does not decode (it has not
/// published one yet) is at round 0 with no hash.
Progress progress_of(const dht::MemberInfo& m);

/// The status of a member that trains nothing (an external workload waiting for its trainer):
/// nobody waits for it to form a group or counts it as a partner.
inline constexpr const char* kIdleStatus = "idle";
inline bool trains(const dht::MemberInfo& m) {
  return m.status != kIdleStatus;
}

/// The other live members as a member at `round` sees them (ourselves and `departed` left out;
/// members that do not train (kIdleStatus) count only for `ahead`).
struct OthersView {
  std::size_t live = 0, at_round = 0;  ///< all of them; those at our round
  std::size_t syncing = 0;  ///< fetching the state (status joining or syncing), not ahead of us
  /// Members of `last_group` whose records still say they are ending the round before ours
  /// (status averaging): at our round in a moment.
  std::size_t finishing = 0;
  /// In a round of their own (status averaging), at any round: ready again within about an inner
  /// phase once it ends.
  std::size_t busy = 0;
  bool ahead = false;  ///< one has ended our round already
};
OthersView view_of_others(const std::vector<dht::MemberInfo>& live, const NodeId& self,
                          const std::set<NodeId>& departed, std::uint64_t round,
                          const std::set<NodeId>& last_group = {});

}  // namespace grove::gossip
