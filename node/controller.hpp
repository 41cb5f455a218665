// Controller: the node's own policy, sans-IO. Everything a node decides outside the protocol
// cores lives here: how it starts (bootstrap, resume, join and how often a join is tried), when an
// inner phase may run, what happens to θ when a round ends (restart from φ, or mix with it under
// overlap), a non-finite inner phase dropped, how long a node left alone keeps looking for
// partners (patience, from the measured inner phase), the checkpoint cadence, and how it stops
// (finish the round in flight within a grace, leave the member view, last checkpoint, exit). A
// long round is never a reason to leave: the round's operations end themselves (their deadlines
// come from their sizes), and the node waits for them.
//
// It takes events (begin, reports of the round engine, the end of an inner phase, stop, the
// member record's removal, timers) with the current time and queues actions for its driver; it
// owns no thread, clock, socket or model-sized buffer. grove-node (node/training_loop.cpp) and
// the simulator (sim::Swarm) both drive it: the simulator holds no copy of any of these rules.
//
// The driver owns θ, the round engine and the workload; it runs take_actions() in order after
// every event, and calls on_timer() at next_deadline(). An inner phase runs from a `train` action
// to on_inner_done(); after stop() the driver abandons the phase under way and reports nothing of
// it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gossip/round.hpp"

namespace grove::node {

using Time = std::chrono::milliseconds;

struct ControllerOptions {
  /// The next inner phase starts while the round runs; its θ is mixed with the round's φ.
  bool overlap = false;
  float mix_alpha = 0.5f;  ///< overlap: θ = α·θ + (1−α)·φ
  /// State syncs in a row that verify nothing a joiner tries before it gives up (a resumed node
  /// tries one, then goes on from its checkpoint). An attempt that got part of the state before
  /// it failed does not count.
  int join_attempts = 3;
  /// A sync attempt that neither ends nor verifies more of the state for this long has failed
  /// (its own requests have deadlines from their sizes; this is the backstop). A download that
  /// makes progress is never cut off, however large the state or slow the link.
  Time join_wait{120'000};
  /// The matchmaking window (RoundOptions::match.window): a node left alone keeps trying later
  /// windows for about one round (its last: inner phase, averaging and outer step), at least two
  /// windows, at most patience_cap. The cap is long (nodes that pair once share a cadence, so
  /// the wait is paid once, and a model of billions of parameters has inner phases of many
  /// minutes); it bounds the idle time of a node whose view still lists partners that are gone.
  Time window{10'000};
  Time patience_cap{1'800'000};
  /// A node whose view shows no other member is taken to be alone (patience 0) only once its
  /// view has had time to fill (two membership polls) since training began.
  Time settle{15'000};
  /// The round in flight after stop(): at least this, and twice the last round's sync (a large
  /// model's exchange over a slow line takes minutes; cutting it loses the round for the partner
  /// too).
  Time stop_grace{30'000};
  Time leave_wait{5'000};  ///< the member record's removal, at most
  /// A checkpoint after every n-th new state (round or sync; 0: not by count), or once
  /// checkpoint_interval has passed since the last one (0: not by time), whichever comes first,
  /// and always when leaving. A model-sized checkpoint is written in the background from the
  /// state's blob; a large model's node checkpoints by time (node/training_loop.cpp).
  std::uint32_t checkpoint_every = 1;
  Time checkpoint_interval{0};
};

/// How a node starts.
enum class StartKind {
  bootstrap,  ///< a new run from the workload's initial θ
  join,       ///< the swarm's state (join_attempts tries, then exit 1)
  resume,     ///< a checkpoint: the swarm's newer state first when `peers`, else at once
};

struct Action {
  enum class Kind {
    start_fresh,       ///< engine.start(φ = the workload's initial θ, zero momentum)
    start_checkpoint,  ///< engine.start(the checkpoint's outer state)
    join,              ///< engine.join(): download the swarm's state (attempt n)
    load_phi,          ///< θ = φ (the next inner phase starts from the slow weights)
    mix,               ///< θ = alpha·θ + (1−alpha)·φ (engine.mix)
    train,             ///< begin an inner phase from θ as it is
    check,             ///< read θ as it stands and hand it to on_theta()
    submit,            ///< hand θ to the engine (it is idle)
    set_patience,      ///< engine.set_patience(time)
    set_group_wait,    ///< engine.set_group_wait(time)
    checkpoint,        ///< save the engine's state (and the workload's)
    leave,             ///< the member record says "leaving" and goes; on_left() when done
    exit,              ///< the run ends here: `code`, `why`
  };
  /// Where the training's first θ came from (load_phi at the start only).
  enum class Source { none, fresh, checkpoint, swarm };
  explicit Action(Kind k) : kind(k) {}
  Kind kind;
  Time time{0};     ///< set_patience, set_group_wait
  float alpha = 0;  ///< mix
  int attempt = 0;  ///< join: 1, 2, ...
  /// load_phi: the part of θ taken from φ (a round of one streaming fragment: the rest of θ
  /// goes on as the driver submitted it); all of it by default.
  gossip::Slice slice;
  Source source = Source::none;
  int code = 0;     ///< exit
  std::string why;  ///< exit, and the reason of a dropped phase
};
const char* to_string(Action::Kind k);

class Controller {
 public:
  explicit Controller(ControllerOptions opts);

  /// Starts the node; `peers`: a resumed node can ask the swarm for a newer state.
  void begin(StartKind kind, bool peers, Time now);
  /// A report of the round engine (gossip::RoundEngine::take_reports).
  void on_report(const gossip::RoundReport& r, Time now);
  /// An inner phase ended: how long it took, the live members in our view (ourselves included).
  /// A `check` follows once the round before it (overlap) has ended.
  void on_inner_done(Time phase, std::size_t live, Time now);
  /// θ as it stands, after a `check` (only read: NaN/Inf are dropped here).
  void on_theta(std::span<const float> theta, Time now);
  /// The same when the driver has checked θ itself (a fragment at a time): every value finite.
  void on_theta(bool finite, Time now);
  /// No inner phase from now on (a step budget is spent): the phase under way, if any, is
  /// abandoned; a phase that ended is still submitted; the run ends with the round in flight.
  void finish(Time now);
  /// A stop request (signal, graceful leave): the phase under way is abandoned, nobody is waited
  /// for any more, the round in flight gets stop_grace, then the node leaves.
  void stop(Time now);
  /// The member record's removal went out (after a `leave` action).
  void on_left(Time now);
  void on_timer(Time now);
  std::optional<Time> next_deadline() const;
  std::vector<Action> take_actions() { return std::exchange(actions_, {}); }

  /// An inner phase may be under way (from `train` to on_inner_done).
  bool training() const { return training_; }
  /// θ went to the engine and its round has not been reported yet.
  bool in_round() const { return in_round_; }
  /// stop() was called: the driver abandons the inner phase under way.
  bool stopping() const { return stopping_; }
  bool leaving() const { return phase_ == Phase::leaving || phase_ == Phase::done; }
  bool done() const { return phase_ == Phase::done; }
  /// Inner phases dropped for NaN/Inf in θ.
  std::uint64_t dropped() const { return dropped_; }
  /// Patience given to the engine after the last inner phase.
  Time patience() const { return patience_; }
  const ControllerOptions& options() const { return opts_; }

 private:
  enum class Phase { idle, joining, running, leaving, done };
  void push(Action a) { actions_.push_back(std::move(a)); }
  void push(Action::Kind k) { actions_.push_back(Action{k}); }
  void start_training(Action::Source source, Time now);
  void join_attempt(Time now);
  void join_failed(const std::string& why, Time now);
  void after_state(Time now);  // a checkpoint on the cadence
  void check(Time now);        // patience for the next round, then `check`
  void submit(Time now);
  void train(Time now);
  void leave(Time now);
  void exit(int code, std::string why);

  ControllerOptions opts_;
  Phase phase_ = Phase::idle;
  std::vector<Action> actions_;
  // start
  bool resume_ = false;
  int attempt_ = 0, attempts_ = 0;
  int fruitless_ = 0;              ///< join attempts in a row that verified nothing
  bool progressed_ = false;        ///< this attempt has held more of a state than any before it
  std::uint64_t most_synced_ = 0;  ///< the most bytes of a state any attempt has held
  Time join_deadline_{Time::max()};
  // training
  bool training_ = false;   // a `train` action went out, its on_inner_done not yet
  bool in_round_ = false;   // a `submit` went out, its report not yet
  bool waiting_ = false;    // overlap: an inner phase ended while the round ran
  bool finishing_ = false;  // no inner phase after the one under way
  bool stopping_ = false;
  std::optional<Time> training_since_, last_submit_;
  Time round_deadline_{Time::max()};
  Time leave_deadline_{Time::max()};
  Time patience_{0};
  Time last_phase_{0};    // the last inner phase's length (on_inner_done)
  std::size_t live_ = 0;  // the live members it saw
  Time last_sync_{0};     // the last round's, submit to new slow weights
  Time stop_grace() const { return std::max(opts_.stop_grace, 2 * last_sync_); }
  int unpaired_ = 0;  // rounds in a row that averaged with nobody
  std::uint32_t since_checkpoint_ = 0;
  std::optional<Time> last_checkpoint_;
  std::uint64_t dropped_ = 0;
};

}  // namespace grove::node
