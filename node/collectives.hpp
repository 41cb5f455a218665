// Collectives: the node's side of its trainer's per-step collectives (grove.all_sum,
// average_gradients, all_gather, barrier). The run's StepCalls (gossip/step_calls.hpp: the group
// of each call, and the call's ring operation) live on the gossip runtime from the node's start to
// its end, under the op id of the run's group; this driver
//   - keeps the group's candidates and their addresses from the run's member view (read on the
//     DHT strand before every call, and every few seconds while a call waits);
//   - starts the ring operation of each call on the gossip runtime and hands it back when done;
//   - runs one call for the trainer's thread (run(): it blocks that thread, which is the
//     trainer's, until the call ends, its deadline passes or the node stops);
//   - runs grove.send / grove.recv as a Transfer (gossip/transfer.hpp) with the member of that
//     rank in the last call's group. A transfer's op id names the run, both ends, the last call
//     and how many transfers the pair has made since, counted on both sides: every collective
//     starts the count afresh, so a transfer that failed on one side only misleads no later one.
// The deadline of a call is the trainer's, or else the node's: a floor and 3 × the bytes the call
// sends at the rate its earlier calls measured (gossip/op_deadline.hpp).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "dht/membership.hpp"
#include "dht/runtime.hpp"
#include "gossip/op_deadline.hpp"
#include "gossip/runtime.hpp"
#include "gossip/step_calls.hpp"

namespace grove::node {

struct CollectiveOutcome {
  bool ok = false;
  std::string why;  ///< when not ok, in words
  std::uint64_t call = 0;
  std::uint32_t rank = 0, size = 1;
  bool joined = false;   ///< the group has a member this one's previous call did not
  optim::Floats values;  ///< all_reduce: n values, all_gather: size × n, barrier: none
};

class Collectives {
 public:
  struct Options {
    gossip::StepCallsOptions calls;
    gossip::OpDeadlineOptions deadlines{gossip::Time(30'000), 3.0, 256.0 * 1024};
    std::chrono::milliseconds refresh{2000};  ///< a waiting call re-reads the member view
  };
  Collectives(std::shared_ptr<gossip::GossipRuntime> gossip, std::shared_ptr<dht::DhtRuntime> dht,
              std::shared_ptr<dht::Membership> members, gossip::NodeId self, std::string run,
              Options o);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  /// The run's group op id (a hash of the run's name).
  static gossip::OpId group_op(const std::string& run);

  /// Runs one call on `input` (barrier: empty) and returns its end; results go in pages of `out`
  /// (none: the heap). `timeout` 0: the node's deadline. Blocks the calling thread; never call
  /// it from a strand of the node's runtimes.
  CollectiveOutcome run(const gossip::CallSpec& spec, optim::Floats input,
                        optim::FloatAllocator out, std::chrono::milliseconds timeout,
                        const std::function<bool()>& stopping);

  /// grove.send (`sending`: `values` to rank `peer`) or grove.recv (values.size() values from
  /// rank `peer` into `values`), ranks those of the last collective's group. Blocks as run().
  CollectiveOutcome transfer(bool sending, std::uint32_t peer, optim::Floats values,
                             std::chrono::milliseconds timeout,
                             const std::function<bool()>& stopping);

  /// "deadline 75 s (…)" for a call of `spec` on n values among `members` members, for the logs.
  std::string describe_deadline(const gossip::CallSpec& spec, std::uint64_t n) const;

  struct Shared;

 private:
  std::uint64_t wire_bytes(const gossip::CallSpec& spec, std::uint64_t n) const;
  void refresh_members();
  CollectiveOutcome wait_for(std::uint64_t tag, gossip::Time limit,
                             const std::function<bool()>& stopping, const char* what);

  std::shared_ptr<Shared> sh_;
};

}  // namespace grove::node
