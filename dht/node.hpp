// The sans-IO Kademlia node. It owns the routing table, the record storage and every
// operation in flight (lookups, puts, pings), and it never touches a socket, a clock or a
// global RNG: a driver feeds it
//   on_message(from, bytes, now)    a DHT message from a peer the transport authenticated
//   on_send_failed(txid, now)       an outgoing request could not be delivered (dial failed)
//   on_timer(now)                   when now >= next_deadline()
// and after every call drains take_outgoing() — encoded messages with their destination.
// Callbacks of get/put/find_node/ping run inside those calls, after the node's own state is
// consistent (they may start new operations). The real driver is dht/runtime.hpp (Asio on a
// transport::Host); sim/ drives thousands of these in virtual time.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <unordered_map>

#include "dht/record_store.hpp"
#include "dht/routing_table.hpp"
#include "dht/storage.hpp"
#include "transport/identity.hpp"

namespace grove::dht {

/// Where a message goes: a known node (id, address to dial if there is no session) or, while
/// bootstrapping, only an address (any identity may answer).
struct Endpoint {
  std::optional<NodeId> id;
  std::string address;
};

struct Outgoing {
  Endpoint to;
  std::vector<std::uint8_t> bytes;
  std::uint64_t txid = 0;  ///< request id for on_send_failed (0 for replies)
};

/// The sender of an incoming message, as the transport proved and saw it.
struct Peer {
  NodeId id{};
  std::string observed_address;  ///< the connection's remote address (may be ephemeral)
};

struct DhtOptions {
  std::size_t k = 20;     ///< bucket size, replication factor, lookup width
  std::size_t alpha = 3;  ///< requests in flight per lookup
  Time rpc_timeout{1000};
  int rpc_retries = 1;  ///< re-sends after a timeout before the request fails
  Time lookup_deadline{20'000};
  Time refresh_interval{std::chrono::minutes(10)};
  Time republish_interval{std::chrono::minutes(5)};
  Time rebootstrap_interval{15'000};  ///< retry the bootstrap list while the table is empty
  Time maintenance_interval{1000};
  /// Every this often, ping a few recently evicted contacts and the bootstrap list, so that a
  /// healed partition or a network outage does not leave the swarm split.
  Time revive_interval{30'000};
  double rate_per_second = 200;     ///< requests accepted per source ...
  double rate_burst = 400;          ///< ... with this burst
  std::size_t rate_sources = 4096;  ///< sources tracked by the rate limiter
  std::size_t max_rpcs = 8192;      ///< requests of ours in flight
  std::size_t max_pages = 32;       ///< pages fetched per node for one key in a get
  std::size_t page_records = 48;
  std::size_t page_bytes = 96u << 10;
  WireLimits wire;
  RoutingOptions routing;
  StorageLimits storage;
};

struct DhtStats {
  std::uint64_t messages_in = 0, messages_out = 0, malformed = 0, rate_limited = 0;
  std::uint64_t rpcs_sent = 0, rpc_timeouts = 0, rpc_failures = 0, bad_records = 0;
  std::uint64_t lookups = 0, unexpected_replies = 0;
};

struct LookupResult {
  std::vector<Contact> closest;  ///< the k closest nodes that answered, nearest first
  std::size_t queried = 0;       ///< requests sent
  std::size_t hops = 0;          ///< longest chain of replies that led to a closer node
};

struct GetResult {
  std::vector<Record> records;  ///< newest valid record of every slot found
  std::size_t responders = 0;   ///< nodes that returned at least one record
  LookupResult lookup;
};

struct PutResult {
  std::size_t acked = 0;  ///< nodes that hold the record now (stored, updated or unchanged)
  std::size_t tried = 0;
  bool local = false;  ///< we are among the k closest and kept a copy
};

class DhtNode final : public RecordStore {
 public:
  using NodesCallback = std::function<void(LookupResult)>;
  using GetCallback = std::function<void(GetResult)>;
  using PutCallback = std::function<void(PutResult)>;
  using PingCallback = std::function<void(bool ok)>;

  /// `identity` signs our records; `address` is where we accept connections ("" = none).
  DhtNode(std::shared_ptr<const transport::Identity> identity, std::string address, DhtOptions opts,
          std::uint64_t seed);
  ~DhtNode();
  DhtNode(const DhtNode&) = delete;
  DhtNode& operator=(const DhtNode&) = delete;

  // ---- driver inputs ----
  void on_message(const Peer& from, std::span<const std::uint8_t> bytes, Time now);
  void on_send_failed(std::uint64_t txid, Time now);
  void on_timer(Time now);
  Time next_deadline() const;
  std::vector<Outgoing> take_outgoing();
  bool has_outgoing() const { return !out_.empty(); }

  // ---- operations ----
  /// Pings `addresses` (any identity may answer), then looks up our own ID and refreshes the
  /// buckets. Retried every rebootstrap_interval while the table is empty. done(table size).
  void bootstrap(std::vector<std::string> addresses, Time now,
                 std::function<void(std::size_t)> done = {});
  /// Learns of a node from elsewhere (LAN discovery): pings it; it enters the table if it answers.
  void add_contact(const Endpoint& e, Time now, PingCallback done = {});
  void ping(const Endpoint& e, Time now, PingCallback done);
  void find_node(const Key& target, Time now, NodesCallback done);
  void get(const Key& key, Time now, GetCallback done, GetOptions opts = {});
  /// Stores records (all with the same key) on the k closest nodes; ours are republished
  /// every republish_interval until they expire or are replaced.
  void put(std::vector<Record> records, Time now, PutCallback done = {});
  /// Signs and puts a record of ours; the sequence number must grow per (key, subkey).
  void put_signed(const Key& key, std::string subkey, std::uint64_t seq, Time expires,
                  std::vector<std::uint8_t> value, Time now, PutCallback done = {});
  /// Stops republishing a record of ours (it expires where it is held).
  void forget(const Key& key, const std::string& subkey);

  // ---- introspection ----
  const NodeId& id() const noexcept override { return identity_->id(); }
  const transport::Identity& identity() const noexcept { return *identity_; }
  /// The latest time any entry point was given.
  Time now() const noexcept override { return now_; }
  const std::string& address() const noexcept { return address_; }
  void set_address(std::string a) { address_ = std::move(a); }
  const RoutingTable& table() const noexcept { return table_; }
  const Storage& storage() const noexcept { return storage_; }
  const DhtStats& stats() const noexcept { return stats_; }
  /// Uses `cache` for signature checks (a simulator gives all its nodes one: the check is a pure
  /// function of the bytes, so sharing changes nothing but the time it takes).
  void share_signature_cache(std::shared_ptr<SignatureCache> cache) {
    if (cache) sig_cache_ = std::move(cache);
  }
  const DhtOptions& options() const noexcept { return opts_; }
  std::size_t pending_rpcs() const noexcept { return rpcs_.size(); }
  std::size_t active_lookups() const noexcept { return lookups_.size(); }

 private:
  // RecordStore: get() and put_signed() under the layers' names.
  void do_read(const Key& key, Time now, ReadDone done, GetOptions opts) override;
  Record do_write(const Key& key, std::string subkey, std::uint64_t seq, Time expires,
                  std::vector<std::uint8_t> value, Time now, WriteDone done) override;

  struct Rpc;
  struct Lookup;
  struct PutOp;
  struct RateBucket {
    double tokens = 0;
    Time last{0};
  };

  struct Entry {
    DhtNode& node;
    Entry(DhtNode& n, Time now);
    ~Entry();
  };

  void handle_request(const Peer& from, const Message& m, Time now);
  void handle_reply(const Peer& from, Message m, Time now);
  void reply(const Peer& from, const Message& req, Message m);
  bool admit(const NodeId& from, Time now);
  bool may_warn(Time now);

  std::uint64_t send_rpc(const Endpoint& to, Message m, Time now,
                         std::function<void(const Peer&, Message&)> on_reply,
                         std::function<void()> on_fail, std::function<void()> on_slow = {});
  void rpc_failed(std::uint64_t txid, bool count_timeout);

  std::uint64_t start_lookup(const Key& target, bool values, Time now, std::size_t quorum,
                             std::function<void(Lookup&)> done, bool spread = false);
  void lookup_step(std::uint64_t id, Time now);
  void lookup_query(Lookup& l, const Key& dist, Time now, std::optional<Cursor> cursor);
  void lookup_settle(std::uint64_t id, const Key& dist, bool failed);
  void finish_lookup(std::uint64_t id);
  static LookupResult result_of(const Lookup& l, std::size_t k);
  void replicate(std::vector<Record> records, Time now, PutCallback done);
  void store_on(std::vector<Contact> targets, std::vector<Record> records, Time now,
                PutCallback done, bool keep_local = true);
  void hand_over(const Contact& newcomer, Time now);
  void maintenance(Time now);
  void defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  void flush();

  std::shared_ptr<const transport::Identity> identity_;
  std::string address_;
  DhtOptions opts_;
  std::mt19937_64 rng_;
  RoutingTable table_;
  Storage storage_;
  DhtStats stats_;
  std::vector<Outgoing> out_;

  std::unordered_map<std::uint64_t, std::unique_ptr<Rpc>> rpcs_;
  std::set<std::pair<Time, std::uint64_t>> rpc_deadlines_;
  std::map<std::uint64_t, std::unique_ptr<Lookup>> lookups_;
  std::uint64_t next_lookup_ = 1;
  std::map<NodeId, RateBucket> rate_;
  std::map<std::pair<Key, std::pair<PublicKey, std::string>>, Record> own_;
  Time own_republished_{0};
  std::vector<std::string> bootstrap_;
  Time next_maintenance_{0};
  Time last_rebootstrap_{0};
  Time last_revive_{0};
  Time last_warn_{0};
  Time now_{0};  ///< latest time any entry point was given
  std::vector<std::function<void()>> deferred_;
  // Records verified before (polls return the same ones); shared by a simulator's nodes.
  std::shared_ptr<SignatureCache> sig_cache_ = std::make_shared<SignatureCache>();
  int depth_ = 0;  ///< nesting of public entry points (Entry; flush at the outermost)
};

}  // namespace grove::dht
