// Node: one grove-node process. It assembles the network stack (Host, DhtRuntime, GossipRuntime,
// the run's Membership and RoundRuntime), finds or creates the run, and drives the training loop
// that owns the workload.
//
// Threads: one io thread runs the Host strand (sessions, the DHT and the round engine riding on
// it); the transport worker pool encrypts and runs the gossip cores; the thread that calls run()
// trains. Hand-offs: θ goes to the round engine by value (submit), reports come back through a
// queue the training thread waits on (with a deadline), and the new slow weights are copied out
// on the DHT strand.
//
// Start-up:
//   --bootstrap     a new RunConfig (fresh nonce) is published under dht key "grove-runs",
//                   subkey = run name; the node starts round 0 from the workload's initial θ.
//   --peer / LAN    the DHT is bootstrapped; the run config is read from "grove-runs" (checked
//                   against its content-addressed name); the state is downloaded (state sync).
//   a checkpoint    in --state-dir resumes its run: it rejoins through the swarm (state sync)
//                   and falls back to the checkpoint's own state when no member has a newer one.
// Stop (SIGINT/SIGTERM or --max-steps): the round in flight gets up to its deadline, the member
// record says "leaving", a checkpoint is written, run() returns 0.
#pragma once

#include <atomic>
#include <memory>

#include "node/cli.hpp"

namespace grove::node {

class Node {
 public:
  /// Throws transport::ConfigError for start-up problems (bad key file, unusable state dir,
  /// unknown run, no reachable peer).
  explicit Node(CliOptions opts);
  ~Node();
  /// Trains until stopped; returns the process exit code.
  int run();
  /// Asks run() to stop at the next step boundary (thread-safe).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace grove::node
