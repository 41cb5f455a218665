// Corpus: the bytes a language-model workload trains and evaluates on (plain C++, no libtorch).
//
// A sample is a window of seq_len + 1 bytes: the model reads the first seq_len bytes and predicts
// each next one, so a window gives seq_len targets.
//
//   synthetic: an order-2 Markov chain over 64 printable symbols, generated from config.seed.
//       Its entropy rate is computed exactly, so the best loss any model can reach is known
//       (loss_floor()) and can be printed beside the loss. Every node draws its training windows
//       as consecutive pieces of its own chain (seeded by config.seed and node_seed); the
//       held-out windows come from another chain run seeded by config.seed alone, so they are
//       identical on every node and are not part of anyone's training stream.
//   files: the concatenation of the --data files. The last 5% (at least the held-out windows'
//       worth) is held out; training windows start at random positions (seeded by config.seed
//       and node_seed) in the rest. A window may span the boundary between two files, as in the
//       usual packing of documents. No known floor (NaN).
//
// Nothing here depends on the machine's floating point: the chain's transition weights are small
// integers and sampling is integer arithmetic, so every node sees the same held-out bytes.
// Not thread-safe: the node's training thread owns its corpus.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "node/config.hpp"
#include "transport/error.hpp"

namespace grove::node {

/// Where a corpus's training stream stands; restoring it replays the same windows (checkpoints).
struct CorpusState {
  std::array<std::uint64_t, 4> rng{};  ///< xoshiro256** state (never all zero)
  std::uint32_t context = 0;           ///< synthetic: the chain's last two symbols; files: 0

  static constexpr std::size_t kEncodedSize = 4 * 8 + 4;
  /// Appends the kEncodedSize little-endian bytes to `out`.
  void encode_to(std::vector<std::uint8_t>& out) const;
  /// Reads exactly kEncodedSize bytes; nullopt for any other size or an all-zero rng.
  static std::optional<CorpusState> decode(std::span<const std::uint8_t> in);
  friend bool operator==(const CorpusState&, const CorpusState&) = default;
};

/// Files bigger than this in total are refused (the corpus is held in memory).
constexpr std::uint64_t kMaxCorpusBytes = std::uint64_t{4} << 30;
/// The held-out windows are held in memory too; a config asking for more is refused.
constexpr std::uint64_t kMaxEvalBytes = std::uint64_t{1} << 30;

class Corpus {
 public:
  /// The run's data as this node sees it. Throws transport::ConfigError for a files run without
  /// files (or a synthetic run given files), an unreadable, empty or too short file (each must
  /// hold a window), more than kMaxCorpusBytes in all, too little data to hold out the
  /// evaluation windows and still train, or more than kMaxEvalBytes of held-out windows.
  Corpus(const RunConfig& config, std::span<const std::string> data_files, std::uint64_t node_seed);
  ~Corpus();
  Corpus(Corpus&&) noexcept;
  Corpus& operator=(Corpus&&) noexcept;

  /// seq_len + 1.
  std::size_t window_bytes() const;
  /// Fills `out` (a whole number of windows) with the next windows of this node's stream.
  void next_windows(std::span<std::uint8_t> out);
  /// The held-out windows, eval_batches × batch of them, back to back (window_bytes() each).
  std::span<const std::uint8_t> eval_windows() const;
  std::size_t num_eval_windows() const;

  /// The lowest expected mean cross-entropy (nats per target byte) any model can reach on a
  /// window: the first target sees one symbol of context, the others see the two the chain
  /// depends on, so this is (H(X1|X0) + (seq_len − 1)·entropy_rate()) / seq_len. NaN for files.
  double loss_floor() const;
  /// The chain's entropy rate H(X2 | X0 X1) in nats per byte; NaN for files.
  double entropy_rate() const;
  /// The entropy of single bytes (synthetic: of the chain's stationary distribution; files: of
  /// the training part), in nats: what a model that ignores context can reach.
  double unigram_entropy() const;
  /// Files: the bytes training windows are drawn from (the held-out part follows them).
  /// Synthetic: 0.
  std::uint64_t train_bytes() const;

  CorpusState state() const;
  /// Resumes the training stream at `s`; false (with `why`) when `s` does not fit this corpus.
  transport::Result<void> restore(const CorpusState& s);
  /// e.g. "synthetic order-2 Markov source, 64 symbols, floor 0.78 nats/byte".
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace grove::node
