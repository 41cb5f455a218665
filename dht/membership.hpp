// Run membership on top of the DHT. Every member of a run writes a member record under the
// run's key (a dictionary: one slot per node, signed by it) with a short TTL and refreshes it;
// every member polls the key and keeps a view of the live members. A node that dies stops
// refreshing: its record expires within one TTL and the next poll drops it, so a dead member
// leaves every view within 2 TTL. A node that leaves cleanly publishes status "leaving" and
// is dropped at the next poll. Sans-IO like the DHT node it drives: on_timer(now) and
// next_deadline(); the Asio runtime and the simulator call them.
#pragma once

#include <algorithm>
#include <functional>
#include <map>

#include "dht/record_store.hpp"
#include "transport/reach.hpp"

namespace grove::dht {

/// The most bytes of a member record's payload (what the layer above says about its member).
inline constexpr std::size_t kMaxMemberPayload = 256;

struct MemberInfo {
  NodeId id{};  ///< the record's owner (not encoded: the signature proves it)
  std::vector<std::string> addresses;
  std::string run_id;
  std::string status;  ///< joining, training, ready, averaging, leaving, ...
  /// Whether other nodes can open connections to this one (unreachable: it is reached over the
  /// connections it opens; its addresses are relays' or none).
  transport::Reachability reach = transport::Reachability::unchecked;
  /// Opaque to the DHT, at most kMaxMemberPayload bytes: the training layer's own record of its
  /// member (gossip/progress: round and weights hash).
  std::vector<std::uint8_t> payload;
  Time expires{0};
  std::uint64_t seq = 0;
  friend bool operator==(const MemberInfo&, const MemberInfo&) = default;
};

/// The member record's value (schema in membership.cpp: addresses, run, status, reach, payload);
/// decoding is bounded.
std::vector<std::uint8_t> encode_member(const MemberInfo& m);
transport::Result<MemberInfo> decode_member(std::span<const std::uint8_t> value);

/// The DHT key of a run's member dictionary; run ids are 1-64 printable ASCII characters.
Key members_key(const std::string& run_id);
bool valid_run_id(const std::string& run_id);

struct MembershipOptions {
  Time ttl{30'000};            ///< lifetime of a member record
  Time publish_every{10'000};  ///< refresh of our own record (< ttl)
  Time poll_every{7'000};      ///< re-read of the run's members
  std::size_t max_members = 4096;
  /// A poll reads the members' dictionary from this many of the nodes nearest to its key (each
  /// holds all of it: every record is stored on the k nearest), not from all k: a swarm of N
  /// members then moves read_quorum·N records per poll and node instead of k·N. 0 = all k.
  std::size_t read_quorum = 4;
  /// Beyond this many members the poll interval and the TTL of our record grow in proportion
  /// (×⌊N / scale_members⌋): every member reads the whole dictionary, so a fixed interval
  /// would cost each holder O(N²) bytes a second; this keeps it O(N) and each member's reads
  /// about constant (departures of crashed members are seen later in large swarms, graceful
  /// leaves at the next poll). Polls also read from holders drawn at random among the k
  /// nearest (GetOptions::spread). 0 = fixed intervals.
  std::size_t scale_members = 128;
};

enum class MemberEvent { joined, updated, left };
const char* to_string(MemberEvent e);

class Membership {
 public:
  using Watch = std::function<void(MemberEvent, const MemberInfo&)>;

  /// `run_id` must be valid (ConfigError otherwise).
  Membership(RecordStore& store, std::string run_id, MembershipOptions opts);

  /// What we publish about ourselves (addresses, round, status, ...); sent at the next
  /// on_timer, which also happens right away when `now` is given.
  void set_self(MemberInfo info);
  MemberInfo self() const { return self_; }
  /// Publishes status "leaving" (others drop us at their next poll) and stops refreshing;
  /// `done` runs once the record was stored (or the attempt ended).
  void leave(Time now, std::function<void()> done = {});
  /// Called on every join, update and departure seen in the view (also for ourselves).
  void watch(Watch w) { watchers_.push_back(std::move(w)); }

  void on_timer(Time now);
  Time next_deadline() const { return std::min(next_publish_, next_poll_); }

  /// The live members (records not expired, not leaving), ourselves included once published.
  std::vector<MemberInfo> live(Time now) const;
  std::size_t size() const { return view_.size(); }
  const std::string& run_id() const { return run_id_; }
  std::uint64_t polls() const { return polls_; }
  /// The current poll interval and TTL of our record (MembershipOptions::scale_members).
  Time poll_interval() const { return opts_.poll_every * scale(); }
  Time record_ttl() const { return opts_.ttl * scale(); }

 private:
  std::int64_t scale() const {
    return opts_.scale_members == 0
               ? 1
               : std::max<std::int64_t>(
                     1, static_cast<std::int64_t>(view_.size() / opts_.scale_members));
  }
  void publish(Time now, std::function<void()> done = {});
  void poll(Time now);
  void merge(std::vector<Record> records, Time now);
  void emit(MemberEvent e, const MemberInfo& m);

  RecordStore& store_;
  std::string run_id_;
  Key key_;
  MembershipOptions opts_;
  MemberInfo self_;
  bool publishing_ = false, leaving_ = false, polling_ = false;
  std::uint64_t seq_ = 0, polls_ = 0;
  Time next_publish_ = Time::max(), next_poll_{0};
  std::map<NodeId, MemberInfo> view_;
  std::vector<Watch> watchers_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

 public:
  ~Membership() { *alive_ = false; }
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;
};

}  // namespace grove::dht
