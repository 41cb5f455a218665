// Gossip wire messages: what the averaging cores (RingAllReduce, GroupExchange) send each other.
// One message = [u16 BE header length][msgpack header][raw payload]; the payload (encoded tensor
// values) stays out of msgpack so that a 1 MiB chunk is not copied through it. Header:
//   [version=2, kind, op (bin 16), tag (u64), phase, index, chunk, count, codec, extra]
//   chunk        index = segment or tensor, chunk = chunk number, count = values in the chunk;
//                payload = the values encoded with `codec`                      extra = nil
//   tensor_begin index = tensor, chunk = number of chunks, count = values      extra = nil
//   tensor_end   index = tensor                                               extra = digest
//                (BLAKE2b-256 of the tensor's whole encoding, chunks concatenated in order:
//                it follows the chunks, so a sender encodes a tensor as it streams it)
//   heartbeat / done                                                           extra = nil
//   abort        the sender's suspects                                          extra = [ids]
// `op` names one averaging operation (run, round, group); `tag` names the attempt (all-reduce:
// a hash of the suspect set, so a retry's messages never mix with the failed attempt's).
// Decoding is bounded (explicit unpack limits, counts, payload size) and never throws.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "optim/codecs.hpp"
#include "optim/outer.hpp"
#include "transport/bytes.hpp"
#include "transport/error.hpp"
#include "transport/identity.hpp"

namespace grove::gossip {

using transport::Bytes;
using transport::NodeId;
using OpId = std::array<std::uint8_t, 16>;
using Digest = std::array<std::uint8_t, 32>;

/// How tensor values travel. E3M0 needs chunks that are multiples of its 256-value block. topk
/// (SparseLoCo's per-chunk top-k, its parameters the run's) travels only in an all-gather
/// (gossip/allgather.hpp); the value codecs below refuse it.
enum class WireCodec : std::uint8_t { fp32 = 0, fp16 = 1, bf16 = 2, e3m0 = 3, topk = 4 };
const char* to_string(WireCodec c);
std::optional<WireCodec> parse_codec(std::string_view s);
std::size_t encoded_size(WireCodec c, std::size_t values);
optim::CodecError encode_values(WireCodec c, std::span<const float> in,
                                std::span<std::uint8_t> out);
optim::CodecError decode_values(WireCodec c, std::span<const std::uint8_t> in,
                                std::span<float> out);

enum class MsgKind : std::uint8_t {
  chunk = 1,
  tensor_begin,
  heartbeat,
  done,
  abort,
  tensor_end,
  join,      ///< StepGroup: a node alone asks to be admitted
  announce,  ///< StepGroup: the sequencer's view for call `count`
  welcome,   ///< StepGroup: a joiner's first call `count` and its view
};
enum class Phase : std::uint8_t { reduce_scatter = 0, all_gather = 1, tensor = 2 };
const char* to_string(MsgKind k);

struct Header {
  MsgKind kind = MsgKind::heartbeat;
  OpId op{};
  std::uint64_t tag = 0;
  Phase phase = Phase::tensor;
  std::uint32_t index = 0;
  std::uint32_t chunk = 0;
  std::uint64_t count = 0;
  WireCodec codec = WireCodec::fp32;
  Digest digest{};               ///< tensor_end
  std::vector<NodeId> suspects;  ///< abort
  std::vector<NodeId> view;      ///< announce, welcome (at most WireLimits::max_suspects)
};

struct WireLimits {
  std::size_t max_payload = 15u << 20;  ///< below the transport's 16 MiB frame limit
  std::size_t max_suspects = 256;
  std::uint64_t max_values = std::uint64_t{1} << 34;  ///< per tensor (64 GiB of fp32)
};

/// A decoded message: the header and a view of the payload inside the caller's bytes.
struct Message {
  Header h;
  std::span<const std::uint8_t> payload;
};

/// Builds a message with room for `payload_size` payload bytes; `payload` (if given) receives
/// the span to fill.
Bytes encode_message(const Header& h, std::size_t payload_size,
                     std::span<std::uint8_t>* payload = nullptr);
transport::Result<Message> decode_message(std::span<const std::uint8_t> bytes,
                                          const WireLimits& limits = {});

}  // namespace grove::gossip
