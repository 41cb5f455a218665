// Reachability: can other nodes open connections to us, and at which of our addresses?
//
// A node asks a few peers it is connected to for a dial-back check ("reach.check"): each one
// dials the addresses we name over a fresh connection of its own (Host::probe: the node that
// answers there must prove our identity), and tells us what it saw, and the address our request
// came from (our address as the Internet sees it, behind a NAT the router's). An address two
// helpers reached (one, when only one answered) is verified; a node with no verified address is
// unreachable: it accepts no connections, is not handed out as a DHT contact and is reached over
// the connections it opens (Host waits for those). Hivemind and libp2p call the same check
// AutoNAT; like its second version, a helper dials only the IP our request came from (or one
// address of the other IP family), at most once per requester and interval, so that nobody can
// use the swarm to knock on a third party's ports.
//
// The codecs, the helper's policy (ReachPolicy) and the verdict (ReachCheck) are sans-IO;
// serve_reach_checks() puts the policy on a Host.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "transport/error.hpp"
#include "transport/identity.hpp"

namespace grove::transport {

class Host;

inline constexpr const char* kReachMethod = "reach.check";
inline constexpr std::size_t kReachMaxAddresses = 4;
inline constexpr std::size_t kReachMaxAddress = 200;  ///< bytes of one "host:port"

/// What dial-back checks found about a node (the value its member record carries).
enum class Reachability : std::uint8_t {
  unchecked = 0,    ///< not checked yet (nobody could check it)
  reachable = 1,    ///< peers dialed it back at the addresses it advertises
  unreachable = 2,  ///< they could not: it takes part over the connections it opens (and relays)
};

enum class ReachCode : std::uint8_t {
  ok = 0,           ///< the node there proved the requester's identity
  unreachable = 1,  ///< refused, no route, or a bad address
  timed_out = 2,    ///< nothing answered (a NAT or firewall that drops)
  wrong_peer = 3,   ///< somebody else answers there
  not_checked = 4,  ///< the helper's policy does not dial this address
};
const char* to_string(ReachCode c);

struct ReachRequest {
  std::vector<std::string> addresses;  ///< at most kReachMaxAddresses
};
struct ReachResult {
  std::string address;
  ReachCode code = ReachCode::not_checked;
  friend bool operator==(const ReachResult&, const ReachResult&) = default;
};
struct ReachReply {
  std::string observed;  ///< the requester's address as the helper saw it
  std::vector<ReachResult> results;
};
/// Schemas in reach.cpp (transport/schema.hpp); decoding is bounded.
std::vector<std::uint8_t> encode_reach_request(const ReachRequest& r);
Result<ReachRequest> decode_reach_request(std::span<const std::uint8_t> b);
std::vector<std::uint8_t> encode_reach_reply(const ReachReply& r);
Result<ReachReply> decode_reach_reply(std::span<const std::uint8_t> b);

/// The IP of "host:port" / "[v6]:port", IPv4-mapped IPv6 written as IPv4; "" if unparsable.
std::string ip_of(const std::string& address);
/// "ip:port" or "[ip]:port" for an IPv6 ip.
std::string join_host_port(const std::string& ip, std::uint16_t port);
bool is_ipv6(const std::string& ip);

struct ReachPolicyOptions {
  std::chrono::milliseconds min_interval{10'000};  ///< per requester
  std::size_t max_in_flight = 8;                   ///< checks being dialed at once
  std::size_t max_tracked = 4096;                  ///< requesters remembered
};

/// The helper's side: which addresses of a request it dials. Time is given by the caller.
class ReachPolicy {
 public:
  explicit ReachPolicy(ReachPolicyOptions o = {}) : opts_(o) {}
  struct Admission {
    std::string refused;     ///< why the whole request is refused ("" = admitted)
    std::vector<bool> dial;  ///< per requested address: dial it (else answered not_checked)
  };
  /// An admitted request counts as in flight until finished() is called for it.
  Admission admit(const NodeId& requester, const std::string& observed, const ReachRequest& req,
                  std::chrono::milliseconds now);
  void finished() {
    if (in_flight_ > 0) --in_flight_;
  }
  std::size_t in_flight() const { return in_flight_; }

 private:
  ReachPolicyOptions opts_;
  std::map<NodeId, std::chrono::milliseconds> last_;
  std::size_t in_flight_ = 0;
};

/// Registers "reach.check" on the host: dials the admitted addresses (Host::probe, each with
/// `probe_timeout`) and answers with the results.
void serve_reach_checks(Host& host, ReachPolicyOptions o = {},
                        std::chrono::milliseconds probe_timeout = std::chrono::milliseconds(4000));

/// The requester's side: collects the helpers' replies and tells what they add up to.
class ReachCheck {
 public:
  explicit ReachCheck(std::vector<std::string> candidates) : candidates_(std::move(candidates)) {}
  const std::vector<std::string>& candidates() const { return candidates_; }
  void on_reply(const NodeId& helper, const ReachReply& r);
  void on_failure(const NodeId& helper) { failed_.push_back(helper); }

  struct Verdict {
    std::size_t helpers = 0;              ///< helpers that answered
    std::size_t failed = 0;               ///< helpers that refused or did not answer
    std::vector<std::string> verified;    ///< candidates reached by enough helpers, in order
    std::optional<std::string> observed;  ///< the IP most helpers saw us come from
    bool reachable() const { return !verified.empty(); }
  };
  Verdict verdict() const;

 private:
  std::vector<std::string> candidates_;
  std::map<NodeId, ReachReply> replies_;
  std::vector<NodeId> failed_;
};

}  // namespace grove::transport
