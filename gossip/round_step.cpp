// The step side of RoundEngine: what a finished operation (or none) makes of the round, the step
// jobs handed to the worker, snapshots, and what comes back from the worker.
#include <algorithm>
#include <cassert>
#include <cstring>

#include <spdlog/spdlog.h>

#include "gossip/guarded.hpp"
#include "gossip/progress.hpp"
#include "gossip/round.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

using transport::errc;

std::shared_ptr<StepWork> RoundEngine::step_work(StepWork::Kind kind, bool delta) {
  auto w = std::make_shared<StepWork>();
  w->kind = kind;
  w->mode = round_mode_;
  lend_state(*w);  // φ, momentum (and error buffer) go with the job
  ++w->state.round;
  w->theta = std::move(theta_);  // the input of a local step; else the buffer given back after
  theta_.clear();
  w->slice = round_mode_ == OuterMode::diloco ? slice_ : Slice{};
  w->noloco = opts_.noloco;
  w->diloco = opts_.diloco;
  w->threads = opts_.threads;
  if (round_mode_ == OuterMode::diloco && opts_.compressed) {
    w->compressed = opts_.compressed;
    w->error_has_delta = std::exchange(error_has_delta_, false);
  }
  if (!opts_.serve_state || !server_) return w;
  if (delta) {
    w->delta_store = opts_.blobs;
    // A mean of compressed messages is exact in fp32 only.
    w->delta_codec = opts_.compressed ? WireCodec::fp32 : opts_.allreduce.codec;
    w->delta_from = phi_hash_;
  }
  if (snapshot_due(store_.now(), delta)) {
    w->store = opts_.blobs;
    want_snapshot_ = false;
  }
  return w;
}

bool RoundEngine::snapshot_due(Time now, bool delta) const {
  if (opts_.snapshot_every <= Time(0) || !state_blob_ || want_snapshot_) return true;
  // DiLoCo: the new state must be the last snapshot's with the deltas since replayed.
  if (round_mode_ == OuterMode::diloco &&
      (!delta || chain_end_ != state_.round ||
       state_.round + 1 - blob_round_ > deltas_after_snapshot()))
    return true;
  return opts_.snapshot_every != Time::max() && now - last_snapshot_ >= opts_.snapshot_every;
}

std::uint64_t RoundEngine::deltas_after_snapshot() const {
  const auto kept = std::min(server_ ? server_->keep_deltas() : 0, kMaxOfferDeltas);
  return kept > 2 ? kept - 2 : 0;
}

void RoundEngine::lend_state(StepWork& w) {
  w.state = std::move(state_);
  state_ = {};
  state_.round = w.state.round;
  ++state_gen_;
}

RoundReport RoundEngine::state_report(RoundReport::Kind kind) const {
  RoundReport r;
  r.kind = kind;
  r.round = state_.round;
  r.mode = mode_of(state_.round);
  r.weights_hash = phi_hash_;
  return r;
}

bool RoundEngine::snapshot_now() {
  if (!has_state_ || phase_ != Phase::idle || !opts_.serve_state || !server_) return false;
  if (state_blob_ && blob_round_ == state_.round) return false;
  auto w = std::make_shared<StepWork>();
  w->kind = StepWork::Kind::save;
  lend_state(*w);
  w->hash = phi_hash_;
  w->store = opts_.blobs;
  want_snapshot_ = false;
  hand_over(std::move(w));
  return true;
}

void RoundEngine::retire(optim::Floats a) {
  if (a.empty()) return;
  if (retired_.arrays.size() < 8) retired_.arrays.push_back(std::move(a));
}

void RoundEngine::replace_state(optim::OuterState s) {
  retire(std::move(state_.phi));
  retire(std::move(state_.momentum));
  retire(std::move(state_.error));
  state_ = std::move(s);
}

std::shared_ptr<StepWork> RoundEngine::local_step(RoundReport& r) {
  r.local_only = true;
  return step_work(StepWork::Kind::local);
}

void RoundEngine::on_op_finished(std::unique_ptr<Protocol> p, Time now) {
  // Whatever the outcome, the operation (and what it still holds) is freed by the driver.
  struct Retire {
    Retired& to;
    std::unique_ptr<Protocol>& p;
    ~Retire() {
      if (p && to.ops.size() < 4) to.ops.push_back(std::move(p));
    }
  } retire_op{retired_, p};
  if (phase_ != Phase::running || (p && p->op() != *op_)) return;
  RoundReport r = std::exchange(matched_, {});  // round, mode, group and the match's figures
  op_.reset();
  r.transfer_time = now - op_started_;
  if (p) op_deadlines_.observe(*p, r.transfer_time);
  if (!p) {
    r.note = "the driver could not run the operation";
    // DiLoCo: the group's state after this round (the others may end it without us).
    if (round_mode_ == OuterMode::diloco) return begin_sync(state_.round + 1, false, r.note, now);
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
    auto mean = ex->take_mean();
    // What the step does not take of it (our proposal and momentum, when nobody completed) is
    // freed by the driver.
    struct RetireRest {
      RoundEngine& e;
      std::vector<optim::Floats>& v;
      ~RetireRest() {
        for (auto& t : v) e.retire(std::move(t));
      }
    } retire_rest{*this, mean};
    if (r.local_only) {
      // Nobody completed: the step alone (θ as it is). θ went with the exchange unless the
      // exchange carried Δ or a fragment: the mean is then ours, θ itself.
      auto w = local_step(r);
      if (w->theta.empty() && opts_.noloco.one_tensor() && slice_.whole(w->state.phi.size()))
        w->theta = std::move(mean.at(0));
      if (w->theta.size() != w->state.phi.size()) {
        r.note += "; the inner phase's θ went with the exchange: slow weights unchanged";
        w->kind = StepWork::Kind::none;
      }
      return finish_round(std::move(r), std::move(w));
    }
    // The mean's buffer comes back as the report's spare.
    auto w = step_work(StepWork::Kind::noloco_mean);
    // (φ went with the job: its size is the job's.)
    if (!slice_.whole(w->state.phi.size())) {  // fragments: θ (ours) came with step_work
      w->slice = slice_;
      w->mean = std::move(mean.at(0));
    } else {
      retire(std::move(w->theta));  // θ itself, when the exchange carried a proposal
      w->theta = std::move(mean.at(0));
    }
    if (!opts_.noloco.one_tensor()) w->phi_mean = std::move(mean.at(1));
    return finish_round(std::move(r), std::move(w));
  }
  auto* ar = dynamic_cast<RingOp*>(p.get());
  if (!ar) return;
  auto* ag = dynamic_cast<RingAllGather*>(ar);
  auto* all = dynamic_cast<RingAllReduce*>(ar);
  // E3M0 rounds: the all-reduce fed back what its encodings left out (its residual).
  const bool fed_back = all && all->options().residual;
  r.bytes_sent = ar->stats().bytes_sent;
  r.bytes_received = ar->stats().bytes_received;
  // Compressed rounds: our error buffer comes back from the op (unchanged).
  optim::Floats error = ag ? ag->take_input() : fed_back ? all->take_input() : optim::Floats{};
  if (ar->status() != OpStatus::done) {
    if (ag || fed_back) put_back_error(std::move(error), state_.error);
    // The survivors' state after this round: the delta that leads there from ours, when they
    // end it (a state of this round is ours already).
    return begin_sync(state_.round + 1, false,
                      std::string(ag ? "all-gather" : "all-reduce") + " of round " +
                          std::to_string(state_.round) + " failed: " + ar->failure(),
                      now);
  }
  for (const auto& id : ar->members())
    if (id != store_.id()) r.averaged_with.push_back(id);
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
  auto w = step_work(StepWork::Kind::diloco_ring,
                     server_ && server_->keep_deltas() > 0 && !average_phi_);
  w->average_phi = average_phi_;
  if (ag) {
    w->compressed = opts_.compressed;
    put_back_error(std::move(error), w->state.error);
    w->max_mean_norm = mean_norm_bound(ar->members(), ag->options().codec.kind, true);
    w->ring = ag->take_result();
  } else {
    w->max_mean_norm = mean_norm_bound(ar->members(), all->options().codec, false);
    w->ring = all->take_result();
    if (fed_back) {
      // Our next error buffer is what our encodings left out: no feedback left to apply. Part
      // of it is other members' values (the partial sums we re-encoded); bounded by our own
      // fresh Δ, so that one member's outsized message cannot grow every honest buffer, and
      // with them the median that bounds it, round after round.
      put_back_error(all->take_residual(), w->state.error);
      w->compressed.reset();
      w->error_is_residual = true;
      const double most = kMaxResidualToDelta * fresh_norm_, got = all->residual_norm();
      if (std::isfinite(most) && got > most) {
        w->error_scale = static_cast<float>(most / got);
        spdlog::info(
            "round {}: what our 4-bit encodings left out ({:.6g}) is more than {:.0f}x "
            "our pseudo-gradient's norm: scaled down to {:.6g}",
            state_.round, got, kMaxResidualToDelta, most);
      }
    }
  }
  finish_round(std::move(r), std::move(w), std::move(members));
}

void RoundEngine::put_back_error(optim::Floats part, optim::Floats& e) const {
  if (e.empty() || slice_.whole(e.size())) {
    e = std::move(part);
    return;
  }
  const std::size_t lo = slice_.lo, hi = slice_.end(e.size());
  if (part.size() != hi - lo) return;  // (the all-gather gives back what it was given)
  copy_values(part, 0, e, lo, hi - lo);
}

double RoundEngine::mean_norm_bound(const std::vector<NodeId>& ring, WireCodec codec,
                                    bool gathered) const {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (average_phi_ || group_norms_.empty()) return kNaN;
  double sum = 0;
  for (const auto& id : ring) {
    const auto it = group_norms_.find(id);
    if (it == group_norms_.end()) return kNaN;
    sum += std::isfinite(group_clip_) ? std::min(it->second, group_clip_) : it->second;
  }
  // ‖mean Δ‖ ≤ mean ‖Δ_i‖ (each clipped), plus the codec's rounding: each of the ring's hops
  // encodes a partial sum once (relative error per encoding: fp32 ~1e-7, fp16 2^-11, bf16 2^-8,
  // E3M0 up to √2 − 1); in an all-gather each member's message is encoded once, from its error
  // buffer, whose norm it declared (top-k keeps a part of it; 2-bit values round up to 1.5×
  // the chunk's mean magnitude, so allow 1.5×).
  const double per_encoding = codec == WireCodec::fp32   ? 1e-6
                              : codec == WireCodec::fp16 ? 1e-3
                              : codec == WireCodec::bf16 ? 8e-3
                                                         : 0.5;
  const auto k = static_cast<double>(ring.size());
  if (gathered) return sum / k * (1.0 + per_encoding) + 1e-30;
  return sum / k * (1.0 + (k + 1.0) * per_encoding) + 1e-30;
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
  step_jobs_.push_back({++step_seq_, [w] { w->run(); }, w->kind == StepWork::Kind::prepare});
}

void RoundEngine::on_step_done(std::uint64_t seq, Time now) {
  if (phase_ != Phase::stepping || seq != step_seq_ || !step_) return;
  const auto w = std::exchange(step_, nullptr);
  if (w->kind == StepWork::Kind::parse || w->kind == StepWork::Kind::replay) return synced(w, now);
  if (w->kind == StepWork::Kind::prepare) {
    replace_state(std::move(w->state));
    ++state_gen_;
    theta_ = std::move(w->theta);
    delta_norm_ = w->norm;
    fresh_norm_ = w->fresh_norm;
    return ready(now);
  }
  if (w->kind == StepWork::Kind::save) {
    replace_state(std::move(w->state));
    ++state_gen_;
    phase_ = Phase::idle;
    publish_state(std::move(w->blob));
    reports_.push_back(state_report(RoundReport::Kind::saved));
    return;
  }
  RoundReport r = std::exchange(step_report_, {});
  replace_state(std::move(w->state));
  ++state_gen_;
  phi_hash_ = w->hash;
  if (w->kind == StepWork::Kind::diloco_ring) spare_ = std::move(w->ring);
  if (!w->dropped.empty()) {
    spdlog::error("round {}: {}", state_.round - 1, w->dropped);
    r.note += (r.note.empty() ? "" : "; ") + w->dropped;
  }
  if (w->theta.size() == state_.phi.size()) r.spare = std::move(w->theta);
  // The part of θ to take from φ: the step's slice, when θ comes back to the driver whole.
  const bool stepped = w->kind == StepWork::Kind::local || w->kind == StepWork::Kind::diloco_ring;
  r.slice = stepped && r.spare.size() == state_.phi.size() ? w->slice : Slice{};
  r.fragment = fragment_;
  synced_into_round_ = false;
  r.sync_time = now - submitted_;
  round_time_ = inner_ + r.sync_time;
  phase_ = Phase::idle;
  idle_at_ = now;
  publish_state(std::move(w->blob));  // (the old snapshot is served until the step is done)
  serve_delta(std::move(w->delta), w->delta_from);
  r.weights_hash = phi_hash_;
  reports_.push_back(std::move(r));
  last_group_.clear();
  if (step_members_.size() > 1) {
    last_group_ = step_members_;
    last_group_.erase(store_.id());
    judge_.expect(state_.round, phi_hash_, std::exchange(step_members_, {}));
    for (const auto& m : members_.live(now)) judge_.on_member(m);
  }
  step_members_.clear();
}

void RoundEngine::publish_self(const char* status) {
  auto self = members_.self();
  self.payload = encode_progress({state_.round, phi_hash_});
  // Our hash of each round, for joiners that check a state with us (gossip/state_check.hpp).
  if (server_ && has_state_) server_->note_hash(state_.round, phi_hash_);
  self.status = idle_ && std::strcmp(status, "training") == 0 ? kIdleStatus : status;
  if (self.addresses.empty()) self.addresses = addresses_;
  members_.set_self(self);
}

void RoundEngine::set_idle(bool idle) {
  if (idle_ == idle) return;
  idle_ = idle;
  if (phase_ == Phase::idle) publish_self("training");  // (between rounds: kIdleStatus if idle_)
}

void RoundEngine::set_group_wait(Time t) {
  opts_.group_wait = t;
}

void RoundEngine::set_patience(Time t) {
  if (pairs_) pairs_->set_patience(t);
  if (groups_) groups_->set_patience(t);
}

// Where a new phase starts: φ[i] + la·m[i], with m null (and la 0) unless NoLoCo's look-ahead
// applies to the next round.
RoundEngine::StartPoint RoundEngine::start_point(std::size_t offset) const {
  StartPoint s{state_.phi.data() + offset, nullptr, 0.0f};
  if (opts_.noloco.lookahead > 0.0f && mode_of(state_.round) == OuterMode::noloco &&
      state_.momentum.size() == state_.phi.size()) {
    s.m = state_.momentum.data() + offset;
    s.la = opts_.noloco.lookahead;
  }
  return s;
}

void RoundEngine::start_part(std::span<float> theta, std::size_t offset) const {
  assert(offset + theta.size() <= state_.phi.size());  // the driver's contract
  if (offset + theta.size() > state_.phi.size()) return;
  const auto s = start_point(offset);
  for (std::size_t i = 0; i < theta.size(); ++i) theta[i] = s.at(i);
  if (s.m) state_.momentum.release(offset, offset + theta.size());
}

void RoundEngine::mix_part(std::span<float> theta, std::size_t offset, float alpha) const {
  assert(offset + theta.size() <= state_.phi.size());  // the driver's contract
  if (offset + theta.size() > state_.phi.size()) return;
  const auto s = start_point(offset);
  for (std::size_t i = 0; i < theta.size(); ++i)
    theta[i] = alpha * theta[i] + (1.0f - alpha) * s.at(i);
  if (s.m) state_.momentum.release(offset, offset + theta.size());
}

}  // namespace grove::gossip
