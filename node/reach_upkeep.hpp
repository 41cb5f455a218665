// ReachUpkeep: the node's reachability and relay decisions, sans-IO. Which addresses a node
// advertises depends on what peers could dial back (transport/reach.hpp): it asks up to four
// connected peers to check its candidate addresses (joiners before they advertise anything, the
// first node of a swarm once others have joined), re-checks every 10 minutes, sooner when nobody
// could check it or when a candidate changed meanwhile (a UPnP mapping came or went); helpers
// answer one check per requester per 10 s, so checks are at least 11 s apart. A node found
// unreachable keeps reservations at two reachable members (relays), renewed every 15 s (5 s while
// it has none), and advertises its relay addresses; a member that refused is not asked again for
// 5 minutes.
//
// The driver (node/network.cpp, on the host strand) asks the helpers and the relays and feeds the
// outcomes back with the time; the upkeep says when the next check or renewal is due and what to
// advertise. It owns no socket, timer or clock, and draws from its own seeded generator.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dht/membership.hpp"
#include "transport/reach.hpp"

namespace grove::node {

struct ReachUpkeepOptions {
  std::chrono::milliseconds first_check{10'000};  ///< the first node: once others have joined
  std::chrono::milliseconds retry{11'000};        ///< helpers answer one check per 10 s
  std::chrono::milliseconds recheck{600'000};
  std::size_t helpers = 4;
  std::size_t relays = 2;
  std::chrono::milliseconds renew{15'000};         ///< relay reservations
  std::chrono::milliseconds renew_empty{5'000};    ///< while we hold none
  std::chrono::milliseconds refused_for{300'000};  ///< a member that would not relay for us
};

class ReachUpkeep {
 public:
  using Time = std::chrono::milliseconds;
  using Relay = std::pair<transport::NodeId, std::string>;  ///< member id, its address

  /// `candidates`: the addresses we believe peers can dial (the first one leads). `checked_now`:
  /// the node checks before it advertises (a joiner); otherwise the first check is first_check
  /// from `now`.
  ReachUpkeep(std::vector<std::string> candidates, std::uint64_t seed, bool checked_now, Time now,
              ReachUpkeepOptions opts = {});

  /// unchecked, reachable, unreachable (the member record's value).
  transport::Reachability reach() const { return reach_; }
  /// What we advertise: the candidates before a verdict, the verified addresses, or our relay
  /// addresses when unreachable.
  const std::vector<std::string>& addresses() const { return addresses_; }
  const std::vector<std::string>& candidates() const { return candidates_; }
  /// The DHT address ("" = we accept no connections) and the addresses a node behind a relay
  /// may dial back (connection reversal: only verified ones).
  std::string dht_address() const;
  std::vector<std::string> dialback() const;

  // ---- checks ----
  std::optional<Time> next_check() const;
  struct Check {
    std::vector<transport::NodeId> helpers;
    std::vector<std::string> addresses;  ///< at most kReachMaxAddresses
  };
  /// A check is due (or asked for now): the helpers among `peers` (connected, deduplicated by
  /// the caller or not). Nullopt when one is under way; with no helpers the verdict is "nobody
  /// could check us" (applied at once) and the next check is `retry` from now.
  std::optional<Check> begin_check(std::vector<transport::NodeId> peers, Time now);
  /// The check begun last ended; true when what we advertise or our verdict changed.
  bool on_verdict(const transport::ReachCheck::Verdict& v, Time now);
  /// The home router mapped a port to us ("ip:port") or the mapping went (""): a candidate
  /// changes and is checked as soon as helpers answer again.
  void set_mapped(std::string external, Time now);
  bool checking() const { return checking_; }

  // ---- relays ----
  std::optional<Time> next_renewal() const;
  /// The relays to reserve at (those we hold, then live members that may relay), up to `relays`;
  /// empty when none is due or none is known. Marks the renewal under way.
  std::vector<Relay> begin_renewal(const std::vector<dht::MemberInfo>& live,
                                   const transport::NodeId& self, Time now);
  /// The reservations that held and the members that refused; true when what we advertise
  /// changed.
  bool on_renewal(std::vector<Relay> ok, const std::vector<transport::NodeId>& refused, Time now);
  const std::vector<Relay>& relays() const { return relays_; }

  /// No more checks or renewals (the node is stopping).
  void stop() { stopped_ = true; }

 private:
  std::vector<std::string> relay_addresses() const;

  ReachUpkeepOptions opts_;
  std::vector<std::string> candidates_, addresses_;
  std::string mapped_;  // the UPnP candidate ("" = none)
  transport::Reachability reach_ = transport::Reachability::unchecked;
  std::mt19937_64 rng_;
  bool checking_ = false, recheck_soon_ = false, stopped_ = false;
  std::optional<Time> check_at_;
  Time last_check_{Time::min()};
  std::vector<Relay> relays_;
  std::map<transport::NodeId, Time> refused_;
  bool renewing_ = false;
  std::optional<Time> renew_at_;
};

}  // namespace grove::node
