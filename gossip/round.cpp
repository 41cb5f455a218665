#include "gossip/round.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "dht/key.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

using transport::errc;

const char* to_string(RoundReport::Kind k) {
  switch (k) {
    case RoundReport::Kind::round:
      return "round";
    case RoundReport::Kind::synced:
      return "synced";
    case RoundReport::Kind::sync_failed:
      return "sync_failed";
  }
  return "?";
}

Digest weights_hash(std::span<const float> phi) {
  return transport::blake2b_256(
      {reinterpret_cast<const std::uint8_t*>(phi.data()), phi.size_bytes()});
}

namespace {

std::string hex8(const Digest& d) {
  return transport::to_hex(std::span(d).first(4));
}

// Wraps a callback so that it does nothing once the engine is gone (the DHT and the membership
// may outlive it and still hold its callbacks).
template <class F>
auto guarded(const std::shared_ptr<bool>& alive, F f) {
  return [w = std::weak_ptr<bool>(alive), f = std::move(f)](auto&&... args) mutable {
    if (auto a = w.lock(); a && *a) f(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace

RoundEngine::RoundEngine(dht::DhtNode& dht, dht::Membership& members, std::string run_id,
                         std::vector<std::string> addresses, RoundOptions opts,
                         std::shared_ptr<StateServer> server)
    : dht_(dht),
      members_(members),
      run_id_(std::move(run_id)),
      addresses_(std::move(addresses)),
      opts_(std::move(opts)),
      server_(std::move(server)) {
  if (!dht::valid_run_id(run_id_)) throw transport::ConfigError("invalid run id: " + run_id_);
  MatchOptions pair = opts_.match, group = opts_.match;
  pair.group_size = 2;
  pair.same_round = false;
  group.group_size = opts_.diloco_group;
  group.same_round = true;
  pairs_ = std::make_unique<Matchmaker>(dht_, run_id_, pair);
  groups_ = std::make_unique<Matchmaker>(dht_, run_id_, group);
  // A ready record for the window is itself fresh evidence that its owner lives; only members
  // seen leaving (or expiring) are passed over. Filtering on the view instead would make a member
  // that has not seen a new joiner's record yet compute other groups than the joiner does.
  auto live = [this](const NodeId& id) { return !departed_.contains(id); };
  pairs_->set_live_filter(live);
  groups_->set_live_filter(live);
  members_.watch(guarded(alive_, [this](dht::MemberEvent e, const dht::MemberInfo& m) {
    if (e == dht::MemberEvent::left) {
      departed_.insert(m.id);
      while (departed_.size() > 4096) departed_.erase(departed_.begin());
      return;
    }
    departed_.erase(m.id);  // back (a restart keeps its identity)
    check_member(m);
  }));
}

RoundEngine::~RoundEngine() {
  *alive_ = false;
}

// ---- starting ---------------------------------------------------------------------------------

void RoundEngine::start(optim::OuterState state, Time now) {
  if (state.momentum.size() != state.phi.size()) state.momentum.assign(state.phi.size(), 0.0f);
  state_ = std::move(state);
  has_state_ = true;
  phase_ = Phase::idle;
  after_state(now);
  poll_modes(now);
}

void RoundEngine::join(Time now, std::optional<std::size_t> values) {
  expect_values_ = values;
  poll_modes(now);
  begin_sync(0, true, "joining", now);
}

// ---- the round ---------------------------------------------------------------------------------

void RoundEngine::submit(std::vector<float> theta, Time now) {
  if (phase_ != Phase::idle) throw std::logic_error("RoundEngine::submit while not idle");
  if (theta.size() != state_.phi.size())
    throw std::invalid_argument("RoundEngine::submit: θ has " + std::to_string(theta.size()) +
                                " values, φ " + std::to_string(state_.phi.size()));
  theta_ = std::move(theta);
  submitted_ = now;
  round_mode_ = mode_of(state_.round);
  const bool switched = state_.round > 0 && mode_of(state_.round - 1) != round_mode_;
  entering_diloco_ = switched && round_mode_ == OuterMode::diloco;
  // NoLoCo's m and DiLoCo's b are different quantities (and signs): restart from zero.
  if (switched) std::fill(state_.momentum.begin(), state_.momentum.end(), 0.0f);
  if (repair_) {
    auto rep = std::exchange(repair_, std::nullopt);
    if (round_mode_ == OuterMode::diloco) {
      // This phase was trained from slow weights that are not the group's: drop it and take
      // the group's state (its donors hold the group's φ of that round or later).
      ++repairs_;
      return begin_sync(
          rep->round, false,
          "slow weights differ from the group's after round " + std::to_string(rep->round - 1), now,
          std::move(rep->donors));
    }
  }
  phase_ = Phase::matching;
  publish_self("averaging");
  declare_ready(now);
}

void RoundEngine::declare_ready(Time now) {
  const bool diloco = round_mode_ == OuterMode::diloco;
  auto& mm = diloco ? *groups_ : *pairs_;
  // DiLoCo: members at our round that are missing from a window's group would average apart
  // from it one window later, and the two halves' slow weights would differ from then on. Our
  // record asks the group to wait for them (a window or two; a dead member is given up on after
  // that, it leaves the view). The group decides from its records, which every member reads
  // alike, not from each member's own view: a member that waited while the others started
  // would split the group.
  // Likewise the group as a whole takes the swarm's newer state when one of its members has
  // seen the round ended elsewhere (`behind`), and a group made only of members that synced
  // into this round (joiners, whose donors may be averaging it right now) waits for the
  // members that were there before them, up to group_wait.
  std::uint32_t wait_for = 0;
  bool behind = false, fresh = false;
  if (diloco && !entering_diloco_) {
    const Others view = others(now);
    const Time waited = mm.read_time(now) - submitted_;
    behind = view.ahead;
    fresh = synced_into_round_ && waited < opts_.group_wait;
    if (opts_.diloco_group == 0 && !view.ahead &&
        waited < std::min(opts_.group_wait, 3 * opts_.match.window))
      wait_for = static_cast<std::uint32_t>(view.at_round + 1);
  }
  if (!diloco) mm.set_swarm_size(members_.live(now).size());  // sets the number of buckets
  mm.ready(state_.round, addresses_, now,
           guarded(alive_, [this](MatchResult m) { on_match(std::move(m), dht_.now()); }),
           entering_diloco_, phi_hash_, wait_for, behind, fresh);
}

RoundEngine::Others RoundEngine::others(Time now) const {
  Others o;
  for (const auto& mem : members_.live(now)) {
    if (mem.id == dht_.id() || departed_.contains(mem.id)) continue;
    ++o.live;
    o.ahead |= mem.round > state_.round;
    o.at_round += mem.round == state_.round;
  }
  return o;
}

std::vector<float> RoundEngine::delta() const {
  std::vector<float> d(state_.phi.size());
  optim::pseudo_gradient(state_.phi, theta_, d, opts_.threads);
  return d;
}

void RoundEngine::on_match(MatchResult m, Time now) {
  if (phase_ != Phase::matching) return;
  RoundReport r;
  r.round = state_.round;
  r.mode = round_mode_;
  r.group = m.group;
  const bool diloco = round_mode_ == OuterMode::diloco;
  if (diloco && m.out_of_sync) {
    // Behind the window's majority: take the state that group will hold after its round, or,
    // when only one member is at that round (it waits for the others), the state it holds now.
    const std::uint64_t want = m.at_swarm_round >= 2 ? m.swarm_round + 1 : m.swarm_round;
    begin_sync(want, false, "left out of round " + std::to_string(state_.round) + ": " + m.note,
               now);
    return;
  }
  const Others view = diloco ? others(now) : Others{};
  if (m.group.size() < 2) {
    r.note = m.note;
    if (diloco && view.live > 0 && !view.ahead && now - submitted_ < opts_.group_wait)
      return declare_ready(now);  // nobody has ended this round without us: wait for the group
    if (diloco && view.ahead) {
      // The others averaged without us: our slow weights would differ from theirs from now on.
      begin_sync(state_.round + 1, false,
                 "left out of round " + std::to_string(state_.round) + ": " + m.note, now);
      return;
    }
    if (diloco && view.live > 0)
      r.note += "; waited " + std::to_string(opts_.group_wait.count() / 1000) + " s for the group";
    auto w = local_step(r);
    return finish_round(std::move(r), std::move(w));
  }
  // Decisions every member of the group takes alike, from the records they all read
  // (declare_ready says why): the swarm has ended this round, so take its state; the group
  // lacks members at its round, or holds joiners only: wait a window.
  if (diloco && !m.average_phi && m.behind)
    return begin_sync(state_.round + 1, false,
                      "left out of round " + std::to_string(state_.round) +
                          ": the swarm has ended it without this window's group",
                      now);
  if (diloco && !m.average_phi && (m.wait_for > m.group.size() || m.all_fresh))
    return declare_ready(now);
  const OpId op = group_op(run_id_, m.window, m.group);
  const NodeId self = dht_.id();
  StartOp start;
  start.op = op;
  for (const auto& id : m.group)
    if (auto it = m.addresses.find(id); it != m.addresses.end() && id != self)
      start.addresses.emplace(id, it->second);
  if (!diloco) {
    auto tensors = std::make_shared<std::vector<std::vector<float>>>();
    if (opts_.noloco.one_tensor()) {
      // θ moves into the exchange (its mean, ours alone when nobody completes, is what the step
      // takes): one model-sized copy less while the exchange runs.
      tensors->push_back(std::move(theta_));
      theta_.clear();
    } else {
      tensors->push_back(delta());
      tensors->push_back(state_.phi);
    }
    start.make = [op, self, group = m.group, tensors, o = opts_.exchange](Time t) {
      return std::make_unique<GroupExchange>(op, self, group, std::move(*tensors), o, t);
    };
  } else {
    auto input = std::make_shared<std::vector<float>>();
    average_phi_ = m.average_phi;
    group_round_ = m.swarm_round;
    if (average_phi_) {
      // The slow weights differ after NoLoCo rounds: average them once with the pseudo-gradient.
      *input = state_.phi;
      const auto d = delta();
      input->insert(input->end(), d.begin(), d.end());
    } else {
      *input = delta();
    }
    // The previous all-reduce's result buffer is reused: its pages are already mapped.
    auto out = std::make_shared<optim::FloatBuffer>(std::move(spare_));
    start.make = [op, self, ring = m.group, input, out, o = opts_.allreduce](Time t) {
      return std::make_unique<RingAllReduce>(op, self, ring, std::move(*input), o, t,
                                             std::move(*out));
    };
  }
  op_ = op;
  group_ = m.group;
  phase_ = Phase::running;
  ops_.push_back(std::move(start));
}

// ---- the step ----------------------------------------------------------------------------------

std::shared_ptr<RoundEngine::StepWork> RoundEngine::step_work(StepWork::Kind kind) {
  auto w = std::make_shared<StepWork>();
  w->kind = kind;
  w->mode = round_mode_;
  w->state = std::move(state_);  // φ, momentum (and error buffer) go with the job
  state_ = {};
  state_.round = w->state.round;
  ++w->state.round;
  w->theta = std::move(theta_);  // the input of a local step; else the buffer given back after
  theta_.clear();
  w->noloco = opts_.noloco;
  w->diloco = opts_.diloco;
  w->threads = opts_.threads;
  w->serialise = opts_.serve_state && server_;
  return w;
}

std::shared_ptr<RoundEngine::StepWork> RoundEngine::local_step(RoundReport& r) {
  r.local_only = true;
  return step_work(StepWork::Kind::local);
}

void RoundEngine::StepWork::run() {
  auto& phi = state.phi;
  auto& m = state.momentum;
  switch (kind) {
    case Kind::none:
      break;
    case Kind::local:
      if (mode == OuterMode::noloco && noloco.one_tensor()) {
        optim::noloco_step_theta(phi, m, theta, noloco, threads);
      } else {
        std::vector<float> d(phi.size());
        optim::pseudo_gradient(phi, theta, d, threads);
        if (mode == OuterMode::diloco) {
          optim::diloco_step(phi, m, d, diloco, threads);
        } else {
          const auto phi0 = phi;
          optim::noloco_step(phi, m, d, phi0, noloco, threads);
        }
      }
      break;
    case Kind::noloco_mean:
      if (noloco.one_tensor())
        optim::noloco_step_theta(phi, m, theta, noloco, threads);
      else
        optim::noloco_step(phi, m, theta, phi_mean, noloco, threads);
      break;
    case Kind::parse: {
      auto s = optim::deserialize(blob, max_values);
      blob = {};
      if (!s) {
        error = "the downloaded state does not parse";
        return;
      }
      if (want && s->phi.size() != *want) {
        error = "the downloaded state has " + std::to_string(s->phi.size()) + " values, we need " +
                std::to_string(*want);
        return;
      }
      if (s->momentum.size() != s->phi.size()) s->momentum.assign(s->phi.size(), 0.0f);
      state = std::move(*s);
      break;
    }
    case Kind::diloco_ring: {
      std::span<const float> mean_delta(ring);
      if (average_phi) {
        // Members entered from NoLoCo: one φ, one momentum (zero) and one round for the group.
        const auto n = static_cast<std::ptrdiff_t>(phi.size());
        std::copy(ring.begin(), ring.begin() + n, phi.begin());
        std::fill(m.begin(), m.end(), 0.0f);
        mean_delta = mean_delta.subspan(phi.size());
      }
      optim::diloco_step(phi, m, mean_delta, diloco, threads);
      break;
    }
  }
  phi_mean = {};
  hash = weights_hash(phi);
  if (serialise) bytes = std::make_shared<const std::vector<std::uint8_t>>(optim::serialize(state));
}

void RoundEngine::on_op_finished(std::unique_ptr<Protocol> p, Time now) {
  if (phase_ != Phase::running || (p && p->op() != *op_)) return;
  RoundReport r;
  r.round = state_.round;
  r.mode = round_mode_;
  r.group = group_;
  op_.reset();
  if (!p) {
    r.note = "the driver could not run the operation";
    if (round_mode_ == OuterMode::diloco) return begin_sync(state_.round, false, r.note, now);
    if (theta_.empty()) {  // θ went with the exchange: this inner phase is lost, φ stays
      r.local_only = true;
      r.note += "; the inner phase's θ went with it: slow weights unchanged";
      return finish_round(std::move(r), step_work(StepWork::Kind::none));
    }
    auto w = local_step(r);
    return finish_round(std::move(r), std::move(w));
  }
  if (auto* ex = dynamic_cast<GroupExchange*>(p.get())) {
    r.averaged_with = ex->completed();
    r.bytes_sent = ex->bytes_sent();
    r.bytes_received = ex->bytes_received();
    for (const auto& [peer, why] : ex->failures())
      r.note += (r.note.empty() ? "" : "; ") + dht::short_hex(peer) + ": " + why;
    r.local_only = r.averaged_with.empty();
    // Ours alone when nobody completed: the local-only step. The mean's buffer comes back as
    // the report's spare.
    auto mean = ex->take_mean();
    auto w = step_work(StepWork::Kind::noloco_mean);
    w->theta = std::move(mean.at(0));
    if (!opts_.noloco.one_tensor()) w->phi_mean = std::move(mean.at(1));
    return finish_round(std::move(r), std::move(w));
  }
  auto* ar = dynamic_cast<RingAllReduce*>(p.get());
  if (!ar) return;
  r.bytes_sent = ar->stats().bytes_sent;
  r.bytes_received = ar->stats().bytes_received;
  if (ar->status() != OpStatus::done) {
    return begin_sync(
        state_.round, false,
        "all-reduce of round " + std::to_string(state_.round) + " failed: " + ar->failure(), now);
  }
  for (const auto& id : ar->members())
    if (id != dht_.id()) r.averaged_with.push_back(id);
  if (average_phi_) {
    state_.round = std::max(state_.round, group_round_);
    r.round = state_.round;
    r.note = "slow weights averaged (members entering DiLoCo, or holding different ones)";
  }
  r.local_only = r.averaged_with.empty();
  if (ar->suspects().size())
    r.note += (r.note.empty() ? "" : "; ") + std::to_string(ar->suspects().size()) +
              " member(s) excluded";
  std::set<NodeId> members(ar->members().begin(), ar->members().end());
  auto w = step_work(StepWork::Kind::diloco_ring);
  w->average_phi = average_phi_;
  w->ring = ar->take_result();
  finish_round(std::move(r), std::move(w), std::move(members));
}

void RoundEngine::finish_round(RoundReport r, std::shared_ptr<StepWork> w,
                               std::set<NodeId> members) {
  step_report_ = std::move(r);
  step_members_ = std::move(members);
  hand_over(std::move(w));
}

void RoundEngine::hand_over(std::shared_ptr<StepWork> w) {
  phase_ = Phase::stepping;
  step_ = w;
  step_jobs_.push_back({++step_seq_, [w] { w->run(); }});
}

void RoundEngine::on_step_done(std::uint64_t seq, Time now) {
  if (phase_ != Phase::stepping || seq != step_seq_ || !step_) return;
  const auto w = std::exchange(step_, nullptr);
  if (w->kind == StepWork::Kind::parse) return synced(w, now);
  RoundReport r = std::exchange(step_report_, {});
  state_ = std::move(w->state);
  phi_hash_ = w->hash;
  if (w->kind == StepWork::Kind::diloco_ring) spare_ = std::move(w->ring);
  if (w->theta.size() == state_.phi.size()) r.spare = std::move(w->theta);
  synced_into_round_ = false;
  r.sync_time = now - submitted_;
  phase_ = Phase::idle;
  publish_state(std::move(w->bytes));  // (the old snapshot is served until the step is done)
  r.weights_hash = phi_hash_;
  reports_.push_back(std::move(r));
  if (step_members_.size() > 1) {
    expect_[state_.round] = Expect{phi_hash_, std::exchange(step_members_, {}), {}};
    while (expect_.size() > 16) expect_.erase(expect_.begin());
    for (const auto& m : members_.live(now)) check_member(m);
  }
  step_members_.clear();
}

void RoundEngine::publish_self(const char* status) {
  auto self = members_.self();
  self.round = state_.round;
  self.weights_hash = phi_hash_;
  self.status = status;
  if (self.addresses.empty()) self.addresses = addresses_;
  members_.set_self(self);
}

void RoundEngine::after_state(Time) {
  phi_hash_ = weights_hash(state_.phi);  // once per new φ: reports, record and checks reuse it
  std::shared_ptr<const std::vector<std::uint8_t>> bytes;
  if (opts_.serve_state && server_)
    bytes = std::make_shared<const std::vector<std::uint8_t>>(optim::serialize(state_));
  publish_state(std::move(bytes));
}

void RoundEngine::publish_state(std::shared_ptr<const std::vector<std::uint8_t>> bytes) {
  publish_self("training");
  // Snapshots nobody fetches go before the new one is hashed (one state's bytes less at the
  // peak; the old state's bytes are freed once nothing else, a checkpoint being written, holds
  // them).
  if (bytes && server_) server_->make_room();
  state_bytes_ = std::move(bytes);
  snapshot_jobs_.clear();  // (a job not taken yet is of an older state)
  if (!state_bytes_ || !opts_.serve_state || !server_) return;
  snapshot_jobs_.push_back(
      {++snapshot_seq_, state_.round, run_id_, state_bytes_, opts_.snapshot_chunk});
}

void RoundEngine::on_snapshot(std::uint64_t seq, std::shared_ptr<const StateSnapshot> snap,
                              Time now) {
  if (seq != snapshot_seq_ || !snap || !opts_.serve_state || !server_) return;  // superseded
  server_->add(snap);
  StateOffer o;
  o.address = addresses_.empty() ? "" : addresses_.front();
  o.run_id = run_id_;
  o.round = state_.round;
  o.size = snap->size();
  o.root = snap->root();
  offer_seq_ =
      std::max(offer_seq_ + 1, static_cast<std::uint64_t>(std::max<std::int64_t>(now.count(), 0)));
  dht_.put_signed(state_key(run_id_), "state", offer_seq_, now + opts_.offer_ttl, encode_offer(o),
                  now);
}

void RoundEngine::set_group_wait(Time t) {
  opts_.group_wait = t;
}

void RoundEngine::set_patience(Time t) {
  if (pairs_) pairs_->set_patience(t);
  if (groups_) groups_->set_patience(t);
}

void RoundEngine::mix(std::span<float> theta, float alpha) const {
  if (theta.size() != state_.phi.size())
    throw std::invalid_argument("RoundEngine::mix: size mismatch");
  for (std::size_t i = 0; i < theta.size(); ++i)
    theta[i] = alpha * theta[i] + (1.0f - alpha) * state_.phi[i];
}

// ---- consistency -------------------------------------------------------------------------------

void RoundEngine::check_member(const dht::MemberInfo& m) {
  if (m.id == dht_.id() || m.run_id != run_id_) return;
  const auto it = expect_.find(m.round);
  if (it == expect_.end() || !it->second.group.contains(m.id)) return;
  if (!checked_.insert({m.round, m.id}).second) return;
  while (checked_.size() > 4096) checked_.erase(checked_.begin());
  it->second.seen[m.id] = m.weights_hash;
  if (m.weights_hash != it->second.hash) {
    ++mismatches_;
    spdlog::error(
        "slow weights differ after DiLoCo round {}: member {} published {} but ours are {} "
        "({} mismatch(es) so far)",
        m.round - 1, dht::short_hex(m.id), hex8(m.weights_hash), hex8(it->second.hash),
        mismatches_);
  }
  judge(m.round);
}

// Which φ is the group's after a DiLoCo round: the hash a strict majority of its members
// published, or, once all of them have, the most common one (ties to the lowest hash, so that
// every member reaches the same verdict). A member holding another φ re-syncs from the holders.
void RoundEngine::judge(std::uint64_t round) {
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

// ---- mode schedule
// -------------------------------------------------------------------------------

OuterMode RoundEngine::mode_of(std::uint64_t round) const {
  return mode_for_round(modes_, round, opts_.mode);
}

void RoundEngine::poll_modes(Time now) {
  if (mode_polling_) return;
  mode_polling_ = true;
  dht_.get(mode_key(run_id_), now, guarded(alive_, [this](dht::GetResult res) {
             mode_polling_ = false;
             next_mode_poll_ = dht_.now() + opts_.mode_poll;
             // Union with what we knew: one get may miss a record that another saw.
             for (auto& m : mode_requests(run_id_, res.records)) {
               const bool known = std::any_of(modes_.begin(), modes_.end(), [&](const auto& k) {
                 return k.requester == m.requester && k.from_round == m.from_round;
               });
               if (!known && modes_.size() < 1024) {
                 spdlog::info("run {}: {} from round {} (requested by {})", run_id_,
                              to_string(m.mode), m.from_round, dht::short_hex(m.requester));
                 modes_.push_back(std::move(m));
               }
             }
           }));
}

void RoundEngine::request_mode(OuterMode mode, std::optional<std::uint64_t> from_round, Time now,
                               std::function<void(transport::Result<std::uint64_t>)> done) {
  // From the highest round any live member has reached (a node that just joined may still be
  // behind), plus the lead that lets every member see the record before that round.
  std::uint64_t highest = state_.round + (phase_ == Phase::stepping && !syncing() ? 1 : 0);
  for (const auto& m : members_.live(now)) highest = std::max(highest, m.round);
  const std::uint64_t first = highest + opts_.mode_lead;
  const std::uint64_t r = from_round.value_or(first);
  if (r < first) {
    if (done) done(transport::make_error_code(errc::rejected));
    return;
  }
  ModeRequest req{dht_.id(), run_id_, mode, r};
  modes_.push_back(req);
  dht_.put_signed(mode_key(run_id_), mode_subkey(r), 1, now + Time(std::chrono::hours(23)),
                  encode_mode(req), now,
                  guarded(alive_, [r, done = std::move(done)](dht::PutResult pr) {
                    if (!done) return;
                    if (pr.acked == 0 && !pr.local)
                      done(transport::make_error_code(errc::unreachable));
                    else
                      done(r);
                  }));
}

// ---- state sync --------------------------------------------------------------------------------

void RoundEngine::begin_sync(std::uint64_t min_round, bool joining, std::string why, Time now,
                             std::set<NodeId> donors) {
  phase_ = Phase::syncing;
  sync_donors_ = std::move(donors);
  joining_ = joining;
  sync_min_round_ = min_round;
  sync_started_ = now;
  sync_why_ = std::move(why);
  download_.reset();
  op_.reset();
  if (!joining) spdlog::warn("{}; catching up by state sync", sync_why_);
  if (has_state_) publish_self("syncing");
  const std::uint64_t attempt = ++sync_attempt_;
  offers_retry_ = Time::max();
  dht_.get(state_key(run_id_), now, guarded(alive_, [this, attempt](dht::GetResult res) {
             on_offers(attempt, std::move(res), dht_.now());
           }));
}

void RoundEngine::on_offers(std::uint64_t attempt, dht::GetResult res, Time now) {
  if (attempt != sync_attempt_ || phase_ != Phase::syncing || download_) return;
  std::vector<std::pair<Digest, StateOffer>> found;
  for (const auto& rec : res.records) {
    if (rec.subkey != "state") continue;
    auto o = decode_offer(rec.value);
    if (!o || o->run_id != run_id_ || o->round < sync_min_round_) continue;
    o->donor = rec.owner_id();
    if (o->donor == dht_.id() || o->address.empty()) continue;
    if (!sync_donors_.empty() && !sync_donors_.contains(o->donor)) continue;
    // Joiners spread over the donors of the newest round: order ties by a hash of both ids.
    transport::Blake2b256 h;
    h.update(dht_.id());
    h.update(o->donor);
    found.emplace_back(h.final(), std::move(*o));
  }
  if (found.empty()) {
    if (now - sync_started_ < opts_.offers_wait) {
      offers_retry_ = now + std::clamp(opts_.match.window / 4, Time(100), Time(2000));
      return;
    }
    return sync_failed("no state offers for run " + run_id_, now);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.second.round != b.second.round ? a.second.round > b.second.round : a.first < b.first;
  });
  std::vector<StateOffer> offers;
  for (auto& [h, o] : found) offers.push_back(std::move(o));
  // A donor's offer cannot make us allocate more than a state of our size can take (catch-up),
  // or than the configured bound (join).
  auto sync = opts_.sync;
  if (has_state_ || expect_values_) {
    const std::uint64_t n = has_state_ ? state_.phi.size() : *expect_values_;
    sync.max_size = std::min<std::uint64_t>(sync.max_size, 3 * 4 * n + 4096);
  }
  download_ = std::make_unique<StateDownload>(run_id_, std::move(offers), sync, now);
}

std::vector<StateDownload::Request> RoundEngine::take_state_requests() {
  if (!download_) return {};
  return download_->take_requests();
}

void RoundEngine::on_state_response(std::uint64_t id, std::span<const std::uint8_t> body,
                                    Time now) {
  if (phase_ != Phase::syncing || !download_) return;
  download_->on_response(id, body, now);
  sync_done(now);
}

void RoundEngine::on_state_failure(std::uint64_t id, Time now) {
  if (phase_ != Phase::syncing || !download_) return;
  download_->on_failure(id, now);
  sync_done(now);
}

void RoundEngine::sync_done(Time now) {
  if (!download_ || download_->status() == OpStatus::running) return;
  if (download_->status() == OpStatus::failed) return sync_failed(download_->failure(), now);
  // Parsing, hashing and serialising a large state take seconds: a job for the driver.
  auto w = std::make_shared<StepWork>();
  w->kind = StepWork::Kind::parse;
  w->blob = download_->take_blob();
  w->max_values = opts_.max_values;
  w->want = has_state_ ? std::optional(state_.phi.size()) : expect_values_;
  w->serialise = opts_.serve_state && server_;
  sync_offer_ = download_->offer();
  download_.reset();
  offers_retry_ = Time::max();
  hand_over(std::move(w));
}

void RoundEngine::synced(const std::shared_ptr<StepWork>& w, Time now) {
  if (!w->error.empty()) return sync_failed(w->error, now);
  const StateOffer offer = sync_offer_;
  state_ = std::move(w->state);
  has_state_ = true;
  ++syncs_;
  // A joiner stays "fresh" until it ends a round; a member that catches up does not become
  // fresh (when every member had to catch up, nobody would be left to wait for).
  if (joining_) synced_into_round_ = true;
  phase_ = Phase::idle;
  theta_.clear();
  phi_hash_ = w->hash;
  publish_state(std::move(w->bytes));
  RoundReport r;
  r.kind = RoundReport::Kind::synced;
  r.round = state_.round;
  r.mode = mode_of(state_.round);
  r.weights_hash = phi_hash_;
  r.bytes_received = offer.size;
  r.sync_time = now - sync_started_;
  r.note = sync_why_ + ": state of round " + std::to_string(offer.round) + " from " +
           dht::short_hex(offer.donor);
  spdlog::info("{}", r.note);
  reports_.push_back(std::move(r));
}

void RoundEngine::sync_failed(std::string why, Time now) {
  download_.reset();
  offers_retry_ = Time::max();
  RoundReport r;
  r.round = state_.round;
  r.mode = mode_of(state_.round);
  r.note = sync_why_ + "; state sync failed: " + why;
  if (!has_state_) {
    phase_ = Phase::none;
    r.kind = RoundReport::Kind::sync_failed;
    spdlog::warn("{}", r.note);
    reports_.push_back(std::move(r));
    return;
  }
  // Catching up failed: keep our slow weights (the next round tells again whether we are out of
  // step) and let the node train on.
  spdlog::warn("{}; keeping our slow weights", r.note);
  phase_ = Phase::idle;
  theta_.clear();
  r.local_only = true;
  r.weights_hash = phi_hash_;
  r.sync_time = now - submitted_;
  publish_self("training");  // φ is unchanged: its snapshot and offer stand
  reports_.push_back(std::move(r));
}

// ---- timers ------------------------------------------------------------------------------------

void RoundEngine::on_timer(Time now) {
  pairs_->on_timer(now);
  groups_->on_timer(now);
  if (!mode_polling_ && now >= next_mode_poll_ && phase_ != Phase::none) poll_modes(now);
  if (phase_ == Phase::syncing) {
    if (download_) {
      download_->on_timer(now);
      sync_done(now);
    } else if (now >= offers_retry_) {
      offers_retry_ = Time::max();
      const std::uint64_t attempt = ++sync_attempt_;
      dht_.get(state_key(run_id_), now, guarded(alive_, [this, attempt](dht::GetResult res) {
                 on_offers(attempt, std::move(res), dht_.now());
               }));
    }
  }
}

std::optional<Time> RoundEngine::next_deadline() const {
  std::optional<Time> t;
  auto take = [&](std::optional<Time> d) {
    if (d && (!t || *d < *t)) t = d;
  };
  take(pairs_->next_deadline());
  take(groups_->next_deadline());
  if (!mode_polling_ && phase_ != Phase::none) take(next_mode_poll_);
  if (phase_ == Phase::syncing) {
    if (download_) take(download_->next_deadline());
    if (offers_retry_ != Time::max()) take(offers_retry_);
  }
  return t;
}

}  // namespace grove::gossip
