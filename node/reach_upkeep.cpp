#include "node/reach_upkeep.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "transport/relay.hpp"

namespace grove::node {

using transport::Reachability;

namespace {
std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "(none)" : out;
}
}  // namespace

ReachUpkeep::ReachUpkeep(std::vector<std::string> candidates, std::uint64_t seed, bool checked_now,
                         Time now, ReachUpkeepOptions opts)
    : opts_(opts),
      candidates_(std::move(candidates)),
      addresses_(candidates_),
      rng_(seed),
      check_at_(checked_now ? now : now + opts_.first_check) {}

std::string ReachUpkeep::dht_address() const {
  return reach_ == Reachability::unreachable || addresses_.empty() ? std::string()
                                                                   : addresses_.front();
}

std::vector<std::string> ReachUpkeep::dialback() const {
  return reach_ == Reachability::reachable ? addresses_ : std::vector<std::string>{};
}

std::vector<std::string> ReachUpkeep::relay_addresses() const {
  std::vector<std::string> v;
  for (const auto& [id, addr] : relays_) v.push_back(transport::relay_address(id, addr));
  return v;
}

// ---- checks -----------------------------------------------------------------------------------

std::optional<ReachUpkeep::Time> ReachUpkeep::next_check() const {
  if (stopped_ || checking_) return std::nullopt;
  return check_at_;
}

std::optional<ReachUpkeep::Check> ReachUpkeep::begin_check(std::vector<transport::NodeId> peers,
                                                           Time now) {
  if (checking_ || stopped_) return std::nullopt;
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  std::shuffle(peers.begin(), peers.end(), rng_);
  if (peers.size() > opts_.helpers) peers.resize(opts_.helpers);
  if (peers.empty()) {
    spdlog::info("reach: no peer to check our addresses with yet; advertising {}",
                 joined(candidates_));
    on_verdict({}, now);
    check_at_ = now + opts_.retry;
    return std::nullopt;
  }
  checking_ = true;
  last_check_ = now;
  check_at_.reset();
  Check c;
  c.helpers = std::move(peers);
  c.addresses = candidates_;
  if (c.addresses.size() > transport::kReachMaxAddresses)
    c.addresses.resize(transport::kReachMaxAddresses);
  return c;
}

// No helper answered: keep what we advertise. Otherwise advertise the addresses that were
// reached, or none (other nodes then reach us over the connections we open, and our relays).
bool ReachUpkeep::on_verdict(const transport::ReachCheck::Verdict& v, Time now) {
  const bool was_checking = std::exchange(checking_, false);
  if (was_checking) {
    // A helper answers one check per requester per 10 s: the next one after that when a
    // candidate changed meanwhile or nobody could check us.
    check_at_ = now + (recheck_soon_ || v.helpers == 0 ? opts_.retry : opts_.recheck);
    recheck_soon_ = false;
  }
  // Nobody could check us (asked again too soon, or gone) after a verdict: it stands.
  if (v.helpers == 0 && reach_ != Reachability::unchecked) return false;
  std::vector<std::string> now_addresses = candidates_;
  Reachability r = Reachability::unchecked;
  if (v.helpers > 0) {
    now_addresses = v.verified;
    r = v.reachable() ? Reachability::reachable : Reachability::unreachable;
  }
  const bool changed = now_addresses != addresses_ || r != reach_;
  if (v.helpers > 0 && (changed || reach_ == Reachability::unchecked)) {
    if (v.reachable())
      spdlog::info("reach: reachable at {} ({} peer(s) dialed us back)", joined(now_addresses),
                   v.helpers);
    else
      spdlog::warn(
          "reach: {} peer(s) could not dial us at {}{}: taking part over the connections we "
          "open (a port forward and --advertise IP:PORT make this node reachable)",
          v.helpers, joined(candidates_),
          v.observed ? " (they see us at " + *v.observed + ")" : std::string());
  }
  reach_ = r;
  if (r == Reachability::unreachable) {
    // Keep the relay addresses we have while the verdict stays the same; renew them now.
    if (changed) relays_.clear();
    now_addresses = relay_addresses();
    if (!renewing_) renew_at_ = now;
  } else {
    renew_at_.reset();
  }
  const bool moved = changed || now_addresses != addresses_;
  addresses_ = std::move(now_addresses);
  return moved;
}

void ReachUpkeep::set_mapped(std::string external, Time now) {
  if (stopped_) return;
  std::erase(candidates_, mapped_);
  mapped_ = std::move(external);
  if (!mapped_.empty() &&
      std::find(candidates_.begin(), candidates_.end(), mapped_) == candidates_.end())
    candidates_.insert(candidates_.begin(), mapped_);
  if (checking_) {
    recheck_soon_ = true;
    return;
  }
  // Helpers answer one check per requester per 10 s.
  check_at_ = last_check_ == Time::min() ? now : std::max(now, last_check_ + opts_.retry);
}

// ---- relays -----------------------------------------------------------------------------------

std::optional<ReachUpkeep::Time> ReachUpkeep::next_renewal() const {
  if (stopped_ || renewing_ || reach_ != Reachability::unreachable) return std::nullopt;
  return renew_at_;
}

// Every 15 s while we accept no connections (5 s while we have none): keep reservations at two
// reachable members, so that nodes which cannot dial us either (or that have no connection with
// us yet) reach us through them. Renewing also keeps those sessions busy (idle ones are closed).
std::vector<ReachUpkeep::Relay> ReachUpkeep::begin_renewal(const std::vector<dht::MemberInfo>& live,
                                                           const transport::NodeId& self,
                                                           Time now) {
  if (stopped_ || renewing_ || reach_ != Reachability::unreachable) return {};
  renew_at_ = now + (relays_.empty() ? opts_.renew_empty : opts_.renew);
  std::vector<Relay> pick = relays_;
  std::vector<dht::MemberInfo> others;
  for (const auto& m : live) {
    if (m.id == self || m.reach == Reachability::unreachable || m.addresses.empty() ||
        m.addresses.front().starts_with("relay:"))
      continue;
    if (std::any_of(pick.begin(), pick.end(), [&](const Relay& p) { return p.first == m.id; }))
      continue;
    if (auto it = refused_.find(m.id); it != refused_.end() && now - it->second < opts_.refused_for)
      continue;
    others.push_back(m);
  }
  // Members whose addresses were checked first, then those not checked yet (the first node of
  // a swarm, until it has peers to ask).
  std::shuffle(others.begin(), others.end(), rng_);
  std::stable_partition(others.begin(), others.end(),
                        [](const auto& m) { return m.reach == Reachability::reachable; });
  for (const auto& m : others) {
    if (pick.size() >= opts_.relays) break;
    pick.emplace_back(m.id, m.addresses.front());
  }
  renewing_ = !pick.empty();
  return pick;
}

bool ReachUpkeep::on_renewal(std::vector<Relay> ok, const std::vector<transport::NodeId>& refused,
                             Time now) {
  renewing_ = false;
  for (const auto& id : refused) refused_[id] = now;
  while (refused_.size() > 4096) refused_.erase(refused_.begin());
  std::sort(ok.begin(), ok.end());
  auto before = relays_;
  std::sort(before.begin(), before.end());
  relays_ = std::move(ok);
  if (reach_ != Reachability::unreachable || relays_ == before) return false;
  addresses_ = relay_addresses();
  spdlog::info("reach: reachable through {} relay(s): {}", relays_.size(), joined(addresses_));
  return true;
}

}  // namespace grove::node
