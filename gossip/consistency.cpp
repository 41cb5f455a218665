#include "gossip/consistency.hpp"

#include <spdlog/spdlog.h>

#include "gossip/progress.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

namespace {
std::string hex8(const Digest& d) {
  return transport::to_hex(std::span(d).first(4));
}
}  // namespace

void ConsistencyJudge::expect(std::uint64_t round, Digest ours, std::set<NodeId> group) {
  expect_[round] = Expect{ours, std::move(group), {}};
  while (expect_.size() > 16) expect_.erase(expect_.begin());
}

void ConsistencyJudge::on_member(const dht::MemberInfo& m) {
  if (m.id == self_ || m.run_id != run_id_) return;
  const Progress p = progress_of(m);
  const auto it = expect_.find(p.round);
  if (it == expect_.end() || !it->second.group.contains(m.id)) return;
  if (!checked_.insert({p.round, m.id}).second) return;
  while (checked_.size() > 4096) checked_.erase(checked_.begin());
  it->second.seen[m.id] = p.weights_hash;
  if (p.weights_hash != it->second.hash) {
    ++mismatches_;
    spdlog::error(
        "slow weights differ after DiLoCo round {}: member {} published {} but ours are {} "
        "({} mismatch(es) so far)",
        p.round - 1, dht::short_hex(m.id), hex8(p.weights_hash), hex8(it->second.hash),
        mismatches_);
  }
  judge(p.round);
}

void ConsistencyJudge::judge(std::uint64_t round) {
  const auto it = expect_.find(round);
  if (it == expect_.end() || repair_) return;
  const Expect& e = it->second;
  std::map<Digest, std::size_t> votes{{e.hash, 1}};
  for (const auto& [id, h] : e.seen) ++votes[h];
  auto best = votes.begin();
  for (auto v = votes.begin(); v != votes.end(); ++v)
    if (v->second > best->second) best = v;  // the map's order breaks ties to the lowest hash
  const bool majority = 2 * best->second > e.group.size();
  const bool everyone = e.seen.size() + 1 >= e.group.size();
  if (best->first == e.hash || !(majority || everyone)) return;
  Repair r;
  r.round = round;
  for (const auto& [id, h] : e.seen)
    if (h == best->first) r.donors.insert(id);
  spdlog::error(
      "our slow weights after DiLoCo round {} ({}) are not the group's ({}, held by {} of {}): "
      "replacing them by state sync before our next round",
      round - 1, hex8(e.hash), hex8(best->first), best->second, e.group.size());
  repair_ = std::move(r);
}

}  // namespace grove::gossip
