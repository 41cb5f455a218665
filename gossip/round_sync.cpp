// The round engine's state: the snapshots and deltas it serves and offers, and its state syncs
// (a join, a catch-up by the whole state or by deltas). The rest of the engine is in round.cpp.
#include "gossip/round.hpp"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "dht/key.hpp"
#include "gossip/progress.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

// ---- serving ------------------------------------------------------------------------------------

void RoundEngine::after_state(Time) {
  phi_hash_ = weights_hash(state_.phi);  // once per new φ: reports, record and checks reuse it
  std::shared_ptr<const StateBlob> blob;
  if (opts_.serve_state && server_) {
    if (auto b = save_state(*opts_.blobs, state_))
      blob = std::move(*b);
    else
      spdlog::warn("cannot keep our state's snapshot (joiners will not get it from us): {}",
                   b.text());
  }
  publish_state(std::move(blob));
}

void RoundEngine::publish_state(std::shared_ptr<const StateBlob> blob) {
  publish_self("training");
  // No snapshot of this state (snapshot_every, or it could not be written): the last one stays
  // served and offered.
  if (!blob) return;
  // The snapshot offered now is served until the new one is added (StateServer::add prunes):
  // a joiner that read its offer finds it while the new one is hashed. (Its blob is a file.)
  state_blob_ = std::move(blob);
  blob_round_ = state_.round;
  chain_end_ = blob_round_;
  last_snapshot_ = store_.now();
  snapshot_jobs_.clear();  // (a job not taken yet is of an older state)
  if (!opts_.serve_state || !server_) return;
  state_job_ = ++snapshot_seq_;
  snapshot_jobs_.push_back({state_job_, state_.round, run_id_, state_blob_, opts_.snapshot_chunk});
}

void RoundEngine::serve_delta(std::shared_ptr<const StateBlob> blob, const Digest& from) {
  if (!blob || !opts_.serve_state || !server_) return;
  if (chain_end_ + 1 == state_.round) chain_end_ = state_.round;
  const auto seq = ++snapshot_seq_;
  delta_jobs_[seq] = {state_.round, 0, {}, from, phi_hash_};  // (size and root: the snapshot's)
  while (delta_jobs_.size() > 4) delta_jobs_.erase(delta_jobs_.begin());
  // Before the state's snapshot (a quarter of its size): the state's offer then lists it, and a
  // member behind that reads that offer finds the delta it needs.
  snapshot_jobs_.insert(snapshot_jobs_.begin(),
                        {seq, state_.round, run_id_, std::move(blob), opts_.snapshot_chunk});
}

void RoundEngine::on_snapshot(std::uint64_t seq, std::shared_ptr<const StateSnapshot> snap,
                              Time now) {
  const auto retire = [&](std::vector<std::shared_ptr<const StateSnapshot>> gone) {
    for (auto& g : gone)  // freed by the driver (a large file's blocks)
      if (retired_.snapshots.size() < 8) retired_.snapshots.push_back(std::move(g));
  };
  if (auto it = delta_jobs_.find(seq); it != delta_jobs_.end()) {
    auto d = it->second;
    delta_jobs_.erase(it);
    if (!snap || !opts_.serve_state || !server_) {
      // Not served: the rounds after the snapshot no longer chain (the next state gets one).
      if (blob_round_ < d.round && chain_end_ >= d.round) chain_end_ = d.round - 1;
      return;
    }
    d.root = snap->root();
    d.size = snap->size();
    retire(server_->add_delta(std::move(snap)));
    deltas_.push_back(d);
    while (deltas_.size() > std::min(server_->keep_deltas(), kMaxOfferDeltas))
      deltas_.erase(deltas_.begin());
    if (offer_) {  // (members behind its round, or, after it, joiners replay it)
      offer_->deltas = deltas_;
      write_offer(now);
    }
    return;
  }
  if (seq != state_job_ || !snap || !opts_.serve_state || !server_) return;  // superseded
  retire(server_->add(snap));
  StateOffer o;
  o.address = addresses_.empty() ? "" : addresses_.front();
  o.run_id = run_id_;
  o.round = state_.round;
  o.size = snap->size();
  o.root = snap->root();
  o.deltas = deltas_;
  offer_ = o;
  write_offer(now);
}

void RoundEngine::write_offer(Time now) {
  // Rewritten at half its TTL while the snapshot is served: a round may last longer than the TTL
  // (a large model over a slow line), and a joiner must find an offer all that time.
  offer_seq_ =
      std::max(offer_seq_ + 1, static_cast<std::uint64_t>(std::max<std::int64_t>(now.count(), 0)));
  store_.write(state_key(run_id_), "state", offer_seq_, now + opts_.offer_ttl,
               encode_offer(*offer_), now);
  offer_refresh_ = now + opts_.offer_ttl / 2;
}

// ---- state sync --------------------------------------------------------------------------------

void RoundEngine::begin_sync(std::uint64_t min_round, bool joining, std::string why, Time now,
                             std::set<NodeId> donors) {
  phase_ = Phase::syncing;
  joining_ = joining;
  if (std::exchange(error_has_delta_, false))
    // Compressed rounds: this round's Δ went into the error buffer but will not be sent (the
    // inner phase is given up for the group's state): error feedback starts again from zero.
    std::fill(state_.error.begin(), state_.error.end(), 0.0f);
  sync_started_ = now;
  sync_why_ = std::move(why);
  op_.reset();
  if (!joining) spdlog::warn("{}; catching up by state sync", sync_why_);
  if (has_state_) publish_self("syncing");
  CatchUpOptions o;
  o.sync = opts_.sync;
  o.sync.store = opts_.blobs;
  // A member behind the group waits for the state the group holds after its round: give the
  // offers of that round as long as two of our rounds take (before we have ended one: two of our
  // inner phases and of our last sync, which moved more bytes than a round does).
  const Time round = round_time_ > Time(0) ? round_time_ : inner_ + last_sync_;
  o.offers_wait = joining ? opts_.offers_wait : std::max(opts_.offers_wait, 2 * round);
  o.offers_retry = std::clamp(opts_.match.window / 4, Time(100), Time(2000));
  o.values = has_state_ ? std::optional(state_.phi.size()) : expect_values_;
  // A member whose φ is the group's of an earlier round replays the group's deltas instead.
  if (has_state_ && !full_sync_only_) o.have = CatchUpOptions::Held{state_.round, phi_hash_};
  // The state is checked with the other live members before it is taken (a joiner trusts no
  // single donor): they are probed once it is downloaded.
  o.members = [this] {
    std::vector<std::pair<NodeId, std::string>> v;
    for (const auto& m : members_.live(store_.now()))
      if (m.id != store_.id() && !departed_.contains(m.id))
        v.emplace_back(m.id, m.addresses.empty() ? std::string() : m.addresses.front());
    return v;
  };
  transport::Blake2b256 seed;
  seed.update(store_.id());
  const auto t = static_cast<std::uint64_t>(now.count()) ^ (++syncs_begun_ << 48);
  seed.update(std::span(reinterpret_cast<const std::uint8_t*>(&t), sizeof t));
  const Digest sd = seed.final();
  std::memcpy(&sync_seed_, sd.data(), sizeof sync_seed_);
  o.probe_seed = sync_seed_;
  o.same_hash = [this](std::uint64_t r) { return mode_of(r) == OuterMode::diloco; };
  if (!joining && has_state_)
    // Every other live member catching up from before `min_round` too (their records say
    // "syncing" at an earlier round): nobody will make the state we wait for.
    o.nobody_ahead = [this, min_round] {
      for (const auto& m : members_.live(store_.now())) {
        if (m.id == store_.id() || departed_.contains(m.id)) continue;
        const auto p = decode_progress(m.payload);
        if (m.status != "syncing" || !p || p->round >= min_round) return false;
      }
      return true;
    };
  o.distrust = distrust_;
  sync_min_round_ = min_round;
  catch_up_.reset();
  progress_bytes_ = 0;
  progress_at_ = now;
  catch_up_ = std::make_unique<CatchUp>(store_, run_id_, min_round, std::move(donors), o, now,
                                        std::exchange(sync_partial_, std::nullopt));
}

void RoundEngine::sync_again(std::uint64_t min_round, std::string why, Time now) {
  const Time started = sync_started_;
  begin_sync(min_round, joining_, std::move(why), now);
  sync_started_ = started;
}

void RoundEngine::report_progress(Time now) {
  if (!catch_up_ || now - progress_at_ < Time(1000)) return;
  const auto p = catch_up_->progress(now);
  if (p.bytes <= progress_bytes_) return;
  progress_bytes_ = p.bytes;
  progress_at_ = now;
  RoundReport r;
  r.kind = RoundReport::Kind::sync_progress;
  r.round = state_.round;
  r.mode = mode_of(state_.round);
  r.sync_bytes = p.bytes;
  r.sync_total = p.total;
  r.sync_rate = p.rate;
  r.sync_time = now - sync_started_;
  reports_.push_back(std::move(r));
}

std::vector<StateDownload::Request> RoundEngine::take_state_requests() {
  if (!catch_up_) return {};
  return catch_up_->take_requests();
}

void RoundEngine::on_state_response(std::uint64_t id, std::span<const std::uint8_t> body,
                                    Time now) {
  if (phase_ != Phase::syncing || !catch_up_) return;
  catch_up_->on_response(id, body, now);
  report_progress(now);
  sync_done(now);
}

void RoundEngine::on_state_failure(std::uint64_t id, Time now, const std::string& why) {
  if (phase_ != Phase::syncing || !catch_up_) return;
  catch_up_->on_failure(id, now, why);
  sync_done(now);
}

void RoundEngine::sync_done(Time now) {
  if (!catch_up_ || catch_up_->status() == OpStatus::running) return;
  if (catch_up_->status() == OpStatus::failed) return sync_failed(catch_up_->failure(), now);
  // Parsing (or replaying deltas), hashing and serialising a large state take seconds: a job for
  // the driver.
  auto w = std::make_shared<StepWork>();
  w->deltas = catch_up_->take_deltas();
  sync_bytes_ = catch_up_->bytes();
  if (!w->deltas.empty()) {
    // φ and the momentum move into the job (as for a step): state() holds the round meanwhile.
    w->kind = StepWork::Kind::replay;
    lend_state(*w);
    w->hash = phi_hash_;
    w->diloco = opts_.diloco;
    w->threads = opts_.threads;
  } else {
    w->kind = StepWork::Kind::parse;
    w->blob = catch_up_->take_blob();
    w->max_values = opts_.max_values;
    w->alloc = opts_.floats;
    w->want = has_state_ ? std::optional(state_.phi.size()) : expect_values_;
  }
  if (opts_.serve_state && server_) w->store = opts_.blobs;
  sync_offer_ = catch_up_->offer();
  sync_witnesses_ = catch_up_->take_witnesses();
  catch_up_.reset();
  sync_partial_.reset();
  hand_over(std::move(w));
}

void RoundEngine::synced(const std::shared_ptr<StepWork>& w, Time now) {
  const bool replayed = w->kind == StepWork::Kind::replay;
  if (replayed && !w->error.empty()) {
    // Our state, as far as the replay took it: the whole state of the offer's round replaces it.
    replace_state(std::move(w->state));
    ++state_gen_;
    phi_hash_ = w->hash;
    full_sync_only_ = true;
    damaged_ = damaged_ || w->damaged;
    return sync_again(offer_head(sync_offer_), sync_why_ + "; " + w->error, now);
  }
  full_sync_only_ = false;
  if (!w->error.empty()) return sync_failed(w->error, now);
  const StateOffer offer = sync_offer_;
  const StateVerdict verdict = check_synced(*w);
  if (!verdict.accepted) {
    // Not applied: the donor is left out and the state fetched again from another. (Deltas
    // replayed into our state leave it as the replay took it: the whole state replaces it.)
    spdlog::warn("state sync: refused the state of round {} from {}: {}", w->state.round,
                 dht::short_hex(offer.donor), verdict.detail);
    if (distrust_.size() < 64) distrust_.insert(offer.donor);
    if (replayed) {
      replace_state(std::move(w->state));
      ++state_gen_;
      phi_hash_ = w->hash;
      full_sync_only_ = true;
    }
    return sync_again(sync_min_round_,
                      sync_why_ + "; the state of " + dht::short_hex(offer.donor) + " was refused",
                      now);
  }
  distrust_.clear();
  damaged_ = false;
  replace_state(std::move(w->state));
  ++state_gen_;
  has_state_ = true;
  ++syncs_;
  // A joiner stays "fresh" until it ends a round; a member that catches up does not become
  // fresh (when every member had to catch up, nobody would be left to wait for).
  if (joining_) synced_into_round_ = true;
  phase_ = Phase::idle;
  idle_at_ = now;
  theta_.clear();
  phi_hash_ = w->hash;
  publish_state(std::move(w->blob));
  RoundReport r = state_report(RoundReport::Kind::synced);
  r.bytes_received = sync_bytes_;
  r.sync_time = now - sync_started_;
  last_sync_ = r.sync_time;
  r.note = sync_why_ + (replayed ? ": replayed the deltas up to round " : ": state of round ") +
           std::to_string(state_.round) + " from " + dht::short_hex(offer.donor) + " (" +
           std::to_string(sync_bytes_) + " bytes), " + verdict.detail;
  spdlog::info("{}", r.note);
  if (pending_synced_) {  // the sync before this one, in the same report
    r.bytes_received += pending_synced_->bytes_received;
    r.note = std::exchange(pending_synced_, std::nullopt)->note + "; then " + r.note;
  }
  // A DiLoCo group that moved on while we downloaded its state would leave us a round behind,
  // and a snapshot of a few rounds ago is the group's state only with the deltas since (its
  // offer lists them): they are fetched at once, before an inner phase is trained on the old φ
  // (which would be lost). (A few times at most: a delta takes a fraction of a round.)
  if (mode_of(state_.round) == OuterMode::diloco && chained_ < 3 &&
      (offer_head(offer) > state_.round || others(now).ahead)) {
    ++chained_;
    pending_synced_ = std::move(r);
    return sync_again(state_.round + 1,
                      offer_head(offer) > state_.round
                          ? "the snapshot is of round " + std::to_string(state_.round) +
                                ": replaying the group's deltas since"
                          : std::string("the group moved on while we synced"),
                      now);
  }
  chained_ = 0;
  reports_.push_back(std::move(r));
}

StateVerdict RoundEngine::check_synced(const StepWork& w) const {
  StateToJudge s;
  s.same_hash = mode_of(w.state.round) == OuterMode::diloco;
  s.donor = sync_offer_.donor;
  s.round = w.state.round;
  s.hash = w.hash;
  s.phi = w.state.phi;
  s.seed = sync_seed_;
  return judge_state(s, sync_witnesses_);
}

void RoundEngine::sync_failed(std::string why, Time now) {
  // A joiner keeps what it verified for its next attempt; a member that has a state of its own
  // does not hold a second one.
  if (catch_up_ && !has_state_) sync_partial_ = catch_up_->take_partial();
  catch_up_.reset();
  full_sync_only_ = false;
  chained_ = 0;
  if (damaged_ && has_state_) {
    // A replay stopped part way: our φ is the state of no round and is not trained on. The whole
    // state is fetched again (each attempt waits for offers: this does not spin).
    full_sync_only_ = true;
    spdlog::warn(
        "{}; state sync failed: {}; our slow weights were changed part way by a replay: "
        "syncing again",
        sync_why_, why);
    return sync_again(sync_min_round_, sync_why_, now);
  }
  if (pending_synced_) {
    // Catching up after a sync failed: that sync's state stands (as after any failed catch-up).
    auto r = std::exchange(pending_synced_, std::nullopt);
    r->note += "; catching up further failed: " + why;
    spdlog::warn("{}", r->note);
    phase_ = Phase::idle;
    idle_at_ = now;
    publish_self("training");
    reports_.push_back(std::move(*r));
    return;
  }
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
  idle_at_ = now;
  theta_.clear();
  r.local_only = true;
  r.weights_hash = phi_hash_;
  r.sync_time = now - submitted_;
  publish_self("training");  // φ is unchanged: its snapshot and offer stand
  reports_.push_back(std::move(r));
}

}  // namespace grove::gossip
