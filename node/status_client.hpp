// StatusClient: a client of a node's request servers (node/servers.hpp: "swarm_status",
// "request_mode") over the encrypted transport, with an identity of its own made for the purpose
// and the swarm key when one is set. What `grove-node status`, `request` and `top` talk through.
// Every call has a deadline; a node that does not answer is an error result, never a hang.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "node/cli.hpp"
#include "node/status.hpp"
#include "transport/crypto.hpp"
#include "transport/error.hpp"

namespace grove::node {

/// The node a client command asks: the first --peer, else the local node (its address in the
/// state dir's node.addr). Empty, with `why` set, when there is none.
std::string client_target(const CliOptions& o, std::string& why);

class StatusClient {
 public:
  explicit StatusClient(std::optional<transport::SwarmKey> key);
  ~StatusClient();
  StatusClient(const StatusClient&) = delete;
  StatusClient& operator=(const StatusClient&) = delete;

  /// One request; its answer's bytes, or why there are none (within `timeout`).
  transport::Result<std::vector<std::uint8_t>> call(const std::string& target,
                                                    const std::string& method,
                                                    const std::string& body,
                                                    std::chrono::milliseconds timeout);
  /// The swarm's members as `target` lists them (decoded and bounded: decode_status).
  transport::Result<std::vector<MemberStatus>> swarm_status(const std::string& target,
                                                            std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace grove::node
