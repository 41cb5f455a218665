// The deadline of a round's averaging operation (exchange or all-reduce): from the bytes it will
// send and the rate this node's earlier operations sent at, with a floor and a margin. Nothing
// here caps the model size: a 8B-parameter exchange over a slow line gets the hours it needs,
// while a stall is caught by the cores' chunk timeout (silence), not by this backstop.
// Sans-IO: the engine feeds it finished operations and asks it for deadlines.
#pragma once

#include <cstdint>
#include <string>

#include "gossip/allgather.hpp"
#include "gossip/protocol.hpp"

namespace grove::gossip {

struct OpDeadlineOptions {
  Time floor{60'000};
  double margin = 3.0;
  /// Bytes per second taken before any operation has been measured, and the least ever taken
  /// (about 2 Mbit/s: a slow line is not a failure).
  double min_rate = 256.0 * 1024;
};

/// Bytes a member sends in a group exchange: every tensor to every partner.
std::uint64_t exchange_wire_bytes(WireCodec codec, std::uint64_t values_per_member,
                                  std::size_t partners);
/// Bytes a member sends in a ring all-reduce of `values` over `members`: 2 (N−1)/N of the
/// encoded tensor (reduce-scatter and all-gather).
std::uint64_t allreduce_wire_bytes(WireCodec codec, std::uint64_t values, std::size_t members);

/// Bytes a member sends in a ring all-gather of `values` over `members`: its own message and
/// every other member's but its successor's, (N−1) encoded messages.
std::uint64_t allgather_wire_bytes(const GatherCodec& codec, std::uint64_t values,
                                   std::size_t members);

class OpDeadlines {
 public:
  explicit OpDeadlines(OpDeadlineOptions o = {}) : o_(o) {}
  /// An operation that averaged: `bytes` sent in `took`.
  void observe(std::uint64_t bytes, Time took);
  /// A finished exchange or all-reduce that took `took`: the tensor bytes it moved (as
  /// deadline_for() counts them), when it averaged with somebody (one that lost every partner
  /// says nothing of the rate).
  void observe(const Protocol& op, Time took);
  /// Bytes per second: the measured rate (the mean of the last operations', recent ones
  /// weighing more), at least min_rate.
  double rate() const;
  bool measured() const { return measured_ > 0; }
  /// floor + margin × bytes / rate().
  Time deadline_for(std::uint64_t bytes) const;
  /// How long a peer may stay silent within an operation: margin × the time `bytes` (what
  /// arrives between two of its messages) take at the measured rate(), at least `floor` (just
  /// `floor` before a rate is measured). On links slower than the floor assumes, a stall timer
  /// must not fire between two messages. With `op_bytes` (the whole operation's), also at least
  /// a fifth of the time those take at the measured rate: the longer an operation runs, the more
  /// of a loaded machine's stalls it meets (a disk busy flushing, a neighbour parsing a state),
  /// and waiting longer for a peer that truly hung costs at most a fifth more of it.
  Time silence_for(std::uint64_t bytes, Time floor, std::uint64_t op_bytes = 0) const;
  /// "deadline 412 s (1.20 GB at 8.7 MB/s measured, ×3, floor 60 s)", for the logs.
  std::string describe(std::uint64_t bytes) const;

 private:
  OpDeadlineOptions o_;
  double measured_ = 0;  // bytes per second; 0: none yet
};

}  // namespace grove::gossip
