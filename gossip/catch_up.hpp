// CatchUp: one state sync — a joiner's, or that of a member whose slow weights fell out of step
// with its group. It reads the donors' signed offers of the run's state (dht key state_key(run),
// subkey "state"), again every quarter window while none of at least `min_round` is there (up to
// `offers_wait`), orders them newest round first (joiners spread over the donors of one round by
// a hash of both ids; an offer of the snapshot an earlier attempt had begun comes first), and
// downloads the first through StateDownload (verified chunks, the next donor when one fails).
// When every donor fails, the offers are read again (donors move on to newer states: the one read
// may be gone), while the sync has verified a chunk, or begun, within `offers_wait`; the verified
// chunks are kept for the next download of the same snapshot, and for the next attempt when the
// sync fails. A member that holds a state (behind its group by a round or two) downloads the
// newest offer's deltas from its own round instead (gossip/state_delta.hpp), when that offer lists
// a chain of them starting at its φ's hash, one after another from every donor listing each; a
// delta that cannot be fetched makes it read the offers again for the whole state. Sans-IO: the DHT
// is the engine's, the requests go out through the driver, the time comes with every call.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "dht/record_store.hpp"
#include "gossip/state_check.hpp"
#include "gossip/state_sync.hpp"

namespace grove::gossip {

struct CatchUpOptions {
  StateSyncOptions sync;  ///< max_size is lowered to what a state of `values` can take
  Time offers_wait{20'000};
  Time offers_retry{500};
  /// φ's size when known (a state of another size is refused, larger offers never tried).
  std::optional<std::size_t> values;
  /// The state we hold, when we hold one: deltas from it are fetched instead of a state.
  struct Held {
    std::uint64_t round = 0;
    Digest hash{};
  };
  std::optional<Held> have;
  /// Members to check the downloaded state with (gossip/state_check.hpp): the live members other
  /// than us, by id and address, read when the download is done. They and every donor whose offer
  /// was read are probed then (at most kMaxWitnesses, the donor first).
  std::function<std::vector<std::pair<NodeId, std::string>>()> members;
  std::uint64_t probe_seed = 0;
  /// Whether a round's members all hold the same φ (DiLoCo): then only a hash of the round is of
  /// use from a witness, else the samples of its φ too.
  std::function<bool(std::uint64_t round)> same_hash;
  /// Donors whose state was refused: their offers are skipped.
  std::set<NodeId> distrust;
  /// A member catching up (not a joiner): true while no other live member can hand it a state of
  /// the round it waits for (each is itself catching up from an earlier round: an all-reduce
  /// that failed for every member). Holding for `nobody_ahead_settle` (records to spread), with
  /// no offer, ends the wait: there is nothing to wait for.
  std::function<bool()> nobody_ahead;
  Time nobody_ahead_settle{10'000};
};

class CatchUp {
 public:
  /// Starts reading the offers of `run_id` for a state of at least `min_round`; from `donors`
  /// only when given.
  CatchUp(dht::RecordStore& store, std::string run_id, std::uint64_t min_round,
          std::set<NodeId> donors, CatchUpOptions opts, Time now,
          std::optional<SyncPartial> resume = std::nullopt);
  ~CatchUp();
  CatchUp(const CatchUp&) = delete;
  CatchUp& operator=(const CatchUp&) = delete;

  /// running until the download is done (take_blob) or failed (failure() says why).
  OpStatus status() const { return status_; }
  const std::string& failure() const { return failure_; }
  /// Done: the state (nullptr when deltas were fetched instead).
  std::shared_ptr<const StateBlob> take_blob() { return std::move(blob_); }
  /// Done: the deltas that lead from CatchUpOptions::have to offer().round, oldest first (empty
  /// when the state was fetched).
  std::vector<std::shared_ptr<const StateBlob>> take_deltas() { return std::move(deltas_); }
  /// The bytes downloaded (the state's, or the deltas').
  std::uint64_t bytes() const { return bytes_; }
  /// The offer whose state (or deltas) was downloaded.
  const StateOffer& offer() const { return offer_; }
  /// After a failure: the chunks verified so far, for the next attempt.
  std::optional<SyncPartial> take_partial() { return std::exchange(partial_, std::nullopt); }
  /// Done: what the witnesses said of the state's round (empty when there were none).
  std::vector<Witness> take_witnesses() { return std::move(witnesses_); }
  /// The round the state downloaded is at (offer().round, or its deltas' head).
  std::uint64_t state_round() const { return state_round_; }
  /// The download's progress (zero until the offers are read and a manifest is in).
  SyncProgress progress(Time now) const;

  std::vector<StateDownload::Request> take_requests();
  void on_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now);
  void on_failure(std::uint64_t id, Time now, const std::string& why = {});
  void on_timer(Time now);
  /// Due at once when it has ended (the owner takes the outcome at its next timer).
  std::optional<Time> next_deadline() const;

 private:
  void read_offers(Time now);
  void on_offers(std::vector<dht::Record> records, Time now);
  void settle(Time now);
  void fail(std::string why);
  /// The deltas from opts_.have to the newest offer (first in `found`), from every offer listing
  /// each: true when they chain, and their download has begun.
  bool plan_deltas(const std::vector<StateOffer>& found, Time now);
  void next_delta(Time now);
  /// The download is done: the witnesses are probed (again, every second, while none but the
  /// donor said something of use, for up to 3 s), then the sync is done.
  void probe(Time now);
  void on_probe(std::uint64_t id, const transport::Result<ProbeAnswer>& a, Time now);
  bool probes_enough() const;
  bool useful(const Witness& w) const;
  void finish_probes();

  dht::RecordStore& store_;
  std::string run_id_;
  std::uint64_t min_round_;
  std::set<NodeId> donors_;  // empty: any donor
  CatchUpOptions opts_;
  Time started_;
  Time last_progress_ = started_;     // the start, or the last chunk verified
  std::uint64_t progress_bytes_ = 0;  // verified bytes at last_progress_
  Time retry_at_{Time::max()};
  std::optional<Time> nobody_since_;  // since when no other member has been ahead of us
  bool reading_ = false;
  std::unique_ptr<StateDownload> download_;
  OpStatus status_ = OpStatus::running;
  std::string failure_;
  StateOffer offer_;
  std::shared_ptr<const StateBlob> blob_;
  std::uint64_t bytes_ = 0;
  std::vector<std::vector<StateOffer>> plan_;  // the deltas still to fetch (their donors' offers)
  bool deltas_mode_ = false;                   // download_ is of a delta
  std::uint64_t deltas_total_ = 0;             // the planned deltas' bytes
  std::vector<std::shared_ptr<const StateBlob>> deltas_;
  std::optional<SyncPartial> partial_;  // until the download starts; again after it failed
  std::uint64_t state_round_ = 0;
  std::map<NodeId, std::string> offer_donors_;  // every donor whose offer was read, by address
  /// Offers (donor, root) a download of this sync dropped, and until when they are not tried
  /// again (a donor gone keeps its signed offer in the DHT until it expires: the offers are read
  /// again every offers_retry, it would be dialed each time; one that moved on offers another
  /// root, tried at once).
  std::map<std::pair<NodeId, Digest>, Time> dropped_;
  std::string last_failure_;        // of the last download that failed
  std::vector<Witness> witnesses_;  // one per opts_.witnesses (the donor first)
  std::vector<std::pair<NodeId, std::string>> witness_at_;  // witnesses_'s ids and addresses
  struct Probe {
    std::size_t witness = 0;  // witnesses_ index
    Time deadline{0};
  };
  std::map<std::uint64_t, Probe> probes_;  // by request id
  std::vector<StateDownload::Request> probe_out_;
  std::uint64_t probe_id_ = std::uint64_t{1} << 62;  // (a download's ids count from 1)
  Time probe_started_{0}, probe_again_{Time::max()};
  bool probing_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace grove::gossip
