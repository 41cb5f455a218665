// The node's request servers on its Host: "status" (this node), "swarm_status" (every live member
// of the run, asked in parallel, 3 s each; one that does not answer is listed from its member
// record) and "request_mode" (the node signs a DiLoCo/NoLoCo switch record for a client that is
// not a member). StatusBoard is what "status" answers: written by the training thread, read on
// the host strand.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>

#include "dht/membership.hpp"
#include "gossip/round_runtime.hpp"
#include "node/status.hpp"
#include "transport/host.hpp"

namespace grove::node {

/// This node's MemberStatus, thread-safe.
class StatusBoard {
 public:
  explicit StatusBoard(std::string node);
  void update(const std::function<void(MemberStatus&)>& fn);
  /// A checkpoint is being written (in the background): a member "training" reads as
  /// "checkpointing" meanwhile.
  void set_checkpointing(bool on);
  /// With the uptime as of now.
  MemberStatus read() const;

 private:
  mutable std::mutex mu_;
  MemberStatus me_;
  bool checkpointing_ = false;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

/// What the servers use once the run's stack exists (set on the host strand by attach(); until
/// then "swarm_status" lists this node only and "request_mode" is refused).
struct ServedStack {
  std::shared_ptr<dht::Membership> members;
  std::shared_ptr<gossip::RoundRuntime> round;
  std::function<std::string()> address;  ///< the address we advertise first (host strand)
};

class Servers {
 public:
  /// Registers the handlers (before host->start()).
  Servers(std::shared_ptr<transport::Host> host, std::shared_ptr<const StatusBoard> board);
  /// Host strand only.
  void attach(ServedStack s) { *stack_ = std::move(s); }

 private:
  /// This node's status with the address it advertises (host strand).
  /// Its bytes are the host's: every byte its sessions sent and received (live, all traffic).
  static MemberStatus self(const StatusBoard& board, const ServedStack& stack,
                           const transport::Host& host);
  void serve_status();
  void serve_requests();
  std::shared_ptr<transport::Host> host_;
  std::shared_ptr<const StatusBoard> board_;
  std::shared_ptr<ServedStack> stack_ = std::make_shared<ServedStack>();  // host strand
};

}  // namespace grove::node
