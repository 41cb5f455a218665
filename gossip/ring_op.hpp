// RingOp: the fault handling every ring operation of a group shares (RingAllReduce, RingAllGather),
// with the data plane left to the operation.
//
// Members sit in ring order (every member uses the same order); member i sends to i+1 and hears
// from i-1. Every member heartbeats its successor whenever it has sent nothing for `heartbeat`,
// so a member that hears nothing from its predecessor for `chunk_timeout` knows the predecessor
// itself is stuck (a member waiting on a stuck member keeps heartbeating, so blame does not
// spread down the ring). A member that suspects a peer (silence, failed send, lost connection,
// bad data) adds it to its suspect set, sends `abort` with the whole set to every member it does
// not suspect, and starts a new attempt over the ring without its suspects. Receivers merge the
// set and do the same, so the survivors converge on the union of all suspicions and redo the
// operation among themselves. An attempt is named by a hash of its suspect set (the tag);
// messages of other attempts are dropped, and an abort always reaches a peer before the sender's
// data of the new attempt (one ordered connection per peer). A member named in an abort it
// receives has been excluded: it fails (the node then re-syncs its state).
// Ending: a member that has its result sends `done` to every other member and finishes when it
// has the done of every member it has not lost (the usual case: one message delay), or `linger`
// after completing. A member that has completed never starts a retry itself (it has all it
// needs); it joins one when an abort from a member still waiting arrives.
// The op fails after `total_timeout`, and, in a group of three or more, when the members left are
// no longer a strict majority of the group (alone: more likely its own links failed than
// everyone else's; half or less: the others may be ending the round among themselves, and two
// halves must never both end it, each with its own slow weights).
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gossip/protocol.hpp"

namespace grove::gossip {

struct RingTimers {
  Time heartbeat{1000};
  Time chunk_timeout{10000};
  Time start_grace{0};  ///< added to chunk_timeout before the predecessor was first heard
  Time linger{12000};
  Time total_timeout{300000};
};

struct RingStats {
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint32_t attempts = 1;
};

class RingOp : public Protocol {
 public:
  const OpId& op() const override { return op_; }
  void on_message(const NodeId& from, const Message& m, Time now) override;
  void on_peer_failed(const NodeId& peer, Time now) override;
  void on_delivered(const NodeId& to, Time now) override;
  void on_timer(Time now) override;
  std::optional<Time> next_deadline() const override;
  std::vector<Outgoing> take_outgoing() override;
  bool finished() const override { return status_ != OpStatus::running; }

  OpStatus status() const { return status_; }
  /// The ring of the attempt that completed (or is running).
  const std::vector<NodeId>& members() const { return ring_; }
  const std::set<NodeId>& suspects() const { return suspects_; }
  const std::string& failure() const { return failure_; }
  const RingStats& stats() const { return stats_; }

 protected:
  /// `ring` was checked by check_group(). The subclass calls begin() at the end of its own
  /// constructor (the first attempt calls its hooks).
  RingOp(const char* name, OpId op, NodeId self, std::vector<NodeId> ring, WireCodec codec,
         RingTimers timers, Time now);
  void begin(Time now) { start_attempt(now); }

  /// A new attempt over ring_ (me_, succ(), pred() set; at least two members): forget the data
  /// of the last attempt and start sending. May call complete() or fail().
  virtual void start_data(Time now) = 0;
  /// Left alone out of a pair (the partner died): the result is this member's own.
  virtual void alone(Time now) = 0;
  /// A chunk of the current attempt from a ring member.
  virtual void on_data(const NodeId& from, const Message& m, Time now) = 0;
  /// A message to the successor has left.
  virtual void on_succ_delivered(Time now) { (void)now; }

  const NodeId& succ() const { return ring_[(me_ + 1) % ring_.size()]; }
  const NodeId& pred() const { return ring_[(me_ + ring_.size() - 1) % ring_.size()]; }
  Header header(MsgKind k) const;
  void send(const NodeId& to, Bytes b, Time now);
  /// This member has its result: tells the others, and is done once they are (or after linger).
  void complete(Time now);
  void fail(std::string why);
  /// A ring member sent data it should not have: suspected (a new attempt without it).
  void bad_data(const NodeId& from, const char* why, Time now);
  void count_received(std::size_t bytes) { stats_.bytes_received += bytes; }

  NodeId self_;
  std::vector<NodeId> ring_;  // this attempt's members, in ring order
  std::size_t me_ = 0;
  std::size_t in_flight_succ_ = 0;  // messages to the successor not yet left

 private:
  void start_attempt(Time now);
  void suspect(const std::set<NodeId>& ids, Time now, const char* why);
  void maybe_done();
  static bool has(const std::vector<NodeId>& sorted, const NodeId& id) {
    return std::binary_search(sorted.begin(), sorted.end(), id);
  }
  void settle(const NodeId& id) {
    if (!done_from_.contains(id) && !lost_.contains(id)) ++settled_;
  }
  Time silence_bound() const {
    return timers_.chunk_timeout +
           (heard_pred_ || stats_.attempts > 1 ? Time(0) : timers_.start_grace);
  }

  const char* name_;
  OpId op_;
  std::vector<NodeId> original_;
  WireCodec codec_;
  RingTimers timers_;
  Time started_;
  std::set<NodeId> suspects_;
  std::uint64_t tag_ = 0;
  std::set<NodeId> done_from_, lost_;
  std::size_t settled_ = 0;  // ring members (not us) in done_from_ or lost_
  // Sorted copies for membership tests (a message's sender is checked in O(log N)).
  std::vector<NodeId> original_sorted_, ring_sorted_;
  bool complete_ = false;
  Time completed_at_{0};
  Time last_heard_pred_{0};
  bool heard_pred_ = false;  // the predecessor has sent anything (any attempt)
  Time last_sent_succ_{0};
  OpStatus status_ = OpStatus::running;
  std::string failure_;
  RingStats stats_;
  std::vector<Outgoing> out_;
};

}  // namespace grove::gossip
