// The outer loop of one node: everything between two inner phases, sans-IO. The node trains H
// inner steps, hands the fast weights θ to submit(), and the engine
//  1. takes the round's mode from the mode schedule (gossip/mode.hpp; the records are polled in
//     the background every `mode_poll`, so a round never waits for them);
//  2. matches (gossip/matchmaking.hpp): a pair or trio for NoLoCo; for DiLoCo the window's group
//     of members at the swarm's round (everyone, or groups of `diloco_group`);
//  3. asks its driver to run the group's operation: NoLoCo's GroupExchange of θ (θ and φ when
//     β ≠ γ), or DiLoCo's RingAllReduce of Δ = φ − θ. A member entering DiLoCo from NoLoCo
//     (whose slow weights differ from everyone's) asks in its ready record for φ to be averaged
//     too: that window's group takes every DiLoCo member whatever its round, all-reduces φ ‖ Δ,
//     restarts the momentum and continues from the highest round, so that every member then
//     holds the same φ, momentum and round;
//  4. applies the outer step (optim/outer.hpp) with what came back, or the local-only step when
//     nobody completed; the momentum restarts from zero when the mode changes;
//  5. publishes the new round and the BLAKE2b-256 of φ in its member record, checks the records
//     of its DiLoCo group for the same round against its own hash (a mismatch is logged as an
//     error and counted; a member whose hash is not the group's — a strict majority's, or, once
//     every member has published, the most common with ties to the lowest — replaces its state
//     by state sync from a member holding the group's hash instead of its next round), and serves a
//     snapshot of its state to joiners (gossip/state_sync.hpp), announced by a signed offer record,
//     and the DiLoCo round's mean Δ as a delta (gossip/state_delta.hpp) listed in that offer.
// A joiner starts with join(): it reads the offers and downloads the newest state. A DiLoCo member
// that was left out of a round (too slow for the window, not at the swarm's round, or excluded
// from the all-reduce) catches up the same way instead of applying a step of its own: its slow
// weights would otherwise differ from the group's from then on. When its φ is the group's of an
// earlier round, it fetches and replays the group's deltas since (a quarter of the state's bytes
// each in fp16) instead of the state. So that such a download can ever land on the group's
// current state, a DiLoCo group waits at its round boundary for live members fetching the state
// (RoundOptions::sync_wait), then for their inner phase.
//
// The driver (the node's Asio runtime, or sim::Swarm) feeds the DHT and the engine the time,
// runs the operations from take_ops() with its own clock (StartOp::make), carries the state
// requests from take_state_requests(), runs the outer steps from take_step_jobs() and builds the
// snapshots from take_snapshot_jobs() (for a large state each takes seconds: the node runs them
// off the engine's thread) and hands them back with on_step_done() and on_snapshot(), and calls
// on_timer at next_deadline(). The engine's own time is the DHT's (record time).
#pragma once

#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "dht/membership.hpp"
#include "gossip/allreduce.hpp"
#include "gossip/catch_up.hpp"
#include "gossip/consistency.hpp"
#include "gossip/exchange.hpp"
#include "gossip/matchmaking.hpp"
#include "gossip/mode.hpp"
#include "gossip/op_deadline.hpp"
#include "gossip/progress.hpp"
#include "gossip/state_sync.hpp"
#include "gossip/step_work.hpp"
#include "optim/outer.hpp"
#include "optim/state_format.hpp"

namespace grove::gossip {

struct RoundOptions {
  OuterMode mode = OuterMode::noloco;  ///< the run's configured mode
  optim::NoLoCoConfig noloco;
  optim::DiLoCoConfig diloco;
  ExchangeOptions exchange;    ///< total_timeout is set per op (op_deadline)
  AllReduceOptions allreduce;  ///< total_timeout is set per op (op_deadline)
  /// DiLoCo-mode rounds with compressed messages (SparseLoCo, E3M0 DiLoCo: step_work.hpp) in an
  /// all-gather whose timers are allreduce's; none: the fp16 all-reduce of Δ.
  std::optional<CompressedRounds> compressed;
  /// Streaming fragments (gossip/slice.hpp): a DiLoCo-mode round r averages and steps fragment
  /// r mod `fragments` of φ only (its Δ, or its part of the error buffer); rounds that average
  /// φ take all of it. The report names the slice (RoundReport::slice): the driver loads only
  /// that part of θ from φ. A NoLoCo pair exchanges and averages one fragment, drawn from the
  /// matchmaking window (both members draw the same), and takes the local-only step on the rest
  /// (all of φ changes). 1: every round averages all of φ.
  std::size_t fragments = 1;
  OpDeadlineOptions op_deadline;
  MatchOptions match;            ///< group_size and same_round are set per mode
  std::size_t diloco_group = 0;  ///< 0 = everyone at the swarm round in the window
  std::size_t noloco_group = 2;  ///< NoLoCo's groups (2: pairs; a remainder joins a group)
  Time mode_poll{5'000};
  std::uint64_t mode_lead = 2;  ///< a mode request names a round at least this far ahead
  bool serve_state = true;      ///< keep snapshots for joiners and announce them
  /// How often a round's new state gets a snapshot (its binary form, served to joiners and
  /// written into checkpoints): 0 = every new state. A large state's snapshot writes and hashes
  /// 8 bytes a parameter (GBs a round), so the node makes one at its checkpoints' cadence (and
  /// when it asks: want_snapshot(); Time::max(): only then). The last snapshot is served and
  /// offered meanwhile: a NoLoCo joiner may start from a member's φ of some rounds ago (its
  /// partners average it in). A DiLoCo member catching up needs the group's state of the round:
  /// it takes the last snapshot and replays the rounds' deltas since (2 bytes a parameter each,
  /// listed in the offer), so a DiLoCo state also gets one when the deltas since the last would
  /// pass deltas_after_snapshot(), or a round has none (a lone step, slow weights averaged).
  /// The first state and every synced state always get one.
  Time snapshot_every{0};
  Time offer_ttl{600'000};
  std::uint32_t snapshot_chunk = 4u << 20;
  /// Where the state's binary form is kept: the snapshots served, the downloads (nullptr: in
  /// memory; the node keeps them in files, node/state_files.hpp).
  std::shared_ptr<BlobStore> blobs;
  /// Where φ and the momentum live (none: the heap; the node pages them, node/state_files.hpp).
  optim::FloatAllocator floats;
  StateSyncOptions sync;     ///< max_size bounds a joiner's download (catch-up: 3 × φ's bytes)
  Time offers_wait{20'000};  ///< how long a sync looks for offers before giving up
  /// DiLoCo: a member left alone in its window while no live member is ahead of its round (the
  /// others have not ended this round either: they are still training, or behind and catching
  /// up) keeps declaring itself ready in the following windows for up to this long, so that the
  /// group meets again; syncing would find no newer state, and a step of its own would split the
  /// group's slow weights. Past this bound it takes the local step (the others then catch up
  /// from it). A member that others have left behind catches up by state sync at once.
  Time group_wait{120'000};
  /// DiLoCo: a group (or a member alone at its round) also waits for live members that are
  /// fetching the state (joining, or catching up: their records say so) instead of moving on
  /// without them: every step taken meanwhile would make the state they fetch stale again, and
  /// a joiner whose download outlasts a round would never catch up. (As with PCCL's shared-state
  /// sync and torchft's recovery, the group pauses at one round boundary for a join.) For as
  /// long as a download of our state should take at the rate our averaging measured (the op
  /// deadline of its bytes: floor + margin × bytes ÷ rate), and at most sync_wait after the
  /// inner phase; never while group_wait is 0 (leaving).
  Time sync_wait = Time::max();
  std::size_t max_values = std::size_t{1} << 31;
  unsigned threads = 0;  ///< optim threads (0 = all)
};

struct RoundReport {
  enum class Kind {
    round,        ///< a round ended: the new φ is in state()
    synced,       ///< the state was replaced by a downloaded one (join or catch-up)
    sync_failed,  ///< a join found no usable state (the node decides: retry or give up)
    /// a state sync under way verified more of the state (at most about once a second):
    /// sync_bytes of sync_total at sync_rate
    sync_progress,
    saved,  ///< the snapshot that snapshot_now() began is written: state_blob() holds it
  };
  Kind kind = Kind::round;
  std::uint64_t round = 0;  ///< round: the round that ended; synced: the round we are at now
  OuterMode mode = OuterMode::noloco;
  std::vector<NodeId> group;       ///< as matched (ourselves included)
  std::uint64_t window = 0;        ///< round: the matchmaking window it was matched in
  std::size_t ready_seen = 0;      ///< round: the window's ready records the match read
  std::size_t ready_not_live = 0;  ///< round: records left out, their owners seemed gone
  bool ready_late = false;  ///< round: our ready record was not stored before its window closed
  std::vector<NodeId> averaged_with;  ///< partners whose tensors were used
  bool local_only = false;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  Time sync_time{0};      ///< submit to new slow weights
  Time transfer_time{0};  ///< round: the group operation's run (start to its outcome)
  std::uint64_t sync_bytes = 0, sync_total = 0;  ///< sync_progress: verified bytes of the state
  double sync_rate = 0;                          ///< sync_progress: bytes per second from the donor
  Digest weights_hash{};
  /// round: the part of φ the step changed (a streaming fragment; all of it by default), the part
  /// of θ the next inner phase takes from φ (the rest goes on from the θ submitted: the spare).
  Slice slice;
  /// round, with RoundOptions::fragments > 1: the fragment the group averaged (0-based; DiLoCo:
  /// round mod fragments, NoLoCo: drawn from the window)
  std::size_t fragment = 0;
  std::string note;
  /// A φ-sized buffer the engine is done with (the θ it was given, or the exchange's mean made
  /// in it), for the driver's next θ: its pages are already mapped (empty when there is none).
  optim::Floats spare;
};
const char* to_string(RoundReport::Kind k);

class RoundEngine {
 public:
  /// An operation for the driver to run; make(now) builds it with the driver's clock.
  struct StartOp {
    OpId op{};
    std::function<std::unique_ptr<Protocol>(Time now)> make;
    std::map<NodeId, std::string> addresses;
  };

  /// `addresses` are ours (ready records, offers). `server` receives our snapshots (may be
  /// shared with the transport's request handler). Throws ConfigError for a bad run id.
  RoundEngine(dht::RecordStore& store, dht::Membership& members, std::string run_id,
              std::vector<std::string> addresses, RoundOptions opts,
              std::shared_ptr<StateServer> server);
  ~RoundEngine();
  RoundEngine(const RoundEngine&) = delete;
  RoundEngine& operator=(const RoundEngine&) = delete;

  /// Starts from `state` (bootstrap, or a restart from a checkpoint).
  void start(optim::OuterState state, Time now);
  /// Starts by downloading the swarm's state; a synced (or sync_failed) report follows. `values`
  /// is φ's size from the run config when known: offers of larger states are not even tried and a
  /// state of another size is refused.
  void join(Time now, std::optional<std::size_t> values = std::nullopt);

  /// True when the node may train: the state is present and no round or sync is in flight
  /// (with overlap the node trains on while a round is in flight, but submits only when idle).
  bool idle() const { return phase_ == Phase::idle; }
  bool has_state() const { return has_state_; }
  /// A group operation of ours is running (an exchange or an all-reduce).
  bool averaging() const { return phase_ == Phase::running; }
  /// The round's outer step is with the driver (a StepJob): state() holds the round only (φ and
  /// the momentum are with the job), state_blob() the state before the step. (Also while a
  /// downloaded state is parsed: syncing() then, and state() is the one before; and while a
  /// DiLoCo member measures its pseudo-gradient before it declares itself ready.)
  bool stepping() const { return phase_ == Phase::stepping; }
  /// Downloading a state, or parsing the one downloaded (a StepJob).
  bool syncing() const {
    return phase_ == Phase::syncing ||
           (phase_ == Phase::stepping && step_ &&
            (step_->kind == StepWork::Kind::parse || step_->kind == StepWork::Kind::replay));
  }
  /// θ after the inner steps (φ's size). Only when idle() (the driver's contract: dropped with an
  /// error line otherwise).
  void submit(optim::Floats theta, Time now);

  /// The slow weights, momentum and round (the next inner phase starts from start_part()); not
  /// while stepping().
  const optim::OuterState& state() const { return state_; }
  /// Where the next inner phase starts, for a part of the fast weights: θ[i] = φ[offset + i], or
  /// in NoLoCo rounds with a look-ahead λ (optim::NoLoCoConfig::lookahead)
  /// φ[offset + i] + λ·m[offset + i].
  void start_part(std::span<float> theta, std::size_t offset) const;
  /// Changes whenever state() is replaced (a step, a sync): a driver that reads φ over several
  /// calls (a fragment at a time) starts again when it changed.
  std::uint64_t state_generation() const { return state_gen_; }
  /// θ[i] = α·θ[i] + (1−α)·s[i] for θ a part of the fast weights and s where a new phase would
  /// start (start_part(); see mix()).
  void mix_part(std::span<float> theta, std::size_t offset, float alpha) const;
  /// state() in its binary form (optim/state_format.hpp), written once per new state into a blob
  /// of RoundOptions::blobs: the snapshot served to joiners; nullptr when the engine serves none.
  /// The node writes its checkpoints from it, so the state is serialised once per round.
  std::shared_ptr<const StateBlob> state_blob() const { return state_blob_; }
  /// The round of state_blob(): an earlier one than state()'s when the last new states got no
  /// snapshot (RoundOptions::snapshot_every).
  std::uint64_t state_blob_round() const { return blob_round_; }
  /// The next new state gets a snapshot whatever snapshot_every says.
  void want_snapshot() { want_snapshot_ = true; }
  /// A snapshot of the state as it is, when it has none and the engine is idle (a node leaving
  /// between rounds): a job writes it and a `saved` report follows. False when none is begun:
  /// the snapshot is current, or the engine is not idle (then the next new state gets one).
  bool snapshot_now();
  /// Overlap: the fast weights trained during the round, mixed with the new slow weights:
  /// θ = α·θ + (1−α)·φ (the next Δ is still taken against φ).
  void mix(std::span<float> theta, float alpha = 0.5f) const { mix_part(theta, 0, alpha); }
  /// How long a node left alone in its window keeps trying later windows (MatchOptions::
  /// patience): about one inner phase of the others, so that a slow node still pairs; zero when
  /// the node knows it is alone, so that a lone node does not wait for nobody.
  void set_patience(Time t);
  /// Changes RoundOptions::group_wait (a leaving node sets 0: it does not wait for the group).
  void set_group_wait(Time t);
  /// Whether this member trains at all (false: an external workload waiting for its trainer).
  /// Its record then says "idle" while it is between rounds: the others neither wait for it to
  /// form a group nor count it as a partner to be found.
  void set_idle(bool idle);
  /// Our addresses for ready records and state offers from now on (empty: we accept no
  /// connections; partners wait for ours).
  void set_addresses(std::vector<std::string> a) { addresses_ = std::move(a); }
  const std::vector<std::string>& addresses() const { return addresses_; }

  /// Requests `mode` from round `from_round` (default: our round + mode_lead); done gets the
  /// round, or errc::rejected for a round less than mode_lead ahead.
  void request_mode(OuterMode mode, std::optional<std::uint64_t> from_round, Time now,
                    std::function<void(transport::Result<std::uint64_t>)> done = {});
  OuterMode mode_of(std::uint64_t round) const;
  const std::vector<ModeRequest>& mode_schedule() const { return modes_; }

  // ---- driver ----
  std::vector<StartOp> take_ops() { return std::exchange(ops_, {}); }
  /// A state to serve to joiners: its binary form, to be cut into chunks and hashed
  /// (StateSnapshot::of) by the driver, who hands the snapshot back with its `seq`.
  struct SnapshotJob {
    std::uint64_t seq = 0;
    std::uint64_t round = 0;
    std::string run_id;
    std::shared_ptr<const StateBlob> blob;  ///< shared with state_blob()
    std::uint32_t chunk_bytes = 0;
  };
  std::vector<SnapshotJob> take_snapshot_jobs() { return std::exchange(snapshot_jobs_, {}); }
  /// The snapshot of job `seq` is built: served and offered, unless the state changed since
  /// (then it is dropped: a newer job is on its way).
  void on_snapshot(std::uint64_t seq, std::shared_ptr<const StateSnapshot> snap, Time now);
  /// The outer step that ends a round, with the new φ's hash and the new state's serialised form
  /// (seconds for a large model: the driver runs it off its strand, with nothing else of the
  /// engine's), then calls on_step_done(seq) with the engine's own time. The round is reported
  /// then. A downloaded state is parsed, hashed and serialised the same way before the synced
  /// report.
  struct StepJob {
    std::uint64_t seq = 0;
    std::function<void()> run;
    /// One read of φ and θ before a DiLoCo round (StepWork::Kind::prepare), not a step: a
    /// fraction of a step's time.
    bool prepare = false;
  };
  std::vector<StepJob> take_step_jobs() { return std::exchange(step_jobs_, {}); }
  void on_step_done(std::uint64_t seq, Time now);
  /// The operation of a StartOp ended (nullptr: the driver could not run it).
  void on_op_finished(std::unique_ptr<Protocol> p, Time now);
  std::vector<StateDownload::Request> take_state_requests();
  void on_state_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now);
  /// `why`: the transport's reason (a log line names it with the donor).
  void on_state_failure(std::uint64_t id, Time now, const std::string& why = {});
  void on_timer(Time now);
  std::optional<Time> next_deadline() const;

  std::vector<RoundReport> take_reports() { return std::exchange(reports_, {}); }
  /// What the engine no longer needs and the driver should free off its strand (freeing a large
  /// state's file, or a model-sized array's pages, takes a second or more): snapshots no longer
  /// served, arrays replaced (θ, once a round's mean takes its place) and finished operations
  /// (an all-reduce holds its input). A driver that never takes them has them freed here past a
  /// few.
  struct Retired {
    std::vector<std::shared_ptr<const StateSnapshot>> snapshots;
    std::vector<optim::Floats> arrays;
    std::vector<std::unique_ptr<Protocol>> ops;
    bool empty() const { return snapshots.empty() && arrays.empty() && ops.empty(); }
  };
  Retired take_retired() { return std::exchange(retired_, {}); }
  /// DiLoCo group members whose published hash for a round differed from ours.
  std::uint64_t mismatches() const { return judge_.mismatches(); }
  /// Times our slow weights were found to be the odd ones out and replaced from the group's.
  std::uint64_t repairs() const { return repairs_; }
  std::uint64_t syncs() const { return syncs_; }
  const NodeId& id() const { return store_.id(); }

 private:
  enum class Phase { none, idle, matching, running, stepping, syncing };
  void on_match(MatchResult m, Time now);
  /// Declares us ready for our round in the next window (a new round, or waiting for the group).
  void declare_ready(Time now);
  /// submit()'s second half, once the pseudo-gradient's norm is known (a prepare job): matching.
  void ready(Time now);
  /// The other live members in our view, less those seen leaving.
  using Others = OthersView;
  Others others(Time now) const {
    if (norm_left_out_.empty() && distrust_.empty())
      return view_of_others(members_.live(now), store_.id(), departed_, state_.round, last_group_);
    auto skip = departed_;  // and the members left out for no norm lately: not waited for
    for (const auto& [id, round] : norm_left_out_)
      if (state_.round <= round + 2) skip.insert(id);
    // Nor the donors whose state we refused: such a donor is neither waited for nor "ahead" of
    // us (a round only it claims, ended alone and vouched for by nobody else, would send us to
    // fetch that state again and again while the swarm waits at ours).
    skip.insert(distrust_.begin(), distrust_.end());
    return view_of_others(members_.live(now), store_.id(), skip, state_.round, last_group_);
  }
  /// DiLoCo: members our groups left out for declaring no ‖Δ‖ (gossip/matchmaking.hpp), with the
  /// round: the group does not wait for them for two rounds after (at most 64 kept).
  std::map<NodeId, std::uint64_t> norm_left_out_;
  /// DiLoCo: wait for the members that are fetching the state (RoundOptions::sync_wait).
  bool wait_for_syncing(const Others& view, Time waited, Time now) {
    if (view.syncing == 0 || view.ahead || opts_.group_wait <= Time(0) ||
        waited >=
            std::min(opts_.sync_wait, op_deadlines_.deadline_for(optim::serialized_size(state_))))
      return false;
    synced_seen_ = now;  // the group waits for them, and for group_wait once they are in
    return true;
  }
  Time synced_seen_ = Time::min();  // when we last saw (and waited for) a member fetching the state
  Time idle_at_{0}, inner_{0};      // our last inner phase: its start and length
  Time round_time_{0};              // our last round: inner phase and averaging
  Time last_sync_{0};               // our last state sync (download and parse or replay)
  /// Where a new inner phase starts from value `offset` on: φ + la·m (m null: φ itself).
  struct StartPoint {
    const float* phi;
    const float* m;
    float la;
    float at(std::size_t i) const { return m ? phi[i] + la * m[i] : phi[i]; }
  };
  StartPoint start_point(std::size_t offset) const;
  /// An inner phase when we saw a member fetching the state during our last inner phase or since
  /// (it trains its own inner phase before it is ready), else nothing: added to the waits for
  /// the group.
  Time newcomer_phase() const { return synced_seen_ + inner_ > submitted_ ? inner_ : Time(0); }
  /// The work of a round's step: φ and the momentum move into it, with its inputs set by the
  /// caller; finish_round hands it to the driver.
  /// `delta`: the step keeps the round's mean Δ as a delta (a DiLoCo all-reduce's).
  std::shared_ptr<StepWork> step_work(StepWork::Kind kind, bool delta = false);
  /// φ and the momentum move into a job (a step, a replay, a snapshot): state() holds the round
  /// meanwhile.
  void lend_state(StepWork& w);
  /// A report of `kind` about the state held now (its round, mode and φ's hash).
  RoundReport state_report(RoundReport::Kind kind) const;
  /// The step without partners (θ against φ alone).
  std::shared_ptr<StepWork> local_step(RoundReport& r);
  /// Ends the round: the driver runs `w`, on_step_done reports `r` (and, for a DiLoCo group of
  /// several `members`, checks their hashes against ours).
  void finish_round(RoundReport r, std::shared_ptr<StepWork> w, std::set<NodeId> members = {});
  /// Phase::stepping: `w` goes to the driver as a StepJob.
  void hand_over(std::shared_ptr<StepWork> w);
  /// A new state (start): hash and serialise it here, then publish_state.
  void after_state(Time now);
  /// φ changed (its hash is in phi_hash_): publish round and hash, serve `bytes` as a snapshot
  /// (nullptr when the engine serves none) and offer it.
  void publish_state(std::shared_ptr<const StateBlob> blob);
  void publish_self(const char* status);
  /// Downloads a state of at least `min_round`; from `donors` only when given.
  void begin_sync(std::uint64_t min_round, bool joining, std::string why, Time now,
                  std::set<NodeId> donors = {});
  /// A sync that follows the one just ended (the group moved on meanwhile, or its deltas did not
  /// replay): reported as one, from the first one's start.
  void sync_again(std::uint64_t min_round, std::string why, Time now);
  /// The catch-up ended (or not yet): the downloaded state goes to the driver to be parsed.
  void sync_done(Time now);
  /// The downloaded state was parsed (w->error says why not).
  void synced(const std::shared_ptr<StepWork>& w, Time now);
  void sync_failed(std::string why, Time now);  // by value: `why` may live in catch_up_
  void report_progress(Time now);  // a sync_progress report, at most about once a second
  void poll_modes(Time now);
  /// Δ = φ − θ over `slice` (times `scale`) written at `offset` of `into`
  /// (pseudo_gradient_into).
  optim::Floats delta(std::size_t offset, optim::Floats into, float scale = 1.0f,
                      Slice slice = {}) const {
    return pseudo_gradient_into(state_.phi, theta_, offset, std::move(into), opts_.floats,
                                opts_.threads, scale, slice);
  }
  /// The part of φ this round averages and steps (RoundOptions::fragments).
  Slice slice_ = {};
  std::size_t fragment_ = 0;  ///< its index
  /// NoLoCo with fragments: the one a pair matched in `window` averages (slice_, fragment_ set).
  void draw_noloco_fragment(std::uint64_t window);
  /// Compressed rounds with fragments: the all-gather's input (our error buffer's slice) back
  /// into the error buffer `e`; without, the buffer itself.
  void put_back_error(optim::Floats part, optim::Floats& e) const;
  optim::Floats spare_;  // the last all-reduce's result buffer, for the next one
  OpDeadlines op_deadlines_;
  std::uint64_t state_gen_ = 0;
  Retired retired_;
  /// Hands `a` to the driver to free (see take_retired).
  void retire(optim::Floats a);
  /// state_ = s, the arrays it held retired.
  void replace_state(optim::OuterState s);
  /// The most ‖mean Δ‖ of the all-reduce among `ring` may be (StepWork::max_mean_norm): the
  /// mean of the norms its members declared (each at most the group's norm_clip), with `codec`'s
  /// rounding; NaN when not every member declared one or the group averaged φ.
  double mean_norm_bound(const std::vector<NodeId>& ring, WireCodec codec, bool gathered) const;
  /// The deadline of an averaging op that sends `bytes` (logged).
  Time op_deadline(const char* what, std::size_t members, std::uint64_t bytes, Time silence) const;
  /// Starts the round's averaging operation (made by start.make) among `group`.
  void run_op(StartOp start, const std::vector<NodeId>& group, RoundReport r, Time now);
  /// The round's ring all-reduce of `input` among m.group with `o` (its allocator, start grace
  /// and deadlines set here from the window and the bytes; `what` names it in the log).
  void start_allreduce(const MatchResult& m, std::shared_ptr<optim::Floats> input,
                       AllReduceOptions o, const char* what, StartOp start, RoundReport r,
                       Time now);
  /// E3M0 rounds: the most a member's residual (its next error buffer) may be, times its fresh
  /// ‖Δ‖.
  static constexpr double kMaxResidualToDelta = 2.0;
  /// Compressed rounds: the all-gather of our message, cut from the error buffer (scaled by
  /// `scale` when its norm is above the group's bound); E3M0: the all-reduce of the error buffer
  /// with error feedback (its 4-bit partial sums: gossip/allreduce.hpp).
  void start_gather(const MatchResult& m, float scale, StartOp start, RoundReport r, Time now);

  dht::RecordStore& store_;
  dht::Membership& members_;
  std::string run_id_;
  std::vector<std::string> addresses_;
  RoundOptions opts_;
  std::shared_ptr<StateServer> server_;
  std::unique_ptr<Matchmaker> pairs_, groups_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

  Phase phase_ = Phase::none;
  bool has_state_ = false;
  bool idle_ = false;  ///< set_idle()
  optim::OuterState state_;
  Digest phi_hash_{};  // BLAKE2b-256 of state_.phi (reports, records and checks reuse it)
  std::vector<SnapshotJob> snapshot_jobs_;
  std::shared_ptr<const StateBlob> state_blob_;  // state_ in its binary form
  std::uint64_t snapshot_seq_ = 0;               // of the latest job
  std::uint64_t state_job_ = 0;                  // the job of state_'s snapshot
  std::uint64_t blob_round_ = 0;                 // state_blob_'s round
  Time last_snapshot_{0};                        // when state_blob_ was made
  bool want_snapshot_ = false;
  std::uint64_t chain_end_ = 0;  // the round the deltas since state_blob_'s round lead to
  /// Whether the new state of a step begun now gets a snapshot (RoundOptions::snapshot_every);
  /// `delta`: the step keeps a delta.
  bool snapshot_due(Time now, bool delta) const;
  /// How many DiLoCo rounds may follow a snapshot, each replayed by its delta (the deltas kept,
  /// less two for members behind the snapshot's round).
  std::uint64_t deltas_after_snapshot() const;
  /// The round's mean Δ kept as a delta (`blob`, of the step from φ of hash `from`): a snapshot
  /// job, served and listed in the offer once built.
  void serve_delta(std::shared_ptr<const StateBlob> blob, const Digest& from);
  std::map<std::uint64_t, DeltaOffer> delta_jobs_;  // by job: the delta (root and size to come)
  std::vector<DeltaOffer> deltas_;                  // served and offered, oldest first
  std::vector<StepJob> step_jobs_;
  std::uint64_t step_seq_ = 0;
  std::shared_ptr<StepWork> step_;  // while stepping: the job's work, its report and group
  RoundReport step_report_;
  std::set<NodeId> step_members_;
  std::set<NodeId> last_group_;  // the others of our last DiLoCo round's group
  optim::Floats theta_;
  Time submitted_{0};
  OuterMode round_mode_ = OuterMode::noloco;
  bool entering_diloco_ = false;
  bool average_phi_ = false;       // this DiLoCo round averages φ as well
  std::uint64_t group_round_ = 0;  // the round the group agreed on
  /// DiLoCo: ‖Δ‖ of this round's θ, declared in our ready records (NaN: entering from NoLoCo).
  double delta_norm_ = std::numeric_limits<double>::quiet_NaN();
  /// Compressed rounds: ‖Δ‖ of this phase alone (delta_norm_ is ‖e‖, Δ with what is left over).
  double fresh_norm_ = std::numeric_limits<double>::quiet_NaN();
  bool error_has_delta_ = false;          // compressed rounds: this round's Δ is in state_.error
  std::map<NodeId, double> group_norms_;  // the norms the running all-reduce's group declared
  double group_clip_ = std::numeric_limits<double>::quiet_NaN();  // and its norm_clip
  std::optional<OpId> op_;
  Time op_started_{0};
  std::vector<NodeId> group_;
  RoundReport matched_;  ///< the running op's report as its match began it
  std::vector<StartOp> ops_;
  std::vector<RoundReport> reports_;

  // mode schedule
  std::vector<ModeRequest> modes_;
  Time next_mode_poll_{0};
  bool mode_polling_ = false;

  // state sync (join / catch-up)
  std::unique_ptr<CatchUp> catch_up_;
  /// A joiner's verified chunks from a failed attempt, for the next one (join()).
  std::optional<SyncPartial> sync_partial_;
  Time progress_at_{0};  ///< the last sync_progress report
  std::uint64_t progress_bytes_ = 0;
  bool joining_ = false;
  std::optional<std::size_t> expect_values_;
  Time sync_started_{0};
  std::string sync_why_;
  StateOffer sync_offer_;  // of the state being parsed
  std::uint64_t sync_min_round_ = 0;
  std::vector<Witness> sync_witnesses_;  // what the other members said of its round
  std::uint64_t sync_seed_ = 0;          // the probe's
  std::set<NodeId> distrust_;  // donors whose state was refused (until a sync is accepted)
  std::uint64_t syncs_begun_ = 0;
  /// Whether the state the sync job produced is one the other members vouch for
  /// (gossip/state_check.hpp); the verdict's detail goes to the log and the synced report.
  StateVerdict check_synced(const StepWork& w) const;
  std::uint64_t sync_bytes_ = 0;  // downloaded for it (the state, or deltas)
  bool full_sync_only_ = false;   // deltas did not replay: the next sync takes the whole state
  bool damaged_ = false;  // a replay stopped part way: φ is no round's until a sync succeeds
  /// A sync ended while the group had moved on: its report, held until the catch-up that
  /// follows it at once ends (chained_ times so far).
  std::optional<RoundReport> pending_synced_;
  int chained_ = 0;
  std::uint64_t offer_seq_ = 0;
  std::optional<StateOffer> offer_;  // of the snapshot served now
  Time offer_refresh_{Time::max()};
  void write_offer(Time now);

  // consistency: our φ against the group's after DiLoCo rounds (a repair re-syncs at the next
  // DiLoCo submit)
  ConsistencyJudge judge_;
  std::set<NodeId> departed_;  // members seen leaving or expiring: their ready records are ignored
  std::uint64_t syncs_ = 0, repairs_ = 0;
  bool synced_into_round_ = false;  // we joined by a state sync and have ended no round since
};

}  // namespace grove::gossip
