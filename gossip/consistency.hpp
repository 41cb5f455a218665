// ConsistencyJudge: after a DiLoCo round of several members, every member must hold the same
// slow weights. Each member publishes the BLAKE2b-256 of its φ in its member record; the judge
// compares the hashes the group's members published for a round with ours, counts and logs every
// mismatch, and decides which φ is the group's: the hash a strict majority published, or, once
// every member has published, the most common one (ties to the lowest hash, so that every member
// reaches the same verdict). When ours is not the group's, it names the members holding the
// group's φ: the engine replaces its state from them by state sync before its next round.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "dht/membership.hpp"
#include "gossip/protocol.hpp"

namespace grove::gossip {

class ConsistencyJudge {
 public:
  /// Our slow weights were found to differ from the group's: re-sync from these members.
  struct Repair {
    std::uint64_t round = 0;  ///< the round (after the step) where they differed
    std::set<NodeId> donors;  ///< members holding the group's hash
  };

  ConsistencyJudge(NodeId self, std::string run_id) : self_(self), run_id_(std::move(run_id)) {}

  /// A DiLoCo round of `group` (ourselves included) ended at `round` (after the step) with our
  /// φ hashing to `ours`: the others' records are checked against it.
  void expect(std::uint64_t round, Digest ours, std::set<NodeId> group);
  /// A member record (new or changed).
  void on_member(const dht::MemberInfo& m);
  /// A repair the engine has not taken yet (taking it lets the judge decide again).
  std::optional<Repair> take_repair() { return std::exchange(repair_, std::nullopt); }
  bool repair_pending() const { return repair_.has_value(); }
  /// Group members whose published hash for a round differed from ours.
  std::uint64_t mismatches() const { return mismatches_; }

 private:
  struct Expect {
    Digest hash{};
    std::set<NodeId> group;         ///< ourselves included
    std::map<NodeId, Digest> seen;  ///< hashes the others published for the round
  };
  void judge(std::uint64_t round);

  NodeId self_;
  std::string run_id_;
  std::map<std::uint64_t, Expect> expect_;  // round after the step → our hash and group
  std::set<std::pair<std::uint64_t, NodeId>> checked_;
  std::optional<Repair> repair_;
  std::uint64_t mismatches_ = 0;
};

}  // namespace grove::gossip
