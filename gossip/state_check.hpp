// Trusting no single donor: a state downloaded from one member (a join, a catch-up) is checked
// against what the other live members say before the node takes it.
//
// After the download the joiner probes every live member it knows (up to kMaxWitnesses, the donor
// included) through the state server ("state" requests of another version): each answers with
// the BLAKE2b-256 of its slow weights φ at the round asked, when it still holds that round (a
// server keeps the hashes of its last 64 states), and with φ's values at kProbeSamples positions
// drawn from the joiner's seed, read from the last snapshot it serves. judge_state() then decides:
//  - DiLoCo (every member of a round's group ends it with the same φ): the state's hash must be
//    the one that a strict majority of the members reporting a hash for its round report, and
//    someone other than the donor must report it, unless no other member that answered holds a
//    state (a swarm of two; a bootstrap node and its first joiners). When only the donor holds the
//    round (it ended rounds alone, past its group's patience: the others catch up from it), its
//    values must lie near the other members' instead, as a NoLoCo state's;
//  - NoLoCo (every member's φ is its own): the donor must report the hash of the state it served
//    (when it answers), and the state's values at the sampled positions must lie near the other
//    members' (at most 4 times their own spread around their median, plus three quarters of the
//    median's norm: honest members a few rounds apart, each pulled toward its own data, were
//    measured up to a third of it apart in the simulator; random, zeroed, rescaled or foreign
//    weights are farther off). A state nobody but its donor can vouch
//    for is refused unless no other member that answered holds a state.
// A refused state is not applied: the engine names the members it checked against, leaves the
// donor out and syncs again. This bounds what one faulty or malicious member can do; a majority
// of faulty members, or a subtle change within the spread, is beyond it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "gossip/protocol.hpp"
#include "gossip/state_blob.hpp"

namespace grove::gossip {

inline constexpr std::uint32_t kProbeSamples = 64;
inline constexpr std::size_t kMaxWitnesses = 8;
inline constexpr std::size_t kHashHistory = 64;

/// What a joiner asks a member: φ's hash at `round`, and `samples` values at the positions drawn
/// from `seed` (0: none).
struct StateProbe {
  std::uint64_t round = 0;
  std::uint64_t seed = 0;
  std::uint32_t samples = 0;
};
std::vector<std::uint8_t> encode_probe(const StateProbe& p);
/// Bounded (samples ≤ kProbeSamples); a chunk request (another version) is refused.
transport::Result<StateProbe> decode_probe(std::span<const std::uint8_t> bytes);

struct ProbeAnswer {
  std::uint64_t round = 0;     ///< the round asked
  Digest hash{};               ///< φ's hash at that round (all zero: not held)
  std::uint64_t sampled = 0;   ///< the round of the state sampled
  std::uint64_t values = 0;    ///< φ's size in that state
  std::vector<float> samples;  ///< φ at sample_positions(seed, values, n) (empty: none)
};
std::vector<std::uint8_t> encode_probe_answer(const ProbeAnswer& a);
/// Bounded (kProbeSamples values, each finite).
transport::Result<ProbeAnswer> decode_probe_answer(std::span<const std::uint8_t> bytes);

/// `n` positions in [0, values) drawn from `seed` (the same on every member).
std::vector<std::uint64_t> sample_positions(std::uint64_t seed, std::uint64_t values,
                                            std::uint32_t n);
/// The values of a state blob's φ at the positions drawn from `seed` (a few small reads), with
/// the blob's round and φ's size.
struct Samples {
  std::uint64_t round = 0, values = 0;
  std::vector<float> at;
};
transport::Result<Samples> read_samples(const StateBlob& blob, std::uint64_t seed, std::uint32_t n);

/// A member's answer to a probe (nullopt: it did not answer; `failure` says why).
struct Witness {
  NodeId who{};
  std::optional<ProbeAnswer> answer;
  std::string failure;
};

struct StateVerdict {
  bool accepted = false;
  /// For the log: who agreed, who did not, who could not say.
  std::string detail;
};

struct StateToJudge {
  bool same_hash = false;  ///< a DiLoCo round: every member of its group holds the same φ
  NodeId donor{};
  std::uint64_t round = 0;
  Digest hash{};               ///< of the downloaded φ
  std::span<const float> phi;  ///< the downloaded φ (its samples are read from it)
  std::uint64_t seed = 0;      ///< the probe's
};
StateVerdict judge_state(const StateToJudge& s, std::span<const Witness> witnesses);

}  // namespace grove::gossip
