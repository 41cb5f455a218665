// StepGroup: who takes part in each call of a run's per-step collectives (the trainer's
// average_gradients, all_sum, all_gather, barrier; DeMo's steps), without a coordinator.
//
// Calls are numbered. The members of call k — its view V_k, ordered by node id (a member's rank
// is its position) — run the call's ring operation over V_k. The view changes only between calls,
// the same way on every member:
//  - Announce. The sequencer of call k, the smallest id of V_k, sends every other member of V_k,
//    when it begins call k, the view it proposes for call k+1: V_k and the joiners that asked it
//    to be admitted. A member begins call k+1 only with that announcement in hand (it waits up to
//    `announce_timeout`; it normally came long before, during call k).
//  - Survivors. The ring of the attempt that completed call k, R_k, is the same on every member
//    that completed it (RingOp). Then V_{k+1} = (announced ∩ R_k) ∪ (announced joiners) when the
//    sequencer is in R_k, and R_k when it is not (its announcement may have reached only some).
//  - Welcome. After call k the sequencer sends each joiner of V_{k+1} the final V_{k+1}; the
//    joiner's next call is call k+1 of the group.
//  - Leaving. A member whose call failed (excluded by the others, or too few left) leaves: it is
//    alone, and asks to join again from its next call.
//  - Joining. A node alone sends Join to the run's members it knows (set_candidates), again every
//    `join_retry`; members keep a request for `join_ttl`. A member of a group of two or more
//    admits any joiner. A node alone asks the others and admits only larger ids, and only once
//    none of the smaller ones it asks has admitted it for 2 × `join_wait` (dead ones among its
//    candidates; counted from its first call or last leaving, and from the last smaller id it
//    learnt of), so that nodes starting together end in one group: the smallest's. A node's first
//    call waits up to `join_wait` to be admitted (a joiner enters at the next call); after that it
//    calls alone (a group of one: its own tensors are the result) until it is admitted.
// Two groups of two or more that formed apart (a network split) do not merge.
//
// Sans-IO: a Protocol (its messages travel on the run's group op id) that the node's collective
// driver also calls with begin()/end() around each call's ring operation.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gossip/protocol.hpp"

namespace grove::gossip {

struct StepGroupOptions {
  Time announce_timeout{30'000};  ///< a member waits this long for the sequencer's announcement
  Time join_wait{3'000};          ///< a node's first call waits this long to be admitted
  Time join_retry{2'000};         ///< a node alone asks again this often
  Time join_ttl{30'000};          ///< a member forgets a join request after this long
  std::size_t max_members = 256;  ///< views larger than this are not formed (nor accepted)
};

/// The members of one call, in rank order.
struct CallView {
  std::uint64_t call = 0;
  std::vector<NodeId> members;
  std::size_t rank = 0;
};

class StepGroup final : public Protocol {
 public:
  StepGroup(OpId op, NodeId self, StepGroupOptions opts = {});

  /// The run's other members as the node knows them (its member view): whom a node alone asks.
  void set_candidates(std::vector<NodeId> ids, Time now);

  /// The trainer makes its next call. Returns the call's view when it can start now; none when
  /// it must wait (for an admission or the sequencer's announcement): call again after the next
  /// message or at wake_at(). A call that cannot start at all (the announcement did
  /// not come in time) fails: failed_begin() says why, and the node is alone again.
  std::optional<CallView> begin(Time now);
  bool waiting() const { return waiting_; }
  /// When a waiting begin() must look again even if no message comes (the end of its wait to be
  /// admitted, or for the announcement); none when not waiting. The driver's deadline, not the
  /// Protocol's: on_timer() does not act on it, begin() does.
  std::optional<Time> wake_at() const;
  /// Why the last begin() could not start its call (empty: it did or is still waiting).
  const std::string& failed_begin() const { return failed_begin_; }

  /// The call has ended: `ok` with the ring of the attempt that completed it (the survivors), or
  /// failed (this member is out of the group: it is alone now and asks to join again).
  void end(bool ok, std::vector<NodeId> survivors, Time now);

  const std::vector<NodeId>& view() const { return view_; }
  std::uint64_t next_call() const { return call_; }
  bool in_call() const { return in_call_; }

  // Protocol
  const OpId& op() const override { return op_; }
  void on_message(const NodeId& from, const Message& m, Time now) override;
  void on_peer_failed(const NodeId& peer, Time now) override;
  void on_timer(Time now) override;
  std::optional<Time> next_deadline() const override;
  std::vector<Outgoing> take_outgoing() override;
  bool finished() const override { return false; }  // lives as long as the node

 private:
  bool alone() const { return view_.size() == 1; }
  const NodeId& sequencer() const { return view_.front(); }
  void send(const NodeId& to, MsgKind kind, std::uint64_t call, const std::vector<NodeId>& ids);
  void ask(Time now);
  void leave(Time now);
  void expire(Time now);
  std::vector<NodeId> proposal(Time now) const;
  bool admits(const NodeId& joiner, Time now) const;
  void settle_view(const std::vector<NodeId>& announced);
  std::optional<CallView> start(Time now);

  OpId op_;
  NodeId self_;
  StepGroupOptions opts_;
  std::vector<NodeId> view_;  // sorted; the view of call_ once it is known
  std::uint64_t call_ = 1;    // the next call (or the one in progress)
  bool in_call_ = false;
  bool view_final_ = true;  // view_ is call_'s view (else: waiting for the announcement)
  bool waiting_ = false;
  bool rejoin_ = true;  // alone and not yet asked since (the first call, or after leaving)
  Time begun_{0};       // when the waiting begin() was first called
  Time join_until_{0};  // a node alone waits for an admission until then
  std::string failed_begin_;

  // Announcements: (call number, sender) → proposed view. Kept as they come (a sequencer may
  // announce before this member has begun the call before, or been welcomed); the one used is
  // the sequencer's of the call before. At most kMaxAnnounced (the latest calls go first).
  static constexpr std::size_t kMaxAnnounced = 16;
  std::map<std::pair<std::uint64_t, NodeId>, std::vector<NodeId>> announced_;
  std::vector<NodeId> prev_view_, survivors_;  // the last call's view and survivors, while
                                               // waiting for the announcement of the next
  std::map<NodeId, Time> pending_;             // join requests: asked at
  std::optional<std::pair<std::uint64_t, std::vector<NodeId>>> welcome_;
  std::vector<NodeId> candidates_;
  Time next_ask_{0};
  // When this node was last left alone, or made its first call (none before: the wait before it
  // admits smaller ids counts from then, not from the clock's zero).
  std::optional<Time> alone_since_;
  Time smaller_since_{0};  // when a smaller candidate last appeared
  std::vector<Outgoing> out_;
};

}  // namespace grove::gossip
