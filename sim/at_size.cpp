#include "sim/at_size.hpp"

#include <chrono>
#include <map>

#include "sim/swarm.hpp"

namespace grove::sim {

namespace {
// Words in a report's note that say a deadline fired (a timeout, a silent peer, a stalled
// sync, an expired record).
constexpr const char* kFired[] = {"timed out", "silent", "took none", "no progress", "expired"};
}  // namespace

SizeOutcome run_at_size(const SizeSetup& s) {
  using ms = std::chrono::milliseconds;
  const auto wall0 = std::chrono::steady_clock::now();
  auto o = fast_options(s.mode);
  o.params = 1024;
  o.stands_for = s.params;
  o.gossip_link.bytes_per_ms = s.mbit * 1e6 / 8 / 1000;
  o.gossip_link.latency = s.one_way;
  // Rounds of many minutes: membership records every half minute are plenty (and keep a day of
  // virtual time quick to simulate).
  o.membership.poll_every = ms(15'000);
  o.membership.publish_every = ms(30'000);
  o.membership.ttl = ms(90'000);
  Swarm w(s.seed, o);
  SizeOutcome out;
  out.averaged.assign(3, 0);
  out.rounds.assign(3, 0);
  std::map<std::size_t, gossip::Time> synced_at;
  bool watching = false;
  std::vector<gossip::Time> rounds_of_0;
  w.on_report([&](std::size_t i, const gossip::RoundReport& r) {
    using K = gossip::RoundReport::Kind;
    if (r.kind == K::synced && !synced_at.count(i)) synced_at[i] = w.now();
    for (const char* f : kFired)
      if (r.note.find(f) != std::string::npos)
        out.fired.push_back("node " + std::to_string(i) + ": " + r.note);
    if (!watching || r.kind != K::round || i >= 3) return;
    out.averaged[i] += !r.averaged_with.empty();
    ++out.rounds[i];
    if (i == 0) rounds_of_0.push_back(w.now());
  });
  const auto spec = [&](std::size_t i) {
    NodeSpec n{s.inner, {}};
    n.overlap = s.overlap;
    if (i < s.step_time.size()) n.step_time = s.step_time[i];
    return n;
  };
  w.bootstrap(spec(0));
  w.join(0, spec(1));
  out.bound_s = 8 * s.params / (s.mbit * 1e6 / 8);
  const gossip::Time day = ms(24 * 3600 * 1000);
  if (!w.run_until([&] { return w.rounds(1) >= 2; }, day)) return out;
  watching = true;
  const gossip::Time t0 = w.now();
  out.joiner = w.join(0, spec(2));
  // Until the joiner has ended two rounds and the first two nodes two more each (a DiLoCo
  // group's members report one round's end one after the other): over lines this slow a pair's
  // exchange lasts several inner phases, and the joiner takes local rounds meanwhile.
  out.completed =
      w.run_until(
          [&] { return w.rounds(out.joiner) >= 2 && out.rounds[0] >= 2 && out.rounds[1] >= 2; },
          2 * day) &&
      synced_at.count(out.joiner);
  if (synced_at.count(out.joiner))
    out.join_s = std::chrono::duration<double>(synced_at[out.joiner] - t0).count();
  if (rounds_of_0.size() > 1)
    out.round_s = std::chrono::duration<double>(rounds_of_0.back() - rounds_of_0.front()).count() /
                  static_cast<double>(rounds_of_0.size() - 1);
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

}  // namespace grove::sim
