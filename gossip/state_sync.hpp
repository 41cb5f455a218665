// State sync for joiners: a live member serves an immutable snapshot of its state (slow
// weights, outer optimizer state, round, run config, serialised by the node) and a joiner
// downloads it in verified chunks, from the next donor when one fails.
//
// The snapshot is cut into chunks of `chunk_bytes`; its manifest lists the run, the round, the
// size, the chunk size and the BLAKE2b-256 of every chunk, and its root is the BLAKE2b-256 of the
// manifest's bytes. The donor announces (round, size, root, address) in a DHT record it signs
// (dht/record: Ed25519 over the value), so the root is signed by the donor. The joiner:
//  1. asks the donor for the manifest and checks that it hashes to the signed root and matches
//     the offer (run, round, size, a chunk count within bounds);
//  2. asks for chunks, `parallel` at a time, and checks each against the manifest as it arrives;
//     Every other donor whose offer names the same root (DiLoCo members hold the very same
//     state) serves chunks too, `parallel` requests each: the download takes the sum of their
//     upload rates, not one donor's;
//  3. when a request fails, passes its deadline (from the bytes in flight and the rate measured
//     from that donor: StateSyncOptions), or returns a chunk that does not match, drops that
//     donor (its chunks go to the others) and, when no donor of the root is left, goes on with
//     the next offer. Chunks already verified are kept when the next donor offers the same root
//     (resume), and across downloads (SyncPartial: a join's next attempt); another root starts
//     over.
// Serving from the snapshot means the donor keeps training while joiners download. The cores
// are sans-IO: the joiner's StateDownload emits requests and takes responses and the time; the
// donor's StateServer answers requests; the node's runtime carries them as RPCs.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "gossip/protocol.hpp"
#include "gossip/state_blob.hpp"
#include "optim/buffer.hpp"

namespace grove::gossip {

struct StateManifest {
  std::string run_id;
  std::uint64_t round = 0;
  std::uint64_t size = 0;
  std::uint32_t chunk_bytes = 0;
  std::vector<Digest> chunks;
};
std::vector<std::uint8_t> encode_manifest(const StateManifest& m);
/// Bounded: at most `max_chunks` chunk hashes.
transport::Result<StateManifest> decode_manifest(std::span<const std::uint8_t> bytes,
                                                 std::size_t max_chunks);
Digest manifest_root(std::span<const std::uint8_t> manifest_bytes);

/// A delta a donor serves next to its state (gossip/state_delta.hpp): the mean Δ of the DiLoCo
/// round that led to state round `round`, a snapshot of its own.
struct DeltaOffer {
  std::uint64_t round = 0;
  std::uint64_t size = 0;
  Digest root{};        ///< its snapshot's root
  Digest from{}, to{};  ///< φ's hash before and after it
  friend bool operator==(const DeltaOffer&, const DeltaOffer&) = default;
};
inline constexpr std::size_t kMaxOfferDeltas = 8;

/// What a donor announces (the value of its signed "state" record).
struct StateOffer {
  NodeId donor{};  ///< the record's owner
  std::string address;
  std::string run_id;
  std::uint64_t round = 0;
  std::uint64_t size = 0;
  Digest root{};
  /// The deltas it serves, oldest first (at most kMaxOfferDeltas): those up to `round`, for
  /// members behind it, and those after it, which take its state on to offer_head() (a DiLoCo
  /// state snapshotted every few rounds: RoundOptions::snapshot_every).
  std::vector<DeltaOffer> deltas;
  friend bool operator==(const StateOffer&, const StateOffer&) = default;
};
/// The round an offer's state reaches with the deltas it lists after its round, each the next
/// round's and starting at the φ the one before ends with (its round when it lists none).
std::uint64_t offer_head(const StateOffer& o);
std::vector<std::uint8_t> encode_offer(const StateOffer& o);
transport::Result<StateOffer> decode_offer(std::span<const std::uint8_t> value);
dht::Key state_key(const std::string& run_id);

/// A request from a joiner: the manifest (index = nullopt) or one chunk of the snapshot `root`.
struct StateRequest {
  Digest root{};
  std::optional<std::uint32_t> index;
};
std::vector<std::uint8_t> encode_state_request(const StateRequest& r);
transport::Result<StateRequest> decode_state_request(std::span<const std::uint8_t> bytes);

/// An immutable snapshot (donor side) over a state blob: its chunks are read from the blob (a
/// file, for the node) when a joiner asks for them.
class StateSnapshot {
 public:
  /// Hashes the blob's chunks (read one at a time); fails when the blob cannot be read.
  static transport::Result<std::shared_ptr<const StateSnapshot>> of(
      std::string run_id, std::uint64_t round, std::shared_ptr<const StateBlob> blob,
      std::uint32_t chunk_bytes = 4u << 20);
  /// Over bytes in memory (tests).
  StateSnapshot(std::string run_id, std::uint64_t round, std::vector<std::uint8_t> blob,
                std::uint32_t chunk_bytes = 4u << 20);
  const Digest& root() const { return root_; }
  std::uint64_t round() const { return manifest_.round; }
  std::uint64_t size() const { return blob_->size(); }
  const std::vector<std::uint8_t>& manifest_bytes() const { return manifest_bytes_; }
  /// Chunk i's bytes (errc::rejected past the last; the blob's error when it cannot be read).
  transport::Result<std::vector<std::uint8_t>> chunk(std::uint32_t i) const;
  std::uint32_t chunks() const { return static_cast<std::uint32_t>(manifest_.chunks.size()); }
  const StateBlob& blob() const { return *blob_; }

 private:
  StateSnapshot(std::shared_ptr<const StateBlob> blob, StateManifest m);
  std::shared_ptr<const StateBlob> blob_;
  StateManifest manifest_;
  std::vector<std::uint8_t> manifest_bytes_;
  Digest root_{};
};

/// Answers joiners' requests from the snapshots it holds: the latest `keep` while they fit in
/// `budget` bytes, and beyond the budget only those that joiners fetch. The latest is always
/// held; an older one past the budget is dropped at an add() unless it was asked for since the
/// add() before. So a node with a large model (a snapshot of GBs, in a file: node/state_files)
/// holds one state's snapshot, except while a joiner downloads one that a newer round has
/// superseded; the snapshot offered stays until the next is added (a joiner that read its offer
/// finds it).
/// Deltas (gossip/state_delta.hpp) are held apart: the latest `keep_deltas`, whatever their size.
/// Thread-safe: the round engine adds snapshots on its strand while the transport answers on
/// the host's.
class StateServer {
 public:
  explicit StateServer(std::size_t keep = 2, std::uint64_t budget = std::uint64_t{64} << 20,
                       std::size_t keep_deltas = 4)
      : keep_(keep), keep_deltas_(keep_deltas), budget_(budget) {}
  /// Returns the snapshots no longer served: the caller drops them where freeing a large file
  /// holds up nothing (the node: off the DHT strand).
  std::vector<std::shared_ptr<const StateSnapshot>> add(std::shared_ptr<const StateSnapshot> s);
  /// A delta's snapshot; returns those no longer served (as add()).
  std::vector<std::shared_ptr<const StateSnapshot>> add_delta(
      std::shared_ptr<const StateSnapshot> s);
  std::size_t keep_deltas() const { return keep_deltas_; }
  std::shared_ptr<const StateSnapshot> latest() const;
  /// φ's hash at `round` (our state then), kept for the last kHashHistory rounds: a probe
  /// (gossip/state_check.hpp) asks for it.
  void note_hash(std::uint64_t round, const Digest& hash);
  /// The response body, or an error: malformed request, or errc::rejected for a snapshot or
  /// chunk we do not hold (any more). A probe is answered with the hash of its round (when
  /// noted) and samples of the latest snapshot's φ.
  transport::Result<std::vector<std::uint8_t>> answer(std::span<const std::uint8_t> request) const;

 private:
  struct Held {
    std::shared_ptr<const StateSnapshot> snap;
    mutable bool asked = false;  // since the last add()
  };
  std::vector<std::shared_ptr<const StateSnapshot>> prune(std::uint64_t held, std::size_t room);
  std::size_t keep_, keep_deltas_;
  std::uint64_t budget_;
  mutable std::mutex mu_;
  std::vector<Held> snaps_;                 // oldest first
  std::vector<Held> deltas_;                // oldest first
  std::map<std::uint64_t, Digest> hashes_;  // by round: the last kHashHistory
};

struct StateSyncOptions {
  /// Chunk requests in flight per donor: 32 MiB of 4 MiB chunks, 2.6 s of a 100 Mbit/s line, so
  /// that a donor's short stall (a disk read under memory pressure) does not idle the line.
  std::size_t parallel = 8;
  /// A request's deadline comes from its size: request_floor, plus the bytes in flight (its own
  /// included) at the rate this donor has been measured to deliver, times rate_margin. Before a
  /// chunk has arrived from the donor the rate is taken to be min_rate; a donor measured slower
  /// than min_rate is still given min_rate's time (a slow line is not a failure; a stall is).
  Time request_floor{10'000};
  double min_rate = 256.0 * 1024;  ///< bytes per second (about 2 Mbit/s)
  double rate_margin = 2.0;
  /// A donor that has delivered chunks and then misses a deadline is given a new deadline (the
  /// same formula) this many times in a row before it is dropped: a stall of either machine (20 s
  /// while three 500M nodes shared one) should not end a download 97% done. A chunk it delivers
  /// starts the count again. A chunk request that fails before its deadline here (the
  /// transport's timeout, set when it left, ran out under an extended deadline; a session that
  /// broke) is asked again and counts as late, unless it was in flight through a lateness
  /// already counted (one stall fails every request in flight at once: one lateness); a failed
  /// manifest request drops the donor.
  unsigned late_allowed = 2;
  std::uint64_t max_size = std::uint64_t{64} << 30;
  std::uint32_t max_chunk_bytes = 16u << 20;
  std::size_t max_chunks = 1u << 20;
  /// Where a download's verified chunks are written (nullptr: in memory).
  std::shared_ptr<BlobStore> store;
};

/// The verified part of a snapshot whose download failed: the next download of the same root
/// (another attempt, another donor) goes on from it instead of from zero.
struct SyncPartial {
  Digest root{};
  StateManifest manifest;
  std::vector<bool> have;
  std::size_t verified = 0;
  std::unique_ptr<BlobWriter> blob;  ///< the manifest's size; the verified chunks written
};

/// How far a download has come: verified bytes of the snapshot's size, at the rate measured
/// from its donors together (bytes per second; 0 before the first chunk).
struct SyncProgress {
  std::uint64_t bytes = 0, total = 0;
  double rate = 0;
};

/// Joiner side: downloads one snapshot from a list of offers (best first).
class StateDownload {
 public:
  struct Request {
    std::uint64_t id = 0;
    NodeId to{};
    std::string address;
    std::vector<std::uint8_t> body;
    Time deadline{0};
    /// When the transport gives up on it (0: at `deadline`): a chunk's answer is still taken
    /// while a late donor is given more time.
    Time give_up{0};
  };
  /// `resume`: chunks verified by an earlier download, used when a donor offers their root.
  StateDownload(std::string run_id, std::vector<StateOffer> offers, StateSyncOptions opts, Time now,
                std::optional<SyncPartial> resume = std::nullopt);

  std::vector<Request> take_requests() { return std::exchange(out_, {}); }
  void on_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now);
  /// A request failed (`why`: the transport's reason, for the log line).
  void on_failure(std::uint64_t id, Time now, const std::string& why = {});
  void on_timer(Time now);
  std::optional<Time> next_deadline() const;

  OpStatus status() const { return status_; }
  const std::string& failure() const { return failure_; }
  /// The verified snapshot, once done (nullptr before, or once taken).
  std::shared_ptr<const StateBlob> take_blob();
  const StateOffer& offer() const { return offers_.at(current_); }
  /// Donors asked for something so far (those dropped and those serving).
  std::size_t donors_tried() const { return dropped_.size() + active_.size(); }
  /// The offers (donor, root) dropped so far: they failed, or their donor no longer holds them.
  std::vector<std::pair<NodeId, Digest>> dropped_offers() const {
    std::vector<std::pair<NodeId, Digest>> v;
    for (const auto i : dropped_) v.emplace_back(offers_[i].donor, offers_[i].root);
    return v;
  }
  /// Donors serving chunks now.
  std::size_t donors_active() const { return active_.size(); }
  std::size_t chunks_fetched() const { return fetched_; }
  SyncProgress progress(Time now) const;
  /// After a failure: the verified chunks, for the next attempt (nullopt when there are none).
  std::optional<SyncPartial> take_partial();

 private:
  struct Pending {
    std::optional<std::uint32_t> index;
    Time deadline{0};
    std::size_t donor = 0;  // offers_ index
    Time sent{0};
  };
  // A donor serving this download: its delivery since its first request went out (bytes of
  // verified chunks) and its requests in flight.
  struct Donor {
    Time since{0};
    std::uint64_t bytes = 0;
    std::size_t in_flight = 0;
    unsigned late = 0;  ///< deadlines missed in a row
    /// When `late` last grew: requests that left before then were in flight through that stall,
    /// and their failures are the same lateness, not more of it.
    std::optional<Time> late_at;
  };
  void start_donor(Time now);
  /// The time `requests` requests of this donor's are given: request_floor plus their bytes at
  /// its rate, times rate_margin.
  Time allowance(const Donor& dn, std::size_t requests, Time now) const;
  /// After the manifest: every other offer of its root serves chunks too.
  void add_helpers(Time now);
  /// Drops donor `d` (offers_ index): its requests go back to the pool; when no donor is left,
  /// the next offer not yet tried.
  void drop(std::size_t d, const std::string& why, Time now);
  void request(std::optional<std::uint32_t> index, std::size_t d, Time now);
  void fill(Time now);
  double measured_rate(const Donor& d, Time now) const;  // 0 before its first chunk
  double rate(const Donor& d, Time now) const;           // measured_rate, at least min_rate
  std::uint64_t verified_bytes() const;

  std::string run_id_;
  std::vector<StateOffer> offers_;
  StateSyncOptions opts_;
  std::size_t current_ = 0;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Pending> pending_;
  std::optional<StateManifest> manifest_;
  Digest manifest_root_{};
  std::vector<bool> have_;
  std::set<std::uint32_t> asked_;
  std::uint32_t next_chunk_ = 0;
  std::size_t verified_ = 0, fetched_ = 0;
  std::map<std::size_t, Donor> active_;  // by offers_ index; current_ fetches the manifest
  std::set<std::size_t> dropped_;
  // The manifest's size, from opts_.store; every byte comes from a verified chunk.
  std::unique_ptr<BlobWriter> blob_;
  OpStatus status_ = OpStatus::running;
  std::string failure_;
  std::vector<Request> out_;
};

}  // namespace grove::gossip
