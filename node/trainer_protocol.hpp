// The trainer link's messages: grove-node --workload external and the user's training process
// (the Python package in node/python/grove) on the same machine, over a Unix socket.
//
// Each message is one msgpack map with an "op" key, framed as [u32 big-endian length][body]
// (at most kMaxTrainerFrame bytes). The parameters themselves never cross the socket: they sit in
// a shared-memory segment of the node (float32, the tensors in the order of the hello, each
// flattened), which the trainer maps.
//
//   trainer → node   hello   {version, tensors: [[name, [dims…], dtype]…], outer, inner_steps,
//                             outer_lr, outer_momentum, outer_warmup, noloco_alpha, noloco_beta,
//                             noloco_gamma, noloco_group, noloco_lookahead,
//                             noloco_nesterov, noloco_warmup, overlap,
//                             pid}  (the algorithm fields are used only to create a run)
//                    step    {loss, tokens, eval_loss}  one call of the trainer's step(); it then
//                                                       waits for "go"
//                    stored  {}                         the parameters are in shared memory
//                    saved   {why}                      its own state is in state_file (why:
//                                                       empty, or why it could not be saved)
//                    collective {kind, mean, wire, n, peer, timeout, min_size}
//                                                       a per-step collective over the swarm
//                                                       (grove.all_sum, average_gradients, …) on
//                                                       the n values at the start of the
//                                                       collective segment; answered by "done"
//                    buffer  {bytes}                    make the collective segment this large
//   node → trainer   welcome {shm, bytes, run, outer, inner_steps, state_file}
//                                                       state_file: where the trainer keeps its
//                                                       own state (the inner optimiser's, its
//                                                       data position); it restores it from
//                                                       there when the file is of this run
//                    refused {why}                      the trainer's model is not the run's
//                    store   {}                         put the parameters in shared memory
//                    save    {}                         save your own state in state_file (the
//                                                       node wrote a checkpoint), answer "saved"
//                    go      {load}                     go on (after loading the parameters from
//                                                       shared memory when load is true)
//                    bye     {why}                      the node is leaving
//                    done    {ok, why, call, rank, size, n, at, joined}
//                                                       a collective's end: its n result values
//                                                       are at value `at` of the collective
//                                                       segment (after the call's input); rank
//                                                       and size in the call's group; joined:
//                                                       it has a member this one's previous
//                                                       call did not
//                    segment {shm, bytes}               the collective segment (after "buffer",
//                                                       or when a result needed it larger)
//
// Decoding is bounded (frame size, map and array sizes, string lengths, tensor dimensions, the
// model's size) and never executes or evaluates anything: names are only compared.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "node/config.hpp"
#include "transport/error.hpp"

namespace grove::node {

inline constexpr std::uint32_t kTrainerProtocol = 1;
inline constexpr std::size_t kMaxTrainerFrame = 8u << 20;
inline constexpr std::size_t kMaxTensors = 100'000;
inline constexpr std::size_t kMaxTensorName = 256;
inline constexpr std::size_t kMaxTensorDims = 8;
inline constexpr std::uint64_t kMaxModelParams = 1ull << 36;

struct TensorSpec {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::string dtype;  ///< float32, float16, bfloat16 or float64
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

struct ModelSpec {
  std::vector<TensorSpec> tensors;
  std::uint64_t params() const;
  /// BLAKE2b-256 of the canonical msgpack [[name, [dims…], dtype]…], 64 hex digits.
  std::string hash_hex() const;
  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

struct TrainerHello {
  std::uint32_t version = 0;
  ModelSpec model;
  std::optional<std::string> outer;  ///< noloco, diloco or sparseloco (RunConfig::set_outer)
  std::uint32_t inner_steps = 0;     ///< 0: not given
  std::optional<float> outer_lr, outer_momentum, noloco_alpha, noloco_beta, noloco_gamma;
  std::optional<float> noloco_lookahead;
  /// DiLoCo's outer warm-up in rounds, NoLoCo's group size, rule (0 paper, 1 nesterov) and
  /// warm-up (none: not given).
  std::optional<std::uint32_t> outer_warmup, noloco_group, noloco_nesterov, noloco_warmup;
  /// Rounds overlapped with the next inner steps (RunConfig::overlap; none: not given).
  std::optional<std::uint32_t> overlap;
  std::optional<WireCodec> codec;
  /// SparseLoCo's numbers (RunConfig); 0 / none: not given.
  std::uint32_t topk = 0, topk_chunk = 0, topk_bits = 0;
  std::uint32_t fragments = 0;  ///< streaming fragments (0: not given)
  std::optional<float> error_decay;
  std::uint64_t pid = 0;
  friend bool operator==(const TrainerHello&, const TrainerHello&) = default;
};
struct TrainerStep {
  double loss = NAN;
  std::uint64_t tokens = 0;
  double eval_loss = NAN;
};
struct TrainerStored {};
struct TrainerSaved {
  std::string why;  ///< empty: saved
};
/// A per-step collective (the trainer waits for its "done").
enum class CollectiveKind : std::uint8_t { all_reduce, all_gather, barrier, send, recv };
const char* to_string(CollectiveKind k);
inline constexpr std::uint32_t kMaxGroup = 256;  ///< members of a collective's group
struct TrainerCollective {
  CollectiveKind kind = CollectiveKind::barrier;
  bool mean = false;                 ///< all_reduce: the mean (average_gradients), else the sum
  WireCodec wire = WireCodec::fp32;  ///< all_reduce: fp32 or fp16 on the wire
  std::uint64_t n = 0;               ///< values in (recv: expected), at most kMaxModelParams
  std::uint32_t peer = 0;            ///< send/recv: the other's rank, < kMaxGroup
  double timeout_s = 0;              ///< 0: the node's deadline (from the bytes); at most a day
  std::uint32_t min_size = 0;        ///< barrier: wait until the group has this many members
  friend bool operator==(const TrainerCollective&, const TrainerCollective&) = default;
};
struct TrainerBuffer {
  std::uint64_t bytes = 0;  ///< at most 4 × kMaxModelParams × kMaxGroup
  friend bool operator==(const TrainerBuffer&, const TrainerBuffer&) = default;
};
using TrainerMessage = std::variant<TrainerHello, TrainerStep, TrainerStored, TrainerSaved,
                                    TrainerCollective, TrainerBuffer>;

/// A trainer's message, or errc::malformed with the reason.
transport::Result<TrainerMessage> decode_trainer_message(std::span<const std::uint8_t> body);
std::vector<std::uint8_t> encode_trainer_message(const TrainerMessage& m);

/// The run's algorithm fields taken from a hello (at bootstrap): what the trainer chose, on top
/// of the command line's config.
void apply_hello(const TrainerHello& h, RunConfig& c);
/// Empty when a trainer with this hello may train in run `c`; otherwise why not, in words.
std::string check_hello(const TrainerHello& h, const RunConfig& c);

// Node → trainer.
std::vector<std::uint8_t> encode_welcome(const std::string& shm, std::uint64_t bytes,
                                         const std::string& run, const RunConfig& c,
                                         const std::string& state_file);
std::vector<std::uint8_t> encode_refused(const std::string& why);
std::vector<std::uint8_t> encode_store();
std::vector<std::uint8_t> encode_save();
/// Go on training; with `load`, after taking θ from shared memory — the values [lo, hi) of it
/// when given (a round of one streaming fragment: the rest is the trainer's θ already).
std::vector<std::uint8_t> encode_go(bool load, std::size_t lo = 0,
                                    std::optional<std::size_t> hi = std::nullopt);
std::vector<std::uint8_t> encode_bye(const std::string& why);
/// A collective's end: `n` result values at value `at` of the collective segment (when ok).
std::vector<std::uint8_t> encode_collective_done(bool ok, const std::string& why,
                                                 std::uint64_t call, std::uint32_t rank,
                                                 std::uint32_t size, std::uint64_t n,
                                                 std::uint64_t at, bool joined = false);
std::vector<std::uint8_t> encode_segment(const std::string& shm, std::uint64_t bytes);

}  // namespace grove::node
