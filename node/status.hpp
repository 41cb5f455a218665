// `grove-node status`: what each member of the swarm reports about itself, its wire form and its
// two renderings (a table for people, JSON lines for scripts).
//
// Every node answers the transport request "status" with its own MemberStatus, and "swarm_status"
// with the list for every live member of its run (asked in parallel, each with a deadline; a
// member that does not answer is listed from its DHT member record, marked unreachable). The
// `status` command sends "swarm_status" to the local node (its address is in the state dir) or to
// the member given with --peer. Wire form: the schema in status.cpp; decoding is bounded
// (at most kMaxStatusMembers entries, strings of at most 256 bytes).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "transport/error.hpp"

namespace grove::node {

constexpr std::size_t kMaxStatusMembers = 4096;

struct MemberStatus {
  std::string node;     ///< first 16 hex digits of the node id
  std::string address;  ///< where it accepts connections
  std::string status;   ///< starting, joining, training, averaging, checkpointing, leaving,
                        ///< unreachable, waiting for a trainer
  std::string run;
  std::uint64_t step = 0, round = 0;
  double loss = NAN, eval_loss = NAN, loss_floor = NAN;
  double tokens_per_s = NAN;
  double last_sync_ms = NAN;  ///< the last round's submit-to-new-weights time
  std::string last_partner;   ///< first 8 hex digits ("" when local-only)
  /// Every byte its sessions sent and received since it started (averaging, state syncs, DHT).
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  double round_s = NAN;  ///< mean wall time of a round (inner phase + averaging)
  double uptime_s = NAN;
  bool reachable = true;
  /// A state sync under way (joining or catching up): verified bytes of the state's, at the
  /// rate measured from its donor (bytes per second); zeros when none is.
  std::uint64_t sync_bytes = 0, sync_total = 0;
  double sync_rate = NAN;
  /// The outer algorithm of its last round and what it sends: "noloco (fp16)", "sparseloco
  /// (top-64/4096 fp32 + error feedback)", ...
  std::string algorithm;
};
/// "42% of 8.00 GB at 11.8 MB/s, 6 min left" for a sync under way ("-" when none is).
std::string sync_progress_text(const MemberStatus& m);

std::vector<std::uint8_t> encode_status(const std::vector<MemberStatus>& members);
transport::Result<std::vector<MemberStatus>> decode_status(std::span<const std::uint8_t> bytes);
/// A peer's string as shown to the user: printable ASCII only (every field we send is ASCII), at
/// most `max` characters, so that nothing received can move the cursor, recolour the terminal or
/// break a table row.
std::string printable(const std::string& s, std::size_t max);
/// JSON scalars: a quoted string (bytes outside printable ASCII shown as '?') and a number (null
/// when not finite). Shared with the node's metrics lines.
std::string json_string(const std::string& s);
std::string json_number(double v);

/// One JSON object per line.
std::string status_json(const std::vector<MemberStatus>& members);
/// An aligned table with a header line.
std::string status_table(const std::vector<MemberStatus>& members);

}  // namespace grove::node
