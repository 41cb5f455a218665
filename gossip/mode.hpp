// The outer mode of a run, switchable at run time by any member: NoLoCo pair averaging (the
// default) or DiLoCo group all-reduce. A request is a signed DHT record of its requester (subkey
// "mode:<from_round>" under key("grove/run/<run>/mode"), one slot per request so a requester's
// later switch back does not replace its earlier switch) naming the mode and the round from which
// it applies;
// a later request (a higher from_round) switches again, e.g. back to NoLoCo. Every node reads the
// same records and derives the same schedule: for round r the mode is that of the request with
// the greatest from_round <= r (ties: the greater requester id), or the run's configured mode.
// Requests must name a round at least `lead` rounds ahead of the requester's own round so that
// every node hears of it before it applies; the node refuses to request a switch for a round
// that has begun.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dht/record.hpp"
#include "gossip/wire.hpp"

namespace grove::gossip {

enum class OuterMode : std::uint8_t { noloco = 0, diloco = 1 };
const char* to_string(OuterMode m);
std::optional<OuterMode> parse_mode(std::string_view s);

struct ModeRequest {
  NodeId requester{};  ///< the record's owner (not encoded)
  std::string run_id;
  OuterMode mode = OuterMode::noloco;
  std::uint64_t from_round = 0;
  friend bool operator==(const ModeRequest&, const ModeRequest&) = default;
};
/// The record value (schema in mode.cpp: run, mode, from_round); decoding is bounded.
std::vector<std::uint8_t> encode_mode(const ModeRequest& r);
transport::Result<ModeRequest> decode_mode(std::span<const std::uint8_t> value);
dht::Key mode_key(const std::string& run_id);
/// The record subkey of a request: "mode:<from_round>" (a record under another subkey is ignored).
std::string mode_subkey(std::uint64_t from_round);

/// Decodes the "mode" records of a get (foreign runs and malformed values are skipped).
std::vector<ModeRequest> mode_requests(const std::string& run_id,
                                       const std::vector<dht::Record>& records);
/// The mode of `round` under `requests`, starting from `configured`.
OuterMode mode_for_round(const std::vector<ModeRequest>& requests, std::uint64_t round,
                         OuterMode configured);

}  // namespace grove::gossip
