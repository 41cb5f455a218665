#include "node/training_loop.hpp"

#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include "gossip/progress.hpp"
#include "node/contacts.hpp"
#include "node/demo_steps.hpp"
#include "transport/strand.hpp"

namespace grove::node {

using SteadyClock = std::chrono::steady_clock;
using Kind = Action::Kind;

// ---- ReportQueue ------------------------------------------------------------------------------

void ReportQueue::push(gossip::RoundReport r) {
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(r));
  }
  cv_.notify_all();
}

void ReportQueue::wake() {
  {
    std::lock_guard lk(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

std::optional<gossip::RoundReport> ReportQueue::wait(
    std::optional<SteadyClock::time_point> deadline) {
  std::unique_lock lk(mu_);
  const auto ready = [&] { return !q_.empty() || woken_; };
  if (deadline)
    cv_.wait_until(lk, *deadline, ready);
  else
    cv_.wait(lk, ready);
  woken_ = false;
  if (q_.empty()) return std::nullopt;
  auto r = std::move(q_.front());
  q_.pop_front();
  return r;
}

std::optional<gossip::RoundReport> ReportQueue::try_pop() {
  std::lock_guard lk(mu_);
  if (q_.empty()) return std::nullopt;
  auto r = std::move(q_.front());
  q_.pop_front();
  return r;
}

// ---- the loop ---------------------------------------------------------------------------------

namespace {

Time now_ms() {
  return std::chrono::duration_cast<Time>(SteadyClock::now().time_since_epoch());
}

ControllerOptions controller_options(const CliOptions& o, const RunConfig& c, std::size_t params) {
  ControllerOptions co;
  co.overlap = o.overlap || c.overlap != 0;
  co.window = Time(c.window_ms);
  // Checkpoints: as asked; by default every round for a small state, every 10 minutes for one of
  // 1 GB or more (a checkpoint writes the whole outer state, 8 bytes a parameter).
  if (o.checkpoint_every || o.checkpoint_minutes) {
    co.checkpoint_every = o.checkpoint_every.value_or(0);
    co.checkpoint_interval = Time(std::uint64_t{o.checkpoint_minutes.value_or(0)} * 60'000);
  } else if (large_state(params)) {
    co.checkpoint_every = 0;
    co.checkpoint_interval = Time(10 * 60'000);
  }
  return co;
}

class Loop {
 public:
  explicit Loop(TrainingSetup& s)
      : s_(s),
        ctl_(controller_options(s.o, s.config, s.workload.num_params())),
        P_(s.workload.num_params()) {
    t_.progress.node = transport::to_hex(s.net.host()->id()).substr(0, 16);
    contacts_ = load_contacts(s.state_dir);  // (the --peer list: saved with the first members)
  }
  int run();

 private:
  void run_actions();
  void execute(const Action& a);
  void begin(Action::Source source);
  void inner_phase();
  /// One DeMo step (outer demo): the group's exchange and θ's step; its bytes are counted.
  StepResult demo_step();
  std::unique_ptr<DemoSteps> demo_;
  std::string demo_problem_;
  void on_report(gossip::RoundReport r);
  void tally(const gossip::RoundReport& r);
  void evaluate();
  void publish_status(const char* status);
  /// The live members that train (their addresses saved as contacts, node/contacts.hpp; those
  /// whose record says "idle" are not counted).
  std::size_t live_members();
  void remember_contacts(const std::vector<std::string>& seen);
  std::vector<std::string> contacts_;  // as saved (the --peer list and the file's at first)
  SteadyClock::time_point contacts_saved_{};
  void checkpoint();
  void over_phi(
      const std::function<void(const gossip::RoundEngine&, std::size_t, std::size_t)>& fn);
  int finish();
  template <class F>
  void with_engine(F fn) {
    s_.round->with_engine_wait([&](gossip::RoundEngine& e) { fn(e); });
  }

  TrainingSetup& s_;
  Controller ctl_;
  const std::size_t P_;
  /// θ as the node takes it from the workload: in the node's pages (s_.floats), walked a
  /// fragment at a time; it goes to the round engine with a submit and comes back as a spare.
  optim::Floats theta_;
  void take_theta();
  Tally t_;
  bool started_ = false, phase_pending_ = false;
  std::optional<int> exit_;
  SteadyClock::time_point training_since_{}, last_round_at_{};
  std::shared_ptr<std::atomic<bool>> left_ = std::make_shared<std::atomic<bool>>(false);
  bool left_seen_ = false;
  bool checkpoint_pending_ = false;  // asked for; the engine's snapshot is of an earlier round
  void final_checkpoint();
};

int Loop::run() {
  const auto& c = s_.config;
  s_.console.banner(t_.progress.node, s_.run_name, s_.workload.describe(), c.outer_name(),
                    c.wire_name(), s_.net.advertise());
  if (!s_.join_command.empty()) s_.console.join_command(s_.join_command);
  ctl_.begin(s_.start, !s_.o.peers.empty() || s_.rejoined, now_ms());
  while (!exit_) {
    run_actions();
    if (exit_) break;
    if (s_.stopping && !ctl_.stopping()) {
      ctl_.stop(now_ms());
      continue;
    }
    if (*left_ && !left_seen_) {
      left_seen_ = true;
      ctl_.on_left(now_ms());
      continue;
    }
    if (phase_pending_) {
      phase_pending_ = false;
      inner_phase();
      continue;
    }
    std::optional<SteadyClock::time_point> deadline;
    if (auto d = ctl_.next_deadline())
      deadline = SteadyClock::time_point(std::chrono::duration_cast<SteadyClock::duration>(*d));
    if (auto r = s_.reports.wait(deadline))
      on_report(std::move(*r));
    else
      ctl_.on_timer(now_ms());
  }
  return finish();
}

void Loop::take_theta() {
  if (theta_.size() != P_) theta_ = optim::Floats::zeros(P_, s_.floats);
  s_.workload.get_params_into(theta_);
}

// Until the controller has nothing more to do (an action may give it more), or the run ends.
void Loop::run_actions() {
  for (auto acts = ctl_.take_actions(); !acts.empty() && !exit_; acts = ctl_.take_actions())
    for (const auto& a : acts) {
      execute(a);
      if (exit_) return;
    }
}

void Loop::execute(const Action& a) {
  switch (a.kind) {
    case Kind::start_fresh: {
      // φ and the momentum in the node's pages from the start (zeros until written); θ is read
      // straight into φ.
      optim::OuterState st;
      st.phi = optim::Floats::zeros(P_, s_.floats);
      st.momentum = optim::Floats::zeros(P_, s_.floats);
      s_.workload.get_params_into(st.phi);
      s_.round->start(std::move(st));
      return;
    }
    case Kind::start_checkpoint: {
      auto& r = *s_.resume;
      if (r.outer.phi.size() != P_) {
        spdlog::error("checkpoint does not fit this model ({} values, the model has {})",
                      r.outer.phi.size(), P_);
        exit_ = 1;
        return;
      }
      if (auto l = s_.workload.load(r.workload); !l) spdlog::warn("checkpoint: {}", l.why());
      t_.progress.step = r.step;
      t_.tokens = r.tokens;
      s_.round->start(std::move(r.outer));
      return;
    }
    case Kind::join:
      s_.round->join(P_);
      return;
    case Kind::load_phi: {
      // (A slice only when the round's report gave θ back whole, as submitted: the engine's rule.)
      const bool whole = a.slice.whole(P_);
      if (theta_.size() != P_) theta_ = optim::Floats::zeros(P_, s_.floats);
      const std::size_t from = whole ? 0 : a.slice.lo, to = whole ? P_ : a.slice.end(P_);
      over_phi([&](const gossip::RoundEngine& e, std::size_t lo, std::size_t hi) {
        lo = std::max(lo, from);
        hi = std::min(hi, to);
        if (lo < hi) e.start_part(std::span(theta_.data() + lo, hi - lo), lo);
      });
      // (The rest of θ is the workload's already: the θ it handed to the round.)
      if (whole)
        s_.workload.set_params_from(theta_);
      else
        s_.workload.set_params_part(theta_, from, to);
      if (a.source != Action::Source::none) begin(a.source);
      return;
    }
    case Kind::mix: {
      // (A round of one streaming fragment: that part of θ only; the rest trains on.)
      take_theta();
      const std::size_t from = std::min(a.slice.lo, P_), to = a.slice.end(P_);
      over_phi([&](const gossip::RoundEngine& e, std::size_t lo, std::size_t hi) {
        lo = std::max(lo, from);
        hi = std::min(hi, to);
        if (lo < hi) e.mix_part(std::span(theta_.data() + lo, hi - lo), lo, a.alpha);
      });
      s_.workload.set_params_part(theta_, from, to);  // (the rest: as just taken)
      return;
    }
    case Kind::train:
      if (s_.o.max_steps && t_.progress.step >= *s_.o.max_steps)
        ctl_.finish(now_ms());
      else
        phase_pending_ = true;
      return;
    case Kind::check: {
      take_theta();
      bool finite = true;
      optim::by_fragments(P_,
                          [&](std::size_t lo, std::size_t hi) {
                            finite =
                                finite && optim::all_finite(std::span(theta_.data() + lo, hi - lo));
                          },
                          {&theta_});
      ctl_.on_theta(finite, now_ms());
      return;
    }
    case Kind::submit:
      s_.round->submit(std::move(theta_));  // moved: one model-sized buffer less meanwhile
      theta_.clear();
      s_.board.update([](MemberStatus& me) { me.status = "averaging"; });
      return;
    case Kind::set_patience:
      s_.round->with_engine([t = a.time](gossip::RoundEngine& e) { e.set_patience(t); });
      return;
    case Kind::set_group_wait:
      s_.round->with_engine([t = a.time](gossip::RoundEngine& e) { e.set_group_wait(t); });
      return;
    case Kind::checkpoint:
      // (A per-step run's weights are its trainers': the node's φ is the run's initial θ, and a
      // checkpoint of it would bring a restarted node back to the start. Its trainers keep their
      // state themselves and take the group's weights with grove.sync_parameters.)
      if (started_ && !s_.config.per_step) checkpoint();
      return;
    case Kind::leave:
      // Leaving: say so in the member record and remove it while the checkpoint is written.
      publish_status("leaving");
      s_.net.stop();
      // The removal may be confirmed after this loop is gone (it waits leave_wait at most): the
      // callback holds the flag and the node's report queue, which outlive the io thread.
      s_.net.dht()->post([left = left_, reports = &s_.reports, members = s_.members](
                             dht::DhtNode&, dht::Time now) {
        members->leave(now, [left, reports] {
          *left = true;
          reports->wake();
        });
      });
      return;
    case Kind::exit:
      if (a.code != 0) spdlog::error("{}", a.why);
      exit_ = a.code;
      return;
  }
}

// Training begins: from the swarm's state, our checkpoint, or the run's initial θ (in θ now).
void Loop::begin(Action::Source source) {
  started_ = true;
  if (source == Action::Source::swarm) {
    if (s_.resume && s_.resume->outer.phi.size() == P_) {
      if (auto l = s_.workload.load(s_.resume->workload); !l)
        spdlog::warn("checkpoint: {}", l.why());
      t_.progress.step = s_.resume->step;
      t_.tokens = s_.resume->tokens;
    }
    evaluate();  // a joiner starts from the swarm's loss, not a fresh model's
    s_.console.synced(t_.progress.round, t_.progress.eval_loss, s_.workload.loss_floor());
  } else if (source == Action::Source::checkpoint) {
    s_.console.resumed(t_.progress.round, t_.progress.step);
  }
  s_.resume.reset();  // (a model-sized state: the engine has its own)
  if (std::isnan(t_.progress.eval_loss)) {
    evaluate();
    s_.console.started(t_.progress.eval_loss, s_.workload.loss_floor());
  }
  s_.metrics.write(t_.progress, event::Start{s_.run_name, P_, s_.workload.loss_floor()});
  t_.progress.param_hash = transport::to_hex(gossip::weights_hash(theta_)).substr(0, 16);  // θ = φ
  t_.eval_s = 0;  // utilization counts the training time only
  training_since_ = SteadyClock::now();
  publish_status("training");
}

void Loop::inner_phase() {
  const auto t0 = SteadyClock::now();
  std::uint64_t phase_tokens = 0;
  const auto& o = s_.o;
  // A per-step run (outer none) has no rounds: one phase until the node stops or reaches
  // --max-steps (its trainer synchronises itself with collectives between the steps).
  const bool endless = s_.config.per_step;
  if (s_.config.demo && !demo_) {
    if (!s_.collectives) throw std::logic_error("outer demo without the node's step calls");
    demo_ = std::make_unique<DemoSteps>(s_.workload, s_.config, *s_.collectives);
  }
  for (std::uint32_t h = 0; endless || h < s_.config.phase_steps(); ++h) {
    if (s_.stopping || (o.max_steps && t_.progress.step >= *o.max_steps)) break;
    const auto s0 = SteadyClock::now();
    const auto r = demo_ ? demo_step() : s_.workload.train_step(t_.progress.step);
    t_.compute_s += std::chrono::duration<double>(SteadyClock::now() - s0).count();
    ++t_.progress.step;
    t_.tokens += r.tokens;
    phase_tokens += r.tokens;
    auto& loss = t_.progress.loss;
    loss = std::isfinite(loss) ? 0.9 * loss + 0.1 * r.loss : r.loss;
    if (t_.progress.step % s_.config.eval_every == 0) {
      evaluate();
      s_.metrics.write(t_.progress, event::Eval{s_.workload.loss_floor()});
    }
    // Overlap: a round's result that arrived during the phase is applied at once.
    if (ctl_.in_round())
      if (auto rep = s_.reports.try_pop()) {
        on_report(std::move(*rep));
        run_actions();
      }
    const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    s_.console.live(t_, secs > 0 ? static_cast<double>(phase_tokens) / secs : 0,
                    s_.workload.loss_floor());
  }
  if (s_.stopping) return;  // abandoned: the loop tells the controller
  if (endless) {
    ctl_.finish(now_ms());  // (--max-steps: leave as after a last round)
    return;
  }
  const auto phase = SteadyClock::now() - t0;
  const double secs = std::chrono::duration<double>(phase).count();
  t_.tokens_per_s = secs > 0 ? static_cast<double>(phase_tokens) / secs : 0;
  ctl_.on_inner_done(std::chrono::duration_cast<Time>(phase), live_members(), now_ms());
}

StepResult Loop::demo_step() {
  const auto d = demo_->step(t_.progress.step, [this] { return s_.stopping.load(); });
  auto& p = t_.progress;
  p.bytes_sent += d.bytes_sent;
  p.bytes_received += d.bytes_received;
  p.members = d.members;
  if (d.aligned) spdlog::info("demo: θ aligned with the group ({} members)", d.members);
  // A problem is told when it changes, and every 100 steps while it lasts.
  if (!d.problem.empty() && (d.problem != demo_problem_ || p.step % 100 == 0))
    spdlog::warn("demo: step {}: {}", p.step, d.problem);
  demo_problem_ = d.problem;
  return d.step;
}

void Loop::on_report(gossip::RoundReport r) {
  if (r.kind == gossip::RoundReport::Kind::saved) {  // the snapshot a checkpoint waits for
    if (checkpoint_pending_) checkpoint();
    return;
  }
  // (A round that ends after the node gave up on it and left is not the node's any more.)
  if (r.kind == gossip::RoundReport::Kind::sync_progress) {
    s_.console.syncing(r.sync_bytes, r.sync_total, r.sync_rate);
    s_.board.update([&](MemberStatus& me) {
      me.sync_bytes = r.sync_bytes;
      me.sync_total = r.sync_total;
      me.sync_rate = r.sync_rate;
    });
    ctl_.on_report(r, now_ms());
    return;
  }
  s_.board.update([](MemberStatus& me) {  // the sync (if any) has ended
    me.sync_bytes = me.sync_total = 0;
    me.sync_rate = NAN;
  });
  const bool counted =
      started_ && r.kind != gossip::RoundReport::Kind::sync_failed && !ctl_.leaving();
  // θ went to the round engine with the last submit; its buffer (pages mapped) comes back.
  if (r.spare.size() == P_) theta_ = std::move(r.spare);
  ctl_.on_report(r, now_ms());
  if (!counted) return;
  // The controller's actions (θ from the new φ, the checkpoint) run before the lines that tell
  // of the round.
  run_actions();
  if (checkpoint_pending_) checkpoint();  // the new state's snapshot, when it has one
  tally(r);
}

// A round's (or a catch-up's) figures: status, metrics, the round line.
void Loop::tally(const gossip::RoundReport& r) {
  const bool is_round = r.kind == gossip::RoundReport::Kind::round;
  auto& p = t_.progress;
  p.bytes_sent += r.bytes_sent;
  p.bytes_received += r.bytes_received;
  const auto now = SteadyClock::now();
  if (is_round && last_round_at_ != SteadyClock::time_point{}) {
    t_.round_time_sum += std::chrono::duration<double>(now - last_round_at_).count();
    ++t_.round_count;
  }
  last_round_at_ = now;
  // The first partner's short id ("" when nobody), for the status, the live and round lines.
  const std::string partner =
      r.averaged_with.empty() ? "" : transport::to_hex(r.averaged_with.front()).substr(0, 8);
  // SparseLoCo's rounds are DiLoCo-mode rounds with its compressed messages: named as such.
  const bool group = r.mode == OuterMode::diloco;
  const std::string mode =
      s_.config.sparseloco && group ? "sparseloco" : std::string(gossip::to_string(r.mode));
  s_.board.update([&](MemberStatus& me) {
    me.tokens_per_s = t_.tokens_per_s;
    me.last_sync_ms = static_cast<double>(r.sync_time.count());
    me.last_partner = partner;
    me.algorithm =
        mode + " (" +
        (group ? s_.config.wire_name()
               : std::string(to_string(s_.config.codec)) +
                     (s_.config.fragments > 1
                          ? ", 1/" + std::to_string(s_.config.fragments) + " of the model a round"
                          : std::string())) +
        (s_.config.fragments > 1 && !r.local_only ? ", fragment " + std::to_string(r.fragment + 1) +
                                                        "/" + std::to_string(s_.config.fragments)
                                                  : std::string()) +
        ")";
  });
  publish_status("training");
  p.partners.clear();
  for (const auto& id : r.averaged_with) p.partners.push_back(transport::to_hex(id).substr(0, 16));
  p.sync_ms = static_cast<long long>(r.sync_time.count());
  p.param_hash = transport::to_hex(r.weights_hash).substr(0, 16);
  p.members = live_members();
  if (is_round) {
    ++(r.local_only ? t_.rounds_local : t_.rounds_averaged);
    t_.sync_ms_sum += static_cast<double>(r.sync_time.count());
  } else {
    ++t_.syncs;
  }
  std::string with = is_round ? "local-only" : "state sync";
  if (!partner.empty()) {
    with = "with " + partner;
    if (r.averaged_with.size() > 1) with += " +" + std::to_string(r.averaged_with.size() - 1);
  }
  char b[64];
  std::snprintf(b, sizeof b, ", %lld ms, %.2f/%.2f MB", static_cast<long long>(r.sync_time.count()),
                static_cast<double>(r.bytes_sent) / 1e6,
                static_cast<double>(r.bytes_received) / 1e6);
  t_.last_sync = with + b;
  event::Round e;
  e.synced = !is_round;
  e.mode = mode;
  e.tokens_per_s = t_.tokens_per_s;
  e.bytes_sent = r.bytes_sent;
  e.bytes_received = r.bytes_received;
  e.transfer_s = std::chrono::duration<double>(r.transfer_time).count();
  e.local_only = r.local_only;
  e.note = r.note;
  e.compute_s = t_.compute_s;
  e.eval_s = t_.eval_s;
  e.wall_s = std::chrono::duration<double>(now - training_since_).count();
  s_.metrics.write(p, e);
  s_.console.round(t_, e.mode, s_.workload.loss_floor());
}

void Loop::evaluate() {
  const auto t0 = SteadyClock::now();
  t_.progress.eval_loss = s_.workload.evaluate();
  t_.eval_s += std::chrono::duration<double>(SteadyClock::now() - t0).count();
  if (std::isnan(t_.first_eval)) t_.first_eval = t_.progress.eval_loss;
}

void Loop::publish_status(const char* status) {
  const auto& p = t_.progress;
  s_.board.update([&](MemberStatus& me) {
    me.status = status;
    me.run = s_.run_name;
    me.step = p.step;
    me.round = p.round;
    me.loss = p.loss;
    me.eval_loss = p.eval_loss;
    me.loss_floor = s_.workload.loss_floor();
    me.round_s = t_.round_count ? t_.round_time_sum / static_cast<double>(t_.round_count) : NAN;
  });
}

std::size_t Loop::live_members() {
  // The live members' addresses, then the DHT's nearest contacts (our swarm's nodes: the key
  // keeps others out), which it knows before its member view has polled them.
  std::size_t n = 0, idle = 0;
  std::vector<std::string> seen;
  s_.net.dht()->post_wait([&, m = s_.members](dht::DhtNode& d, dht::Time now) {
    const auto live = m->live(now);
    for (const auto& info : live) {
      n += gossip::trains(info);  // (a member without its trainer trains nothing)
      idle += !gossip::trains(info);
      if (info.id != d.id()) seen.insert(seen.end(), info.addresses.begin(), info.addresses.end());
    }
    for (const auto& c : d.table().closest(d.id(), kMaxContacts)) seen.push_back(c.address);
  });
  remember_contacts(seen);
  t_.progress.idle = idle;
  return n;
}

// The members' addresses go into the state dir (a restart without --peer rejoins through them):
// when they change, at most every 5 s, else once a minute; alone, the older contacts stay.
void Loop::remember_contacts(const std::vector<std::string>& seen) {
  const auto now = SteadyClock::now();
  if (seen.empty() || now < contacts_saved_ + std::chrono::seconds(5)) return;
  auto merged = merge_contacts(seen, contacts_);
  if (merged == contacts_ && now < contacts_saved_ + std::chrono::minutes(1)) return;
  contacts_ = std::move(merged);
  contacts_saved_ = now;
  save_contacts(s_.state_dir, contacts_);
}

// A pass over θ against the engine's φ, fn(engine, lo, hi) a fragment at a time, each fragment a
// job of its own on the DHT strand: a model-sized pass in one job would hold the strand for
// seconds (records, polls and matchmaking would wait). φ is the engine's between rounds; should
// it be replaced meanwhile (a catch-up ended), the pass starts again on the new one. θ
// (this thread's) and φ leave memory fragment by fragment.
void Loop::over_phi(
    const std::function<void(const gossip::RoundEngine&, std::size_t, std::size_t)>& fn) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::optional<std::uint64_t> gen;
    bool replaced = false;
    for (std::size_t lo = 0; lo < P_ && !replaced; lo += optim::kFragment) {
      const std::size_t hi = std::min(P_, lo + optim::kFragment);
      with_engine([&](gossip::RoundEngine& e) {
        const auto& phi = e.state().phi;
        if (phi.size() != P_ || (gen && e.state_generation() != *gen)) {
          replaced = true;  // (the engine keeps φ's size: a new state is of the run's model)
          return;
        }
        gen = e.state_generation();
        // The next fragment of φ and θ is read in while this one is worked on: under memory
        // pressure (a 500M state is 12 GB of files per node) a fragment paged in from the disk
        // inside its job held the strand for seconds.
        phi.prefetch(hi, hi + optim::kFragment);
        theta_.prefetch(hi, hi + optim::kFragment);
        fn(e, lo, hi);
        phi.release(lo, hi);
        t_.progress.round = e.state().round;
      });
      theta_.release(lo, hi);
    }
    if (!replaced) return;
    spdlog::info("the slow weights were replaced during a pass over them; starting it again");
  }
  spdlog::error("the slow weights kept changing under a pass over them; θ is left as it was");
}

// A checkpoint of the engine's state as the snapshot it serves to joiners (its blob, shared:
// nothing model-sized is copied; while a step runs it is still the state of its round). A large
// state is snapshotted at a cadence (RoundOptions::snapshot_every): when its snapshot is of an
// earlier round, the next new state gets one (or, leaving, the state as it is) and the checkpoint
// waits for it.
void Loop::checkpoint() {
  Checkpoint c;
  bool current = false;
  with_engine([&](gossip::RoundEngine& e) {
    c.round = e.state().round;
    c.outer_blob = e.state_blob();
    current = c.outer_blob && e.state_blob_round() == c.round;
    if (current) return;
    e.want_snapshot();
    if (ctl_.leaving()) e.snapshot_now();
  });
  checkpoint_pending_ = !current;
  if (!current) return;
  c.config_text = s_.config.to_text();
  c.step = t_.progress.step;
  c.tokens = t_.tokens;
  c.workload = s_.workload.save();
  s_.checkpoints.add(std::move(c));
}

// The last checkpoint, when it waits for the snapshot of the state (a large one): written before
// the node exits, within a deadline from its size (a write at 20 MB/s, and a minute).
void Loop::final_checkpoint() {
  if (!checkpoint_pending_) return;
  const auto bytes = 8.0 * static_cast<double>(P_);
  const auto deadline = SteadyClock::now() + std::chrono::seconds(60) +
                        std::chrono::milliseconds(static_cast<std::int64_t>(bytes / 20e3));
  for (bool told = false; checkpoint_pending_; told = true) {
    bool stepping = false;
    with_engine([&](gossip::RoundEngine& e) {
      e.snapshot_now();
      stepping = e.stepping();
    });
    if (!stepping) {  // idle with the snapshot made, or unable to make one now
      checkpoint();
      if (checkpoint_pending_)
        spdlog::warn("no snapshot of the state can be made now: the last checkpoint stays");
      return;
    }
    if (!told)
      spdlog::info("writing the last checkpoint: the state's snapshot first ({:.1f} GB)",
                   bytes / 1e9);
    if (!s_.reports.wait(deadline) && SteadyClock::now() >= deadline) {
      spdlog::warn("the state's snapshot was not written in time: the last checkpoint stays");
      return;
    }
  }
}

// The run's outcome for this node: the trainer told, the last evaluation, stdout and the "stop"
// metrics event.
int Loop::finish() {
  if (*exit_ != 0 && !started_) return *exit_;
  final_checkpoint();
  s_.checkpoints.stop();
  if (s_.external)
    s_.external->say_goodbye(s_.stopping ? "the node was stopped (signal)"
                                         : "the node ended its run");
  evaluate();
  Outcome o;
  o.run = s_.run_name;
  o.wall_s = std::chrono::duration<double>(SteadyClock::now() - training_since_).count();
  o.utilization = o.wall_s - t_.eval_s > 0 ? t_.compute_s / (o.wall_s - t_.eval_s) : NAN;
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  o.peak_rss_bytes = static_cast<double>(ru.ru_maxrss) * 1024.0;
  o.param_bytes = 4.0 * static_cast<double>(P_);
  o.loss_floor = s_.workload.loss_floor();
  o.checkpoints = s_.checkpoints.stats();
  const auto net = s_.net.stats();
  o.host = net.host;
  o.relay = net.relay;
  o.reach = net.reach;
  if (s_.external) o.handoff = s_.external->handoff(true);
  event::Stop e;
  e.first_eval_loss = t_.first_eval;
  e.loss_floor = o.loss_floor;
  e.rounds_averaged = t_.rounds_averaged;
  e.rounds_local = t_.rounds_local;
  e.syncs = t_.syncs;
  e.compute_s = t_.compute_s;
  e.eval_s = t_.eval_s;
  e.wall_s = o.wall_s;
  e.utilization = o.utilization;
  e.peak_rss_bytes = o.peak_rss_bytes;
  e.param_bytes = o.param_bytes;
  e.checkpoints = o.checkpoints.written;
  e.checkpoint_s = o.checkpoints.mean_s;
  s_.metrics.write(t_.progress, e);
  s_.console.summary(t_, o);
  if (o.handoff) {
    const auto& h = *o.handoff;
    s_.metrics.write(
        t_.progress,
        event::Handoff{h.bytes, ms_each(h.get_s, h.gets), ms_each(h.set_s, h.sets),
                       1e3 * h.memcpy_s, h.sets ? h.set_bytes / static_cast<double>(h.sets) : NAN});
  }
  return *exit_;
}

}  // namespace

int run_training(TrainingSetup& s) {
  return Loop(s).run();
}

}  // namespace grove::node
