#include "node/controller.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "optim/outer.hpp"
#include "transport/error.hpp"

namespace grove::node {

using Kind = Action::Kind;
using Report = gossip::RoundReport;

const char* to_string(Action::Kind k) {
  switch (k) {
    case Kind::start_fresh:
      return "start_fresh";
    case Kind::start_checkpoint:
      return "start_checkpoint";
    case Kind::join:
      return "join";
    case Kind::load_phi:
      return "load_phi";
    case Kind::mix:
      return "mix";
    case Kind::train:
      return "train";
    case Kind::check:
      return "check";
    case Kind::submit:
      return "submit";
    case Kind::set_patience:
      return "set_patience";
    case Kind::set_group_wait:
      return "set_group_wait";
    case Kind::checkpoint:
      return "checkpoint";
    case Kind::leave:
      return "leave";
    case Kind::exit:
      return "exit";
  }
  return "?";
}

Controller::Controller(ControllerOptions opts) : opts_(opts) {
  if (opts_.join_attempts < 1 || opts_.window <= Time(0) ||
      (opts_.checkpoint_every == 0 && opts_.checkpoint_interval <= Time(0)) ||
      !(opts_.mix_alpha >= 0 && opts_.mix_alpha <= 1))
    throw transport::ConfigError(
        "ControllerOptions: join_attempts >= 1, checkpoints by count or by time, "
        "window > 0, mix_alpha in [0, 1]");
}

// ---- start ------------------------------------------------------------------------------------

void Controller::begin(StartKind kind, bool peers, Time now) {
  if (phase_ != Phase::idle) return;
  switch (kind) {
    case StartKind::bootstrap:
      push(Kind::start_fresh);
      return start_training(Action::Source::fresh, now);
    case StartKind::resume:
      resume_ = true;
      if (!peers) {
        push(Kind::start_checkpoint);
        return start_training(Action::Source::checkpoint, now);
      }
      // The swarm may be ahead of our checkpoint: one try, then our own state.
      attempts_ = 1;
      break;
    case StartKind::join:
      attempts_ = opts_.join_attempts;
      break;
  }
  phase_ = Phase::joining;
  join_attempt(now);
}

void Controller::join_attempt(Time now) {
  ++attempt_;
  progressed_ = false;
  join_deadline_ = now + opts_.join_wait;
  Action a{Kind::join};
  a.attempt = attempt_;
  push(std::move(a));
}

void Controller::join_failed(const std::string& why, Time now) {
  spdlog::warn("state sync failed: {}", why);
  if (stopping_) return exit(1, "stopped before the swarm's state arrived");
  // An attempt that verified more of the state does not count: the next one goes on with it
  // (or with a newer state), however many it takes.
  fruitless_ = progressed_ ? 0 : fruitless_ + 1;
  if (fruitless_ < attempts_) {
    if (progressed_)
      spdlog::info("state sync: attempt {} got part of the state; trying again", attempt_);
    return join_attempt(now);
  }
  join_deadline_ = Time::max();
  if (resume_) {  // nobody offers a newer state: go on from the checkpoint
    spdlog::info("no member offers the swarm's state: training on from our checkpoint");
    push(Kind::start_checkpoint);
    return start_training(Action::Source::checkpoint, now);
  }
  exit(1, "could not get the swarm's state");
}

void Controller::start_training(Action::Source source, Time now) {
  phase_ = Phase::running;
  join_deadline_ = Time::max();
  Action a{Kind::load_phi};
  a.source = source;
  push(std::move(a));
  if (stopping_) return leave(now);
  train(now);
}

// ---- training ---------------------------------------------------------------------------------

void Controller::train(Time now) {
  if (finishing_ || stopping_) return;
  if (!training_since_) training_since_ = now;
  training_ = true;
  push(Kind::train);
}

void Controller::submit(Time now) {
  in_round_ = true;
  last_submit_ = now;
  round_deadline_ = stopping_ ? now + stop_grace() : Time::max();
  push(Kind::submit);
}

void Controller::after_state(Time now) {
  ++since_checkpoint_;
  const bool by_count = opts_.checkpoint_every > 0 && since_checkpoint_ >= opts_.checkpoint_every;
  // By time: the first state at once (a node killed early resumes too), then every interval.
  const bool by_time = opts_.checkpoint_interval > Time(0) &&
                       (!last_checkpoint_ || now - *last_checkpoint_ >= opts_.checkpoint_interval);
  if (!by_count && !by_time) return;
  since_checkpoint_ = 0;
  last_checkpoint_ = now;
  push(Kind::checkpoint);
}

void Controller::on_inner_done(Time phase, std::size_t live, Time now) {
  if (phase_ != Phase::running || !training_ || stopping_) return;
  training_ = false;
  last_phase_ = phase;
  live_ = live;
  if (in_round_) {  // overlap: the round before this phase ends first
    waiting_ = true;
    return;
  }
  check(now);
}

void Controller::check(Time now) {
  // A node left alone in a window tries later windows for about one round of the others (its own
  // last round: from its last submit to now, which holds the inner phase and the averaging and
  // outer step — in sequence, or side by side under overlap), and at least the next window
  // (patience counts from its first ready record), so that a slower node, or one whose rounds
  // fall into the other windows, still pairs (nodes that pair once then share a cadence). Not at
  // all when it is the only member, once its view has had time to fill. A node that averaged with
  // nobody in its last rounds although it is not alone doubles its patience each time (the
  // others' rounds are longer than its own: e.g. a joiner beside a pair that averages a large
  // model over a slow line), until its windows meet theirs. Under overlap this is decided here,
  // when the phase that waited is checked, not when it ended: the round in flight then (its
  // matchmaking perhaps still under way) would have been given the phase's length alone, a
  // fraction of a round whose exchange is long, and its partner's next window missed.
  // A quarter more than the round: the others' next ready records come a round after their
  // last window, which may be a window before our first read, plus their lead (up to 20 s while
  // their writes queue behind a transfer); with exactly a round, the odd node of three that
  // missed the pair's window gave up seconds before the pair was ready again (500M NoLoCo).
  const Time round = last_submit_ ? std::max(last_phase_, now - *last_submit_) : last_phase_;
  const bool alone = now - training_since_.value_or(now) > opts_.settle && live_ <= 1;
  const Time base =
      std::max(round + round / 4, 2 * opts_.window) * (Time::rep{1} << std::min(unpaired_, 6));
  patience_ = alone ? Time(0) : std::min(base, opts_.patience_cap);
  Action p{Kind::set_patience};
  p.time = patience_;
  push(std::move(p));
  push(Kind::check);
}

void Controller::on_theta(std::span<const float> theta, Time now) {
  on_theta(optim::all_finite(theta), now);
}

void Controller::on_theta(bool finite, Time now) {
  if (phase_ != Phase::running || in_round_ || stopping_) return;
  if (!finite) {
    // A diverged inner phase (a trainer's NaN or Inf) would poison φ and every partner: it is
    // dropped, and the round goes on with φ (the next phase starts from the new φ).
    ++dropped_;
    spdlog::error(
        "the parameters after this inner phase hold NaN or Inf: the phase is dropped and "
        "training restarts from the slow weights");
    Action a{Kind::load_phi};
    a.why = "NaN/Inf in θ";
    push(std::move(a));
  }
  submit(now);
  if (opts_.overlap) train(now);
}

void Controller::on_report(const Report& r, Time now) {
  if (r.kind == Report::Kind::saved) return;  // a snapshot for the node's checkpoint
  if (phase_ == Phase::joining) {
    if (r.kind == Report::Kind::synced) return start_training(Action::Source::swarm, now);
    if (r.kind == Report::Kind::sync_failed) return join_failed(r.note, now);
    if (r.kind == Report::Kind::sync_progress) {
      join_deadline_ = now + opts_.join_wait;
      // More of a state than any attempt has held (an attempt that resumes a partial download
      // reports its chunks at once: no progress of its own).
      if (r.sync_bytes > most_synced_) {
        most_synced_ = r.sync_bytes;
        progressed_ = true;
      }
    }
    return;
  }
  if (r.kind == Report::Kind::sync_progress) return;  // a catch-up under way: nothing to decide
  if (phase_ != Phase::running && phase_ != Phase::leaving) return;
  if (r.kind == Report::Kind::sync_failed) {  // (only a join reports it)
    spdlog::warn("catching up failed: {}", r.note);
    return;
  }
  in_round_ = false;
  round_deadline_ = Time::max();
  if (phase_ == Phase::leaving) return;
  const bool is_round = r.kind == Report::Kind::round;
  if (is_round) unpaired_ = r.averaged_with.empty() ? unpaired_ + 1 : 0;
  if (is_round) last_sync_ = r.sync_time;
  if (opts_.overlap && is_round && (training_ || waiting_)) {
    // θ was trained on meanwhile: pulled toward the new slow weights (of a round of one
    // streaming fragment: that part of θ only).
    Action a{Kind::mix};
    a.alpha = opts_.mix_alpha;
    a.slice = r.slice;
    push(std::move(a));
  } else {
    // Without overlap, or after catching up (a phase trained on the old φ is lost): start from
    // the new φ (of a round of one streaming fragment: that part of θ only).
    Action a{Kind::load_phi};
    if (is_round) a.slice = r.slice;
    push(std::move(a));
    if (!is_round && waiting_) waiting_ = false;
  }
  after_state(now);
  if (stopping_) return leave(now);
  if (waiting_) {
    waiting_ = false;
    return check(now);
  }
  if (finishing_) {
    if (!in_round_ && !training_) leave(now);
    return;
  }
  if (!training_) train(now);
}

// ---- the end ----------------------------------------------------------------------------------

void Controller::finish(Time now) {
  if (stopping_ || phase_ == Phase::leaving || phase_ == Phase::done) return;
  finishing_ = true;
  training_ = false;
  if (phase_ == Phase::running && !in_round_ && !waiting_) leave(now);
}

void Controller::stop(Time now) {
  if (stopping_) return;
  stopping_ = true;  // (also while leaving: the driver asks once)
  if (phase_ == Phase::leaving || phase_ == Phase::done) return;
  training_ = false;
  waiting_ = false;
  // No more waiting in later windows for partners: the round in flight ends at its next read.
  Action p{Kind::set_patience};
  push(std::move(p));
  push(Kind::set_group_wait);
  switch (phase_) {
    case Phase::idle:
      return exit(1, "stopped before it started");
    case Phase::joining:
      if (resume_) {  // our checkpoint is a state: leave with it
        push(Kind::start_checkpoint);
        return start_training(Action::Source::checkpoint, now);
      }
      return exit(1, "stopped before the swarm's state arrived");
    case Phase::running:
      if (in_round_) {
        round_deadline_ = std::min(round_deadline_, now + stop_grace());
        return;
      }
      return leave(now);
    case Phase::leaving:
    case Phase::done:
      return;
  }
}

void Controller::leave(Time now) {
  phase_ = Phase::leaving;
  training_ = false;
  leave_deadline_ = now + opts_.leave_wait;
  push(Kind::leave);
  push(Kind::checkpoint);
}

void Controller::on_left(Time) {
  if (phase_ == Phase::leaving) exit(0, stopping_ ? "stopped" : "finished");
}

void Controller::exit(int code, std::string why) {
  phase_ = Phase::done;
  training_ = false;
  join_deadline_ = round_deadline_ = leave_deadline_ = Time::max();
  Action a{Kind::exit};
  a.code = code;
  a.why = std::move(why);
  push(std::move(a));
}

void Controller::on_timer(Time now) {
  if (phase_ == Phase::joining && now >= join_deadline_)
    return join_failed("no progress for " + std::to_string(opts_.join_wait.count() / 1000) + " s",
                       now);
  if (phase_ == Phase::running && in_round_ && now >= round_deadline_) {  // (stopping only)
    spdlog::warn("leaving with a round still in flight after the stop grace");
    round_deadline_ = Time::max();
    return leave(now);
  }
  if (phase_ == Phase::leaving && now >= leave_deadline_)
    exit(0, stopping_ ? "stopped" : "finished");
}

std::optional<Time> Controller::next_deadline() const {
  Time t = Time::max();
  if (phase_ == Phase::joining) t = std::min(t, join_deadline_);
  if (phase_ == Phase::running && in_round_) t = std::min(t, round_deadline_);
  if (phase_ == Phase::leaving) t = std::min(t, leave_deadline_);
  if (t == Time::max()) return std::nullopt;
  return t;
}

}  // namespace grove::node
