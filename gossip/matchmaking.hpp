// Matchmaking through the DHT, without a coordinator or a global barrier.
//
// Time is cut into windows of `window` (wall clock, the DHT's record time). A node that has
// finished its inner steps declares itself ready for the first window that closes at least its
// lead from now (`min_lead`, or the time its own recent ready writes took when that is longer,
// so that its record is stored before the close): it stores a signed ready record (its
// addresses, run, round, window) under key("grove/run/<run>/ready/<window>"). When the window
// has closed and `settle` more has passed, it reads that key (visiting the k closest nodes, so
// every writer is seen) and keeps the records of this run and window whose owners pass the live
// filter (the round engine's: no member seen leaving or expiring). Every node that reads the same
// set computes the same groups:
//   members ordered by BLAKE2b-256(run ‖ window ‖ id), taken two at a time; an odd one out joins
//   the last pair (a group of three).
// The order changes with every window, so partners are random and different every round. A node
// that finds nobody else tries the next windows for up to `patience` past its first read, then
// (or when its read fails or exceeds `read_timeout`) gets a group of one: the local-only step. A
// node 3× slower than the others simply lands in whichever window it is ready for and pairs with
// whoever is ready there; nobody waits longer than window + settle + read for it. For DiLoCo
// (same_round) only members at the window's majority round are grouped; one at another round is
// told so. When two nodes read different sets (records still spreading) their groups may disagree;
// the exchange then finds no partner and times out to local-only. In a large swarm the window's
// records are spread over buckets (MatchOptions::bucket_members): each member writes, reads and is
// grouped within its bucket of the window, so that a read costs a bucket's records, not the
// swarm's. Sans-IO like Membership: it drives a record store (dht/record_store.hpp) with the times
// it is given.
#pragma once

#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dht/record_store.hpp"
#include "gossip/protocol.hpp"

namespace grove::gossip {

struct MatchOptions {
  Time window{10'000};
  /// A ready record must be out this long before its window closes; more when this node's own
  /// ready writes have been taking longer (Matchmaker::lead(): measured, at most max_lead).
  Time min_lead{2'000};
  Time max_lead{20'000};
  Time settle{1'500};  ///< after the close: time for records to spread before the read
  Time read_timeout{8'000};
  /// A node left alone in its window tries the following windows whose reads come at most this
  /// long after its first window's read (0 = one window only; counted from the first read, not
  /// from ready(), so that a node whose lead is longer than the others' still waits this long).
  /// Others are not held up: they pair in their own windows; this lets an off-beat node (a slow
  /// one) wait for the others' next window. Nodes that finish together cluster in one window per
  /// round, so about one round time of the fast nodes lets a slow node pair nearly every time (the
  /// node sets it from its round time).
  Time patience{60'000};
  /// A node left alone while another member is still in a round of its own (its member record
  /// says it is averaging, yet it wrote no ready record into our window: an exchange of a large
  /// model over a slow line, minutes long) counts its patience from the last read that saw such
  /// a member, not from its first read: that member is ready again about one inner phase after
  /// its round ends (a joiner's first round, or the odd node beside a pair, would otherwise go
  /// alone minutes before the others come back). At most busy_cap past the first read: the
  /// round engine sets it to the time a three-member exchange of its tensors takes at the rate
  /// its own exchanges have run (Matchmaker::set_busy_cap), so a member busy for longer than any
  /// exchange should last is not waited for.
  Time busy_cap{1'800'000};
  std::size_t max_ready = 4096;  ///< records considered per window
  /// 2 for NoLoCo pairs; 0 for one DiLoCo group of everyone ready in the window, or a bound on
  /// the all-reduce group size. A member not ready in the window is left out of that round.
  std::size_t group_size = 2;
  /// DiLoCo: every member of a group must hold the same slow weights, so only ready members at
  /// the window's swarm round (the round most of its records name; ties to the higher) are
  /// grouped. A member at another round gets a group of one with out_of_sync set: it catches up
  /// by state sync instead of stalling or corrupting the others' round. When a record of the
  /// window asks for average_phi (a member entering DiLoCo from NoLoCo, whose slow weights differ
  /// anyway), everyone is grouped whatever their round and the group averages φ as well.
  /// Only records of this kind (group or pair) are considered.
  bool same_round = false;
  /// Pairs and bounded groups of NoLoCo (not same_round): a large swarm's ready records are
  /// spread over buckets, about this many swarm members per bucket (0 = one bucket). Every
  /// window each member lands in bucket BLAKE2b(run ‖ window ‖ id) mod B, where B is the largest
  /// power of two ≤ swarm size ÷ bucket_members, writes its record under its bucket's key, reads
  /// that key only and is grouped with the members found there. A read then costs about
  /// bucket_members records instead of the whole swarm's, and the load of serving the window's
  /// records is spread over B sets of holders instead of one. Partners still come from the whole
  /// swarm over the rounds (the bucket changes every window). Two members whose views give
  /// different B write and read different keys: each key's readers still agree on its groups.
  std::size_t bucket_members = 64;
};

/// DiLoCo: a member's ‖Δ‖ counts in its group's mean up to this many times the median of the
/// norms the group's members declared (ReadyInfo::delta_norm); a larger Δ is scaled down to it.
/// Below 2, so that one outlier pushes less than two honest members pull φ back: with k honest
/// members the outlier's share is at most 1.5/k of theirs, and φ stays within a few honest steps
/// of where they take it (at 4, an outlier beside 2 honest members held φ two thirds of the way
/// to its value, and one beside 4 drifted it without end: tests/gossip/round_test.cpp). Honest
/// members' norms differ far less than 1.5× on shards of one data set.
inline constexpr double kMaxNormToMedian = 1.5;

struct ReadyInfo {
  NodeId id{};  ///< the record's owner (not encoded: the signature proves it)
  std::vector<std::string> addresses;
  std::string run_id;
  std::uint64_t round = 0;
  std::uint64_t window = 0;
  bool group = false;        ///< a DiLoCo group member (false: a NoLoCo pair member)
  bool average_phi = false;  ///< DiLoCo: our slow weights differ from the group's (entering)
  /// DiLoCo: the BLAKE2b-256 of our slow weights (all zero: not given). A group whose members
  /// name different hashes for the same round averages φ as well, so that it ends with one φ.
  std::array<std::uint8_t, 32> phi_hash{};
  /// DiLoCo: the group size this member still waits for in this window (the members its view
  /// has at its round, itself included; 0 = it does not wait). The group waits a window when
  /// any of its records names more than the group's size: one decision from the records all
  /// members read, not from each member's own view of the swarm.
  std::uint32_t wait_for = 0;
  /// DiLoCo: this member's view has members past its round (the round was ended without it).
  bool behind = false;
  /// DiLoCo: this member joined by a state sync and has ended no round since.
  bool fresh = false;
  /// DiLoCo: ‖Δ‖ of this member's pseudo-gradient for the round (NaN: not given — a member
  /// entering from NoLoCo, whose group averages φ). A member whose norm is above
  /// kMaxNormToMedian × the median of its group's scales its Δ down to that (norm_clip), and the
  /// group's ‖mean Δ‖ must stay within the mean of its members' norms so clipped.
  double delta_norm = std::numeric_limits<double>::quiet_NaN();
  friend bool operator==(const ReadyInfo& a, const ReadyInfo& b) {
    const auto tie = [](const ReadyInfo& r) {
      return std::tie(r.addresses, r.run_id, r.round, r.window, r.group, r.average_phi, r.phi_hash,
                      r.wait_for, r.behind, r.fresh);
    };
    const bool norms =
        a.delta_norm == b.delta_norm || (std::isnan(a.delta_norm) && std::isnan(b.delta_norm));
    return tie(a) == tie(b) && norms;
  }
};
/// The ready record's value (schema in matchmaking.cpp: the fields above in order); decoding is
/// bounded.
std::vector<std::uint8_t> encode_ready(const ReadyInfo& r);
transport::Result<ReadyInfo> decode_ready(std::span<const std::uint8_t> value);
/// The key of a window's ready records in bucket `bucket` of `buckets` (one bucket:
/// "grove/run/<run>/ready/<window>").
dht::Key ready_key(const std::string& run_id, std::uint64_t window, std::uint64_t bucket = 0,
                   std::uint64_t buckets = 1);
/// The number of buckets for a swarm of `swarm_size` members (see MatchOptions::bucket_members).
std::size_t bucket_count(std::size_t swarm_size, const MatchOptions& o);
/// The bucket `id` lands in for a window (buckets must be a power of two).
std::uint64_t bucket_of(const std::string& run_id, std::uint64_t window, const NodeId& id,
                        std::size_t buckets);

/// The groups of a window: deterministic in (run, window, set of ids). Members in hash order,
/// `group_size` at a time (0 = everyone in one group: DiLoCo's all-reduce); a remainder of at
/// least half a group (and two) is a group of its own, a smaller one is spread over the last
/// groups (so pairs leave one trio). With a bounded group size the hash order is first cut into
/// content-defined runs (after members whose hash ends in a byte ≡ 0 mod 8; 8 members on
/// average) grouped run by run, so that two readers whose sets differ by one member disagree on
/// one run only; each run of odd size has one trio.
std::vector<std::vector<NodeId>> make_groups(const std::string& run_id, std::uint64_t window,
                                             std::vector<NodeId> ids, std::size_t group_size = 2);

/// DiLoCo: the members (id, declared ‖Δ‖; NaN: none) of one round in a window that are left out
/// of its group because they declared no norm while others did, with the reason. The same for
/// every reader of the same records.
std::map<NodeId, std::string> undeclared_norms(
    const std::vector<std::pair<NodeId, double>>& members);
/// DiLoCo: the most a member's ‖Δ‖ may be in a group whose members declared `norms`:
/// kMaxNormToMedian × their median (the upper middle of an even count); NaN when none is finite.
/// A member above it scales its Δ down to it before the all-reduce.
double norm_clip(std::vector<double> norms);

/// The op id of a group's exchange in a window (the same on every member).
OpId group_op(const std::string& run_id, std::uint64_t window, std::vector<NodeId> group);

struct MatchResult {
  std::uint64_t window = 0;
  std::vector<NodeId> group;  ///< our group, ourselves included; size 1 = no partner
  std::map<NodeId, std::string> addresses;
  std::size_t ready_seen = 0;      ///< ready records of this window that passed the checks
  std::size_t ready_not_live = 0;  ///< records of this window left out: their owner seemed gone
  std::string note;                ///< why the group is of one, when it is
  std::uint64_t swarm_round = 0;   ///< the round most ready records name (average_phi: the highest)
  std::size_t at_swarm_round = 0;  ///< ready records at swarm_round (they will end it together)
  bool out_of_sync = false;        ///< same_round: our round is not the swarm round
  bool average_phi = false;        ///< same_round: the group averages φ too
  std::size_t wait_for = 0;        ///< same_round: the largest wait_for of the group's records
  bool behind = false;             ///< same_round: a record of the group says `behind`
  bool all_fresh = false;          ///< same_round: every record of the group says `fresh`
  /// same_round: we declared no ‖Δ‖ while other members of our round did: we are left out of
  /// the round (`note` says so)
  bool norm_excluded = false;
  /// same_round, mean Δ only: the norms the group's members declared (every member of the group
  /// has one; empty when not every member gave one, or the group averages φ).
  std::map<NodeId, double> delta_norms;
  /// The most a member's ‖Δ‖ may be in this group (norm_clip of delta_norms; NaN: no bound).
  double clip_norm = std::numeric_limits<double>::quiet_NaN();
  /// same_round: the members of our round this window left out for declaring no norm (not
  /// waited for: `wait_for` is already net of them).
  std::vector<NodeId> left_out;
  std::size_t buckets = 1;  ///< the window's ready records were spread over this many keys
  bool write_late = false;  ///< our ready record was not stored before the window closed
};

class Matchmaker {
 public:
  /// `run_id` must be valid (dht::valid_run_id; ConfigError otherwise).
  Matchmaker(dht::RecordStore& store, std::string run_id, MatchOptions opts);

  /// Only members for which this returns true are paired (the round engine passes over members
  /// seen leaving; a fresh ready record is itself evidence of life).
  void set_live_filter(std::function<bool(const NodeId&)> f) { live_ = std::move(f); }
  /// Changes MatchOptions::patience (the node sets it from its measured round time).
  void set_patience(Time t) { opts_.patience = t; }
  /// Whether another member is in a round of its own now (MatchOptions::busy_cap); asked when a
  /// window left us alone.
  void set_busy_probe(std::function<bool(Time)> f) { busy_ = std::move(f); }
  void set_busy_cap(Time t) { opts_.busy_cap = t; }
  /// The swarm's size as our view has it (sets the number of buckets of the next ready()).
  void set_swarm_size(std::size_t n) { swarm_size_ = n; }
  /// Declares us ready for `round` now; `done` runs once with the group (from on_timer or a DHT
  /// callback). A second ready() before the first finished replaces it.
  void ready(std::uint64_t round, std::vector<std::string> addresses, Time now,
             std::function<void(MatchResult)> done, bool average_phi = false,
             const std::array<std::uint8_t, 32>& phi_hash = {}, std::uint32_t wait_for = 0,
             bool behind = false, bool fresh = false,
             double delta_norm = std::numeric_limits<double>::quiet_NaN());
  bool busy() const { return state_ != State::idle; }
  /// When a ready() at `now` would read its window's records.
  Time read_time(Time now) const;
  /// How long before its window's close a ready record is written: MatchOptions::min_lead, or
  /// the time our recent ready writes took (lookup and stores; the third longest of the last
  /// eight, so that one stray slow write does not move it) when that is longer, at most
  /// max_lead. A record still on its way when the window closes is missed by some readers, who
  /// then group without it while the others pair with it: both pairs fail.
  Time lead() const;

  void on_timer(Time now);
  std::optional<Time> next_deadline() const;

 private:
  enum class State { idle, waiting, reading };
  void finish(MatchResult r);
  void on_read(std::uint64_t attempt, std::vector<dht::Record> records);
  void publish(Time now);
  void on_written(std::uint64_t window, Time started, Time close);

  dht::RecordStore& store_;
  std::string run_id_;
  MatchOptions opts_;
  std::function<bool(const NodeId&)> live_;
  std::function<bool(Time)> busy_;
  State state_ = State::idle;
  std::uint64_t attempt_ = 0;
  std::uint64_t round_ = 0, window_ = 0;
  std::size_t swarm_size_ = 0, buckets_ = 1;
  std::uint64_t bucket_ = 0;
  bool average_phi_ = false;
  std::array<std::uint8_t, 32> phi_hash_{};
  std::uint32_t wait_for_ = 0;
  bool behind_ = false, fresh_ = false;
  double delta_norm_ = std::numeric_limits<double>::quiet_NaN();
  Time read_at_{0}, give_up_at_{0}, first_read_{0};
  Time busy_seen_{Time::min()};   ///< the last read that left us alone while others were busy
  std::deque<Time> write_times_;  ///< the last ready writes' durations, newest last
  std::uint64_t written_window_ = 0, late_window_ = 0;  ///< windows whose write ended (late)
  std::vector<std::string> addresses_;
  std::function<void(MatchResult)> done_;
};

}  // namespace grove::gossip
