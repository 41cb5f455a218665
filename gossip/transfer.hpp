// Transfer: one tensor from a sender to a receiver (grove.send / grove.recv), streamed in chunks.
//
//   receiver → sender   heartbeat          "ready": the receiver has begun (the sender streams
//                                          only then, so a tensor never waits in the driver's
//                                          buffer for an op that has not started), and again
//                                          every `heartbeat` while it waits for data
//   sender → receiver   tensor_begin       count = values, chunk = chunks
//                       chunk …            fp32 values, `window` chunks ahead of deliveries
//                       tensor_end         digest: BLAKE2b-256 of the chunks' payloads in order
//   receiver → sender   done               all values in place and the digest matched
//                       abort              refused (another size than it expects, bad data)
// The receiver writes the values straight into its output (a view of its trainer's memory) and
// the sender reads them straight from its input; nothing else holds a copy. Either side fails on
// the other's failure or abort, on `chunk_timeout` of silence once the stream has begun (the
// sender: no delivery; the receiver: no chunk) and at `total_timeout` (which covers the wait for
// the other side to call). Sans-IO.
#pragma once

#include <string>

#include "gossip/protocol.hpp"
#include "optim/floats.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

struct TransferOptions {
  std::size_t chunk_values = std::size_t{1} << 18;
  std::size_t window = 16;
  Time heartbeat{1000};
  Time chunk_timeout{10000};
  Time total_timeout{300000};
};

class Transfer final : public Protocol {
 public:
  /// The sending side: `input` goes to `peer`.
  static std::unique_ptr<Transfer> send(OpId op, NodeId peer, optim::Floats input,
                                        TransferOptions o, Time now);
  /// The receiving side: `out.size()` values from `peer` into `out`.
  static std::unique_ptr<Transfer> receive(OpId op, NodeId peer, optim::Floats out,
                                           TransferOptions o, Time now);

  const OpId& op() const override { return op_; }
  void on_message(const NodeId& from, const Message& m, Time now) override;
  void on_peer_failed(const NodeId& peer, Time now) override;
  void on_delivered(const NodeId& to, Time now) override;
  void on_timer(Time now) override;
  std::optional<Time> next_deadline() const override;
  std::vector<Outgoing> take_outgoing() override { return std::exchange(out_, {}); }
  bool finished() const override { return status_ != OpStatus::running; }

  OpStatus status() const { return status_; }
  const std::string& failure() const { return failure_; }
  /// The receiver's values (when done).
  optim::Floats take_result() { return std::move(values_); }
  std::uint64_t bytes() const { return bytes_; }

 private:
  Transfer(bool sending, OpId op, NodeId peer, optim::Floats values, TransferOptions o, Time now);
  std::size_t chunks() const { return (n_ + o_.chunk_values - 1) / o_.chunk_values; }
  void post(MsgKind kind, std::uint64_t count = 0, std::uint32_t chunk = 0);
  void fill(Time now);
  void fail(std::string why);
  void finish();

  bool sending_;
  OpId op_;
  NodeId peer_;
  optim::Floats values_;
  TransferOptions o_;
  std::size_t n_;
  OpStatus status_ = OpStatus::running;
  std::string failure_;
  std::vector<Outgoing> out_;
  Time end_at_, heard_at_, said_at_;
  bool started_ = false;  // sender: the receiver is ready; receiver: tensor_begin came
  std::size_t next_ = 0, in_flight_ = 0, got_ = 0;
  bool end_sent_ = false;
  transport::Blake2b256 digest_;
  std::uint64_t bytes_ = 0;
};

}  // namespace grove::gossip
