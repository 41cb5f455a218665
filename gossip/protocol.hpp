// The seam between the averaging cores and their drivers. A Protocol is a sans-IO state machine
// for one averaging operation (one all-reduce, one group exchange): it takes decoded messages,
// send failures and the current time, and hands back messages to send and its next deadline. It
// owns no socket, reads no clock and draws no random numbers. A driver calls on_delivered() when
// each message it took has left (cores that stream a tensor wait for it). Drivers: gossip::Runtime
// (Asio, transport::Host) and sim::GossipNetwork (virtual time); tests drive it by hand.
#pragma once

#include <optional>
#include <vector>

#include "dht/record.hpp"
#include "gossip/wire.hpp"
#include "transport/error.hpp"

namespace grove::gossip {

using dht::Time;

enum class OpStatus { running, done, failed };
const char* to_string(OpStatus s);

struct Outgoing {
  NodeId to{};
  Bytes data;
};

class Protocol {
 public:
  virtual ~Protocol() = default;
  virtual const OpId& op() const = 0;
  /// A message for this op (the driver routes by Header::op) from an authenticated peer.
  virtual void on_message(const NodeId& from, const Message& m, Time now) = 0;
  /// A message to `to` could not be delivered, or the connection to it was lost.
  virtual void on_peer_failed(const NodeId& to, Time now) = 0;
  /// A message to `to` has left (the driver's stream for it completed). Cores that make a
  /// model-sized sequence of messages make them a window at a time, on these calls, so that only
  /// the window is ever encoded and queued, not the model.
  virtual void on_delivered(const NodeId& to, Time now) {
    (void)to;
    (void)now;
  }
  virtual void on_timer(Time now) = 0;
  virtual std::optional<Time> next_deadline() const = 0;
  virtual std::vector<Outgoing> take_outgoing() = 0;
  /// True once the operation has its final outcome (done or failed); nothing more is sent.
  virtual bool finished() const = 0;
  /// Whether this op's messages from one peer must arrive in the order they were sent (a
  /// streamed tensor's chunks, an abort before the retry's data). An op that lives as long as the
  /// node and whose messages stand alone (a run's step group) says no: the driver then hands each
  /// message over as it arrives, and a failed message to a peer does not end the op's link to it.
  virtual bool ordered() const { return true; }
};

/// An operation's member list as its cores require it (it comes from peers' ready records):
/// contains `self`, names nobody twice. The reason names the operation (`what`).
transport::Result<void> check_group(const std::vector<NodeId>& group, const NodeId& self,
                                    const char* what);

}  // namespace grove::gossip
