#include "gossip/round.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>

#include <spdlog/spdlog.h>

#include "dht/key.hpp"
#include "gossip/guarded.hpp"
#include "gossip/progress.hpp"
#include "optim/splitmix.hpp"
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
    case RoundReport::Kind::sync_progress:
      return "sync_progress";
    case RoundReport::Kind::saved:
      return "saved";
  }
  return "?";
}

RoundEngine::RoundEngine(dht::RecordStore& store, dht::Membership& members, std::string run_id,
                         std::vector<std::string> addresses, RoundOptions opts,
                         std::shared_ptr<StateServer> server)
    : store_(store),
      members_(members),
      run_id_(std::move(run_id)),
      addresses_(std::move(addresses)),
      opts_(std::move(opts)),
      server_(std::move(server)),
      judge_(store.id(), run_id_) {
  if (!dht::valid_run_id(run_id_)) throw transport::ConfigError("invalid run id: " + run_id_);
  if (!opts_.blobs) opts_.blobs = memory_blob_store();
  opts_.exchange.alloc = opts_.floats;
  op_deadlines_ = OpDeadlines(opts_.op_deadline);
  MatchOptions pair = opts_.match, group = opts_.match;
  pair.group_size = std::max<std::size_t>(2, opts_.noloco_group);
  pair.same_round = false;
  group.group_size = opts_.diloco_group;
  group.same_round = true;
  pairs_ = std::make_unique<Matchmaker>(store_, run_id_, pair);
  groups_ = std::make_unique<Matchmaker>(store_, run_id_, group);
  // A ready record for the window is itself fresh evidence that its owner lives; only members
  // seen leaving (or expiring) are passed over. Filtering on the view instead would make a member
  // that has not seen a new joiner's record yet compute other groups than the joiner does.
  auto live = [this](const NodeId& id) { return !departed_.contains(id); };
  pairs_->set_live_filter(live);
  groups_->set_live_filter(live);
  // NoLoCo: a member whose record says it is averaging, though it was not ready in our window, is
  // mid-exchange (MatchOptions::busy_cap): a node alone keeps waiting for it.
  pairs_->set_busy_probe([this](Time now) { return others(now).busy > 0; });
  members_.watch(guarded(alive_, [this](dht::MemberEvent e, const dht::MemberInfo& m) {
    if (e == dht::MemberEvent::left) {
      departed_.insert(m.id);
      while (departed_.size() > 4096) departed_.erase(departed_.begin());
      return;
    }
    departed_.erase(m.id);  // back (a restart keeps its identity)
    judge_.on_member(m);
  }));
}

RoundEngine::~RoundEngine() {
  *alive_ = false;
}

// ---- starting ---------------------------------------------------------------------------------

void RoundEngine::start(optim::OuterState state, Time now) {
  if (state.momentum.size() != state.phi.size())
    state.momentum = optim::Floats::zeros(state.phi.size(), opts_.floats);
  // Arrays given on the heap move into pages of ours (when we have an allocator), a fragment at
  // a time.
  for (optim::Floats* a : {&state.phi, &state.momentum, &state.error}) {
    if (a->paged() || a->empty() || !opts_.floats) continue;
    auto p = optim::Floats::zeros(a->size(), opts_.floats);
    if (!p.paged()) break;  // (the allocator failed and said why: the heap it is)
    optim::by_fragments(a->size(),
                        [&](std::size_t lo, std::size_t hi) {
                          std::copy(a->begin() + lo, a->begin() + hi, p.begin() + lo);
                        },
                        {&p});
    *a = std::move(p);
  }
  state_ = std::move(state);
  ++state_gen_;
  has_state_ = true;
  phase_ = Phase::idle;
  idle_at_ = now;
  catch_up_.reset();  // (a join given up on: its requests and answers are dropped)
  after_state(now);
  poll_modes(now);
}

void RoundEngine::join(Time now, std::optional<std::size_t> values) {
  expect_values_ = values;
  poll_modes(now);
  begin_sync(0, true, "joining", now);
}

// ---- the round ---------------------------------------------------------------------------------

void RoundEngine::submit(optim::Floats theta, Time now) {
  // The driver's contract (its bugs, not peer input): idle, and θ the size of φ.
  assert(phase_ == Phase::idle && theta.size() == state_.phi.size());
  if (phase_ != Phase::idle || theta.size() != state_.phi.size()) {
    spdlog::error("round engine: a θ of {} values submitted while {} (φ has {}): dropped",
                  theta.size(), phase_ == Phase::idle ? "idle" : "busy", state_.phi.size());
    return;
  }
  theta_ = std::move(theta);
  inner_ = now - idle_at_;
  submitted_ = now;
  round_mode_ = mode_of(state_.round);
  const bool switched = state_.round > 0 && mode_of(state_.round - 1) != round_mode_;
  entering_diloco_ = switched && round_mode_ == OuterMode::diloco;
  // NoLoCo's m and DiLoCo's b are different quantities (and signs): restart from zero.
  if (switched) std::fill(state_.momentum.begin(), state_.momentum.end(), 0.0f);
  // DiLoCo: ‖Δ‖ goes into our ready records; the group leaves out a member far above the others
  // and bounds its mean by the members' norms (gossip/matchmaking.hpp). Compressed rounds
  // declare ‖e‖, e = decay·e + Δ: the error buffer that their message is cut from (its decoding
  // is no larger, up to the codec's rounding). Either reads θ and φ whole (and writes e): seconds
  // for a large model, a job for the driver, off the strand.
  error_has_delta_ = round_mode_ == OuterMode::diloco && !entering_diloco_ && opts_.compressed;
  delta_norm_ = fresh_norm_ = std::numeric_limits<double>::quiet_NaN();
  // Streaming fragments: this round's part of φ (every member of a group is at its round).
  fragment_ = state_.round % std::max<std::size_t>(opts_.fragments, 1);
  slice_ = round_mode_ == OuterMode::diloco && !entering_diloco_
               ? slice_of(state_.phi.size(), std::max<std::size_t>(opts_.fragments, 1), fragment_)
               : Slice{};
  if (round_mode_ == OuterMode::diloco && !entering_diloco_) {
    auto w = std::make_shared<StepWork>();
    w->kind = StepWork::Kind::prepare;
    w->slice = slice_;
    lend_state(*w);
    w->theta = std::move(theta_);
    theta_.clear();
    if (error_has_delta_) w->compressed = opts_.compressed;
    w->alloc = opts_.floats;
    w->threads = opts_.threads;
    return hand_over(std::move(w));
  }
  ready(now);
}

void RoundEngine::ready(Time now) {
  if (auto rep = judge_.take_repair()) {
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
    // Members of our last group whose records still say they are ending that round (a poll
    // behind, or their step is slower) are at our round in a moment: wait for them too.
    // (Counted again from the last wait for a member fetching the state: it is in now.)
    if (opts_.diloco_group == 0 && !view.ahead &&
        mm.read_time(now) - std::max(submitted_, synced_seen_) <
            std::min(opts_.group_wait, 3 * opts_.match.window) + newcomer_phase())
      wait_for = static_cast<std::uint32_t>(view.at_round + view.finishing + 1);
    if (opts_.diloco_group == 0 && wait_for_syncing(view, waited, now))
      wait_for = static_cast<std::uint32_t>(view.at_round + view.syncing + 1);
  }
  if (!diloco) {
    mm.set_swarm_size(members_.live(now).size());  // sets the number of buckets
    // A member mid-exchange is waited for (MatchOptions::busy_cap) at most as long as an
    // exchange of three members takes at the rate ours have run (the least rate before one has).
    const std::uint64_t values =
        (opts_.noloco.one_tensor() ? 1 : 2) * static_cast<std::uint64_t>(state_.phi.size());
    const double s = static_cast<double>(exchange_wire_bytes(opts_.exchange.codec, values, 2)) /
                     op_deadlines_.rate();
    mm.set_busy_cap(Time(static_cast<Time::rep>(std::min(s, 30.0 * 86400.0) * 1000.0)));
  }
  mm.ready(state_.round, addresses_, now,
           guarded(alive_, [this](MatchResult m) { on_match(std::move(m), store_.now()); }),
           entering_diloco_, phi_hash_, wait_for, behind, fresh, delta_norm_);
}

void RoundEngine::on_match(MatchResult m, Time now) {
  if (phase_ != Phase::matching) return;
  RoundReport r;
  r.round = state_.round;
  r.mode = round_mode_;
  r.group = m.group;
  r.window = m.window;
  r.ready_seen = m.ready_seen;
  r.ready_not_live = m.ready_not_live;
  r.ready_late = m.write_late;
  const bool diloco = round_mode_ == OuterMode::diloco;
  if (diloco && m.out_of_sync) {
    // Behind the window's majority: take the state that group will hold after its round, or,
    // when only one member is at that round (it waits for the others), the state it holds now.
    const std::uint64_t want = m.at_swarm_round >= 2 ? m.swarm_round + 1 : m.swarm_round;
    begin_sync(want, false, "left out of round " + std::to_string(state_.round) + ": " + m.note,
               now);
    return;
  }
  for (const auto& id : m.left_out) {
    norm_left_out_[id] = state_.round;
    if (id != store_.id())
      spdlog::warn(
          "round {}: {} is left out of the group: it declared no pseudo-gradient norm "
          "(its Δ could not be bounded)",
          state_.round, dht::short_hex(id));
  }
  for (auto it = norm_left_out_.begin(); it != norm_left_out_.end();)
    it = it->second + 2 < state_.round || norm_left_out_.size() > 64 ? norm_left_out_.erase(it)
                                                                     : std::next(it);
  if (diloco && m.norm_excluded) {
    // We declared no ‖Δ‖ (we could not measure it): the group ends the round without us, and
    // we take its state.
    begin_sync(state_.round + 1, false,
               "left out of round " + std::to_string(state_.round) + ": " + m.note, now);
    return;
  }
  const Others view = diloco ? others(now) : Others{};
  if (m.group.size() < 2) {
    r.note = m.note;
    if (diloco && view.live > 0 && !view.ahead &&
        (now - std::max(submitted_, synced_seen_) < opts_.group_wait + newcomer_phase() ||
         wait_for_syncing(view, now - submitted_, now)))
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
  const NodeId self = store_.id();
  StartOp start;
  start.op = op;
  for (const auto& id : m.group)
    if (auto it = m.addresses.find(id); it != m.addresses.end() && id != self)
      start.addresses.emplace(id, it->second);
  if (!diloco) {
    auto tensors = std::make_shared<std::vector<optim::Floats>>();
    // Fragments: the pair averages one of them, drawn from the window (both know it; the
    // rest takes the local-only step). Our θ stays here for that.
    draw_noloco_fragment(m.window);
    if (opts_.noloco.nesterov) {
      // The Nesterov rule: our proposal P and next momentum m' (over the fragment, if any),
      // with the numbers of the round this exchange ends; θ, φ and m stay for the step.
      auto [p, mn] = noloco_proposal_into(state_.phi, state_.momentum, theta_,
                                          opts_.noloco.at_round(state_.round + 1), opts_.floats,
                                          opts_.threads, slice_);
      tensors->push_back(std::move(p));
      tensors->push_back(std::move(mn));
    } else if (!slice_.whole(state_.phi.size())) {
      const std::size_t lo = slice_.lo, hi = slice_.end(state_.phi.size());
      tensors->push_back(opts_.noloco.one_tensor() ? copy_range(theta_, lo, hi, opts_.floats)
                                                   : delta(0, {}, 1.0f, slice_));
      if (!opts_.noloco.one_tensor())
        tensors->push_back(copy_range(state_.phi, lo, hi, opts_.floats));
    } else if (opts_.noloco.one_tensor()) {
      // θ moves into the exchange (its mean, ours alone when nobody completes, is what the step
      // takes): one model-sized copy less while the exchange runs.
      tensors->push_back(std::move(theta_));
      theta_.clear();
    } else {
      tensors->push_back(delta(0, {}));
      tensors->push_back(copy_range(state_.phi, 0, state_.phi.size(), opts_.floats));
    }
    auto o = opts_.exchange;
    o.bound_by_first = opts_.noloco.nesterov;
    const auto bytes = exchange_wire_bytes(
        o.codec, tensors->size() * slice_.size(state_.phi.size()), m.group.size() - 1);
    // Between two messages of a partner, a message from each of the others may arrive.
    o.chunk_timeout = op_deadlines_.silence_for(
        exchange_wire_bytes(o.codec, o.chunk_values, m.group.size() - 1), o.chunk_timeout, bytes);
    o.total_timeout = op_deadline("exchange", m.group.size(), bytes, o.chunk_timeout);
    start.make = [op, self, group = m.group, tensors, o, formed = now,
                  window = opts_.match.window](Time t) mutable -> std::unique_ptr<Protocol> {
      // A partner makes the same tensors from a state of the same size, on a machine perhaps
      // busier than ours (500M parameters in pages: the proposal and momentum took seconds to
      // tens of seconds while the disk was busy), and starts when it has: from the group to our
      // start took t - formed here; it is given twice that, plus a window, before its first
      // byte is due.
      o.start_grace = 2 * std::max(Time(0), t - formed) + window;
      auto core = GroupExchange::create(op, self, group, std::move(*tensors), o, t);
      if (!core) spdlog::warn("the round's exchange was not started: {}", core.text());
      return core ? std::move(*core) : nullptr;
    };
  } else {
    auto input = std::make_shared<optim::Floats>();
    average_phi_ = m.average_phi;
    group_round_ = m.swarm_round;
    group_norms_ = m.delta_norms;
    group_clip_ = m.clip_norm;
    // A Δ far larger than the group's (more than kMaxNormToMedian × the median of the norms its
    // members declared) counts only up to that: scaled down, so that one member's fault or
    // attack moves φ no more than a few honest members' steps would.
    float scale = 1.0f;
    if (!average_phi_ && std::isfinite(group_clip_) && delta_norm_ > group_clip_) {
      scale = static_cast<float>(group_clip_ / delta_norm_);
      spdlog::warn(
          "round {}: our pseudo-gradient's norm {:.6g} is more than {:.1f}x the median of "
          "the group's declared norms: scaled down to {:.6g}",
          state_.round, delta_norm_, kMaxNormToMedian, group_clip_);
      r.note = fmt::format("our pseudo-gradient scaled down from {:.6g} to {:.6g}", delta_norm_,
                           group_clip_);
    }
    if (average_phi_) slice_ = {};  // (φ ‖ Δ: all of it, whatever the round)
    if (opts_.compressed && !average_phi_)
      return start_gather(m, scale, std::move(start), std::move(r), now);
    if (average_phi_ && error_has_delta_) {
      // φ is averaged (with Δ, dense): error feedback starts again from zero.
      std::fill(state_.error.begin(), state_.error.end(), 0.0f);
      error_has_delta_ = false;
    }
    // The slow weights differ after NoLoCo rounds: average them once with the pseudo-gradient
    // (φ ‖ Δ in one tensor).
    const std::size_t n = state_.phi.size();
    *input = average_phi_ ? delta(n, copy_range(state_.phi, 0, n, opts_.floats, 2 * n))
                          : delta(0, {}, scale, slice_);
    return start_allreduce(m, std::move(input), opts_.allreduce, "all-reduce", std::move(start),
                           std::move(r), now);
  }
  run_op(std::move(start), m.group, std::move(r), now);
}

void RoundEngine::start_allreduce(const MatchResult& m, std::shared_ptr<optim::Floats> input,
                                  AllReduceOptions o, const char* what, StartOp start,
                                  RoundReport r, Time now) {
  // The previous all-reduce's result buffer is reused (its pages are already there).
  auto out = std::make_shared<optim::Floats>(std::move(spare_));
  o.alloc = opts_.floats;
  // Members start when each has read the window's records: up to a read apart, more when a
  // node's DHT strand is busy.
  o.start_grace = std::max(o.start_grace, opts_.match.window + opts_.match.read_timeout);
  const auto bytes = allreduce_wire_bytes(o.codec, input->size(), m.group.size());
  o.chunk_timeout = op_deadlines_.silence_for(exchange_wire_bytes(o.codec, o.chunk_values, 1),
                                              o.chunk_timeout, bytes);
  o.total_timeout = op_deadline(what, m.group.size(), bytes, o.chunk_timeout);
  start.make = [op = start.op, self = store_.id(), ring = m.group, input, out,
                o](Time t) -> std::unique_ptr<Protocol> {
    auto core = RingAllReduce::create(op, self, ring, std::move(*input), o, t, std::move(*out));
    if (!core) spdlog::warn("the round's all-reduce was not started: {}", core.text());
    return core ? std::move(*core) : nullptr;
  };
  run_op(std::move(start), m.group, std::move(r), now);
}

void RoundEngine::draw_noloco_fragment(std::uint64_t window) {
  const std::size_t f = std::max<std::size_t>(opts_.fragments, 1);
  // Hashed, so consecutive windows draw unrelated fragments.
  fragment_ = static_cast<std::size_t>(optim::splitmix64(window) % f);
  slice_ = slice_of(state_.phi.size(), f, fragment_);
}

void RoundEngine::run_op(StartOp start, const std::vector<NodeId>& group, RoundReport r, Time now) {
  op_ = start.op;
  group_ = group;
  matched_ = std::move(r);  // the report of the running op, as far as the match made it
  phase_ = Phase::running;
  op_started_ = now;
  ops_.push_back(std::move(start));
}

void RoundEngine::start_gather(const MatchResult& m, float scale, StartOp start, RoundReport r,
                               Time now) {
  // Our message is cut from the error buffer, which moves into the all-gather (it reads it a
  // piece at a time, scaled when its norm is above the group's bound, and gives it back for the
  // feedback).
  // (With fragments, a copy of this round's slice of it: the rest stays.)
  auto input = std::make_shared<optim::Floats>(
      slice_.whole(state_.error.size())
          ? std::exchange(state_.error, {})
          : copy_range(state_.error, slice_.lo, slice_.end(state_.error.size()), opts_.floats));
  if (opts_.compressed->codec.kind == WireCodec::e3m0) {
    // 4-bit partial sums in the ring all-reduce, each member keeping what its encodings left
    // out: 2 (N − 1)/N × its message instead of the all-gather's (N − 1) ×.
    if (scale != 1.0f)
      optim::by_fragments(input->size(),
                          [&](std::size_t lo, std::size_t hi) {
                            for (std::size_t i = lo; i < hi; ++i) (*input)[i] *= scale;
                          },
                          {input.get()});
    auto o = opts_.allreduce;
    o.codec = WireCodec::e3m0;
    o.residual = true;
    return start_allreduce(m, std::move(input), o, "all-reduce (E3M0, error feedback)",
                           std::move(start), std::move(r), now);
  }
  auto out = std::make_shared<optim::Floats>(std::move(spare_));
  AllGatherOptions o;
  o.codec = opts_.compressed->codec;
  o.piece_values = opts_.compressed->piece_values;
  o.scale = scale;  // (applied a piece at a time as the all-gather reads it)
  o.window = opts_.allreduce.window;
  o.alloc = opts_.floats;
  o.timers = ring_timers(opts_.allreduce);
  o.timers.start_grace =
      std::max(o.timers.start_grace, opts_.match.window + opts_.match.read_timeout);
  const auto bytes = allgather_wire_bytes(o.codec, input->size(), m.group.size());
  o.timers.chunk_timeout = op_deadlines_.silence_for(
      (m.group.size() - 1) * o.codec.encoded_size(o.piece_values), o.timers.chunk_timeout, bytes);
  o.timers.total_timeout = op_deadline("all-gather", m.group.size(), bytes, o.timers.chunk_timeout);
  start.make = [op = start.op, self = store_.id(), ring = m.group, input, out,
                o](Time t) -> std::unique_ptr<Protocol> {
    auto core = RingAllGather::create(op, self, ring, std::move(*input), o, t, std::move(*out));
    if (!core) spdlog::warn("the round's all-gather was not started: {}", core.text());
    return core ? std::move(*core) : nullptr;
  };
  run_op(std::move(start), m.group, std::move(r), now);
}

Time RoundEngine::op_deadline(const char* what, std::size_t members, std::uint64_t bytes,
                              Time silence) const {
  spdlog::info("round {}: {} among {} members, {}; a peer silent for {:.0f} s is suspected",
               state_.round, what, members, op_deadlines_.describe(bytes),
               static_cast<double>(silence.count()) / 1000.0);
  return op_deadlines_.deadline_for(bytes);
}

// ---- mode schedule -----------------------------------------------------------------------------

OuterMode RoundEngine::mode_of(std::uint64_t round) const {
  return mode_for_round(modes_, round, opts_.mode);
}

void RoundEngine::poll_modes(Time now) {
  if (mode_polling_) return;
  mode_polling_ = true;
  store_.read(mode_key(run_id_), now, guarded(alive_, [this](std::vector<dht::Record> records) {
                mode_polling_ = false;
                next_mode_poll_ = store_.now() + opts_.mode_poll;
                // Union with what we knew: one get may miss a record that another saw.
                for (auto& m : mode_requests(run_id_, records)) {
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
  std::uint64_t highest =
      state_.round +
      (phase_ == Phase::stepping && !syncing() && step_->kind != StepWork::Kind::prepare ? 1 : 0);
  for (const auto& m : members_.live(now)) highest = std::max(highest, progress_of(m).round);
  const std::uint64_t first = highest + opts_.mode_lead;
  const std::uint64_t r = from_round.value_or(first);
  if (r < first) {
    if (done) done(transport::make_error_code(errc::rejected));
    return;
  }
  ModeRequest req{store_.id(), run_id_, mode, r};
  modes_.push_back(req);
  store_.write(mode_key(run_id_), mode_subkey(r), 1, now + Time(std::chrono::hours(23)),
               encode_mode(req), now, guarded(alive_, [r, done = std::move(done)](bool stored) {
                 if (!done) return;
                 if (!stored)
                   done(transport::make_error_code(errc::unreachable));
                 else
                   done(r);
               }));
}

// ---- timers ------------------------------------------------------------------------------------

void RoundEngine::on_timer(Time now) {
  // DiLoCo: a member seen fetching the state is waited for from the last time it was seen so —
  // during our inner phase, or while our matchmaker tries later windows on its own (its
  // patience) — not from the last time a round of ours looked: a joiner whose download ended
  // during our inner phase, or minutes after our last look, was given up on while it trained its
  // first inner phase, and fetched the next round's state again, round after round.
  // (While matching, only as long as a round waits for a download at all: wait_for_syncing.
  // During the inner phase the mode polls and offer refreshes below bring the timer round.)
  if ((phase_ == Phase::idle || phase_ == Phase::matching) &&
      mode_of(state_.round) == OuterMode::diloco && !entering_diloco_ && opts_.diloco_group == 0 &&
      opts_.group_wait > Time(0)) {
    const Others view = others(now);
    if (phase_ == Phase::matching)
      wait_for_syncing(view, now - submitted_, now);
    else if (view.syncing > 0 && !view.ahead)
      synced_seen_ = now;
  }
  pairs_->on_timer(now);
  groups_->on_timer(now);
  if (!mode_polling_ && now >= next_mode_poll_ && phase_ != Phase::none) poll_modes(now);
  if (offer_ && now >= offer_refresh_) write_offer(now);
  if (phase_ == Phase::syncing && catch_up_) {
    catch_up_->on_timer(now);
    sync_done(now);
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
  if (offer_) take(offer_refresh_);
  if (phase_ == Phase::syncing && catch_up_) take(catch_up_->next_deadline());
  return t;
}

}  // namespace grove::gossip
