// RunConfig: what every member of a run must agree on, fixed at --bootstrap and never changed.
// It travels as a canonical text (one "key value" line per field, in a fixed order, after the
// line "grove-run v1"); the run's name is the workload followed by the first 12 hex digits of
// the BLAKE2b-256 of that text, so a joiner that reads the config from the DHT checks it against
// the name it joins (content addressing). The text names a workload and its numbers only: no
// code ever comes from a peer.
//
// Parsing is strict and bounded: at most kMaxConfigText bytes, only known keys, each exactly
// once, every value range-checked, and the text must be canonical (re-emitting it gives the same
// bytes), so one config has exactly one name.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gossip/mode.hpp"
#include "gossip/wire.hpp"
#include "optim/outer.hpp"
#include "transport/error.hpp"

namespace grove::node {

constexpr std::size_t kMaxConfigText = 4096;

enum class WorkloadKind { gpt, mlp, external };
// The outer algorithm and the wire codec are the round engine's own types (gossip/mode.hpp,
// gossip/wire.hpp), with their names and parsers.
using gossip::OuterMode;
using gossip::parse_codec;
using gossip::parse_mode;
using gossip::to_string;
using gossip::WireCodec;
enum class DataKind { synthetic, files };

const char* to_string(WorkloadKind w);
const char* to_string(DataKind d);
std::optional<WorkloadKind> parse_workload(std::string_view s);

struct RunConfig {
  WorkloadKind workload = WorkloadKind::gpt;
  std::string model = "small";  ///< a size preset of the workload (see workload.hpp)
  /// An external workload's model (the trainer's, node/trainer_protocol.hpp): its parameter count,
  /// tensor count and the BLAKE2b-256 of its spec (names, shapes, dtypes). 0, 0, "-" otherwise.
  std::uint64_t model_params = 0;
  std::uint32_t model_tensors = 0;
  std::string model_spec = "-";
  std::uint64_t seed = 1;  ///< model initialisation, synthetic corpus, evaluation windows
  std::string nonce = "0000000000000000";  ///< 16 hex digits drawn at bootstrap: runs differ
  // Inner optimisation (AdamW, linear warm-up then cosine decay to lr_min_ratio × lr).
  std::uint32_t inner_steps = 50;  ///< H: inner steps per outer round
  std::uint32_t batch = 16;
  std::uint32_t seq_len = 128;
  float lr = 1e-3f;
  std::uint32_t warmup = 100;
  std::uint32_t schedule_steps = 20000;  ///< the cosine's horizon in inner steps
  float lr_min_ratio = 0.1f;
  float weight_decay = 0.1f;
  float beta1 = 0.9f, beta2 = 0.95f;
  float clip = 1.0f;  ///< gradient-norm clipping (0: off)
  // Outer optimisation.
  OuterMode outer = OuterMode::noloco;
  float outer_lr = 0.7f;        ///< DiLoCo's Nesterov learning rate
  float outer_momentum = 0.9f;  ///< DiLoCo's Nesterov momentum
  /// DiLoCo's outer warm-up (optim::DiLoCoConfig::warmup): over the first outer_warmup rounds
  /// the step ramps from plain averaging (lr 1, no momentum) to outer_lr and outer_momentum
  /// (docs/ALGORITHMS.md: the paper's step from the first round overshoots on short runs from
  /// scratch; 0: the paper's).
  std::uint32_t outer_warmup = 10;
  /// NoLoCo's numbers: grove-node's default rule (optim::kNoLoCoGrove; --noloco-variant paper
  /// for the paper's).
  float noloco_alpha = optim::kNoLoCoGrove.alpha, noloco_beta = optim::kNoLoCoGrove.beta,
        noloco_gamma = optim::kNoLoCoGrove.gamma;
  /// NoLoCo's group size (2: pairs, the paper's) and look-ahead (each inner phase starts from
  /// φ + noloco_lookahead × m; 0: from φ, the paper's).
  std::uint32_t noloco_group = 2;
  float noloco_lookahead = 0.0f;
  /// NoLoCo's rule (optim::NoLoCoConfig::nesterov): 0 the paper's (the consensus term inside
  /// the momentum), 1 grove-node's (the group averages its members' Nesterov proposals and
  /// momenta); and its warm-up in rounds, as outer_warmup (0: none).
  std::uint32_t noloco_nesterov = optim::kNoLoCoGrove.nesterov ? 1 : 0;
  std::uint32_t noloco_warmup = optim::kNoLoCoGrove.warmup;
  WireCodec codec = WireCodec::fp16;
  /// SparseLoCo (outer "sparseloco"): DiLoCo-mode rounds whose members each send the top-k of an
  /// error buffer (gossip/step_work.hpp, CompressedRounds), stepped with outer_lr and
  /// outer_momentum (SparseLoCo's own: 1.0 and 0). Per chunk of topk_chunk values (a power of
  /// two) the topk largest, their values in topk_bits bits (32, or 2: a scale and ±0.5/1.5 of
  /// it); the error buffer decays by error_decay (β_e) each round.
  bool sparseloco = false;
  /// A per-step run (outer "none"): no outer rounds at all; the trainers synchronise themselves
  /// every step with collectives (grove.average_gradients, DeMo's exchange). External workloads
  /// only. The node still keeps the run's membership, state sync for joiners (the run's initial
  /// θ: a joining trainer takes the group's weights with grove.sync_parameters) and the step
  /// group of the collectives.
  bool per_step = false;
  /// DeMo (outer "demo", built-in workloads; a per-step run): every inner step each member adds
  /// its gradient to a momentum δ (δ ← demo_decay·δ + lr·g), the group all-gathers each
  /// member's demo_topk largest DCT coefficients of δ per block (a dimension's block side its
  /// largest divisor ≤ demo_chunk), and every member steps θ by −lr·sign of their mean
  /// (optim/demo.hpp; node/demo_steps.hpp). lr is the inner schedule's.
  bool demo = false;
  float demo_decay = 0.999f;
  std::uint32_t demo_topk = 32;
  std::uint32_t demo_chunk = 64;
  std::uint32_t topk = 64;
  std::uint32_t topk_chunk = 4096;
  std::uint32_t topk_bits = 32;
  float error_decay = 0.95f;
  /// Fragments (gossip/slice.hpp): the parameters cut into `fragments` parts; a round every
  /// inner_steps / fragments inner steps averages one of them, so a sync sends and holds
  /// ~1/fragments of the model. DiLoCo and SparseLoCo (streaming): each part in turn, stepped
  /// alone, synchronised every inner_steps steps at its own offset. NoLoCo (compressed pairs): a
  /// pair averages a part drawn from its window; the rest takes the local-only step. 1: whole-model
  /// rounds.
  std::uint32_t fragments = 1;
  /// Rounds overlapped with the next inner steps (1; --overlap at bootstrap, or the first
  /// trainer's diloco(overlap=True)): every member of the run runs its rounds in the background
  /// and mixes their result in later (node/controller.hpp). A node's own --overlap also turns it
  /// on for that node alone.
  std::uint32_t overlap = 0;
  /// Inner steps between two rounds: inner_steps / fragments.
  std::uint32_t phase_steps() const { return inner_steps / std::max<std::uint32_t>(fragments, 1); }
  /// Matchmaking window (ms): nodes ready in the same window are paired or grouped. Every member
  /// must use the same windows; short ones suit short rounds (tests), the default suits rounds of
  /// tens of seconds and more over the internet.
  std::uint32_t window_ms = 10000;
  // Data and evaluation.
  DataKind data = DataKind::synthetic;
  std::uint32_t eval_every = 100;  ///< inner steps between evaluations
  std::uint32_t eval_batches = 8;

  /// "noloco", "diloco", "sparseloco", "demo" or "none" (the outer algorithm, as --outer
  /// takes it).
  std::string outer_name() const;
  /// Sets the outer algorithm from its name (--outer, the config text, a trainer's hello);
  /// false: not one of the four.
  bool set_outer(std::string_view name);
  /// DiLoCo-mode rounds send compressed messages: SparseLoCo, or DiLoCo with the e3m0 codec.
  bool compressed_rounds() const {
    return outer == OuterMode::diloco && (sparseloco || codec == WireCodec::e3m0);
  }
  /// What goes on the wire, for people: "fp16", "top-64/4096 2-bit + error feedback", ...
  std::string wire_name() const;
  /// The canonical text (the bytes that are hashed and published).
  std::string to_text() const;
  /// BLAKE2b-256 of to_text(), as 64 hex digits.
  std::string hash_hex() const;
  /// "<workload>-<first 12 hex digits of the hash>".
  std::string run_name() const;
  /// Empty when every field is in range; otherwise what is wrong (for --bootstrap options).
  std::string check() const;
  friend bool operator==(const RunConfig&, const RunConfig&) = default;
};

/// Parses a canonical config text (see above); the error says which line is wrong.
transport::Result<RunConfig> parse_run_config(std::string_view text);
/// NoLoCo's settings (alpha, beta, gamma, group, look-ahead) as a named variant: "paper" (the
/// NoLoCo paper's reference code: pairs, 0.5, 0.7, 0.7, no look-ahead) or "grove" (RunConfig's
/// defaults). False for another name.
bool set_noloco_variant(RunConfig& c, std::string_view name);

/// True when `name` has the form of a run name (workload, '-', 12 lowercase hex digits).
bool valid_run_name(std::string_view name);

}  // namespace grove::node
