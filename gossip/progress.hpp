// What a member of a run says about its training in its member record: the payload the DHT's
// membership carries without reading it (dht/membership: MemberInfo::payload). The round it is
// at and the BLAKE2b-256 of its slow weights, which DiLoCo's consistency judge compares and the
// round engine reads to see members ahead of it.
#pragma once

#include <cstdint>
#include <optional>
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

}  // namespace grove::gossip
