// StepCalls: one node's per-step collective calls (the trainer's all_sum, average_gradients,
// all_gather, barrier), one at a time: the StepGroup gives each call its members, the call runs
// as a ring operation among them (RingAllReduce for sums and means, RingAllGather's
// concatenation for all_gather, a one-value all-reduce for a barrier), and its end tells the
// group who survived.
//
// Sans-IO. StepCalls is the Protocol of the run's group (it owns the StepGroup; its messages are
// the group's, on the group's op id) and lives as long as the node. The driver runs it like any
// operation, and also runs the ring operations it hands out (take_op) and hands them back when
// they finish; after each call into it (a message, a timer, submit, a finished operation) the
// driver takes its next operation and its result, and sends what it has to send.
//
// A call's operation id is a hash of the run, the call number, its members and what the call is
// (kind, options, size), so that members that disagree on a call's view, or make different calls
// under one number, never mix their data. Every call has a deadline (the caller's):
// waiting for the group and the ring operation's total time both end there. A barrier with
// `min_size` repeats (a new call every `barrier_retry`) until the group has that many members.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "gossip/ring_op.hpp"
#include "gossip/step_group.hpp"
#include "optim/floats.hpp"

namespace grove::gossip {

struct CallSpec {
  enum class Kind : std::uint8_t { all_reduce, all_gather, barrier };
  Kind kind = Kind::barrier;
  bool mean = false;                 ///< all_reduce: the mean, else the sum
  WireCodec wire = WireCodec::fp32;  ///< all_reduce: fp32 or fp16
  std::uint32_t min_size = 0;        ///< barrier: until the group has this many members
};

struct StepCallsOptions {
  StepGroupOptions group;
  RingTimers timers;
  std::size_t chunk_values = std::size_t{1} << 18;
  Time barrier_retry{200};
  optim::FloatAllocator alloc;
};

struct CallResult {
  bool ok = false;
  std::string why;  ///< when not ok
  std::uint64_t call = 0;
  std::uint32_t rank = 0, size = 1;
  /// The group has a member that this member's previous call did not (a joiner; for a joiner:
  /// its first call with others): a per-step run's trainers then align their weights.
  bool joined = false;
  optim::Floats values;  ///< all_reduce: n values; all_gather: size × n; barrier: none
};

class StepCalls final : public Protocol {
 public:
  /// `group_op`: the run's group (the same on every member, e.g. a hash of the run's name).
  StepCalls(std::string run, OpId group_op, NodeId self, StepCallsOptions opts = {});

  /// The run's other members as the node knows them (whom a node alone asks to join).
  void set_candidates(std::vector<NodeId> ids, Time now) { group_.set_candidates(ids, now); }
  const StepGroup& group() const { return group_; }

  /// The trainer's next call on `input` (barrier: empty), to end by `deadline`. Results are
  /// written in pages of `out` (a view of the trainer's shared memory; none: the heap). One at a
  /// time: a call while another is in progress fails at once.
  void submit(CallSpec spec, optim::Floats input, Time deadline, Time now,
              optim::FloatAllocator out = {});
  bool busy() const { return state_ != State::idle; }
  /// The members of the last call that completed (rank order), for point-to-point transfers.
  const std::vector<NodeId>& last_members() const { return last_members_; }
  /// The number of the last call that completed (0: none yet).
  std::uint64_t last_call() const { return last_call_; }

  /// The ring operation to run now (at most one at a time).
  std::unique_ptr<Protocol> take_op();
  /// The operation handed out has finished.
  void on_op_finished(std::unique_ptr<Protocol> p, Time now);
  /// The call's end, once.
  std::optional<CallResult> take_result();

  // Protocol (the group's messages; a waiting call tries to begin after each of them)
  const OpId& op() const override { return group_.op(); }
  void on_message(const NodeId& from, const Message& m, Time now) override;
  void on_peer_failed(const NodeId& peer, Time now) override;
  void on_timer(Time now) override;
  std::optional<Time> next_deadline() const override;
  std::vector<Outgoing> take_outgoing() override { return group_.take_outgoing(); }
  bool finished() const override { return false; }
  bool ordered() const override { return false; }  // join, announce, welcome stand alone

  /// The operation id of call `call` among `members`, for a call of `spec` on n values.
  static OpId call_op(const std::string& run, std::uint64_t call,
                      const std::vector<NodeId>& members, const CallSpec& spec, std::uint64_t n);

 private:
  enum class State { idle, waiting, running, retry };
  void try_begin(Time now);
  void finish(bool ok, std::string why, Time now);

  std::string run_;
  NodeId self_;
  StepCallsOptions opts_;
  StepGroup group_;
  State state_ = State::idle;
  CallSpec spec_;
  optim::Floats input_;
  optim::FloatAllocator out_;
  std::size_t n_ = 0;
  Time deadline_{0}, retry_at_{0};
  std::unique_ptr<Protocol> op_;  // made, not yet taken
  CallView view_;
  std::vector<NodeId> last_members_;
  std::uint64_t last_call_ = 0;
  std::optional<CallResult> result_;
};

}  // namespace grove::gossip
