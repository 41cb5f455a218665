// Kademlia routing table: one bucket per shared-prefix length with our own ID (bucket i holds
// contacts whose ID shares exactly i leading bits with ours), k live entries each, plus a
// replacement cache of k recently heard contacts that take the place of entries that fail.
// Only contacts we heard from directly enter the table; third-party contacts from replies are
// lookup candidates only. Pure data structure: no I/O, time passed in.
#pragma once

#include <deque>
#include <optional>
#include <vector>

#include "dht/messages.hpp"

namespace grove::dht {

struct RoutingOptions {
  std::size_t k = 20;
  int max_fails = 2;         ///< consecutive failures that evict an entry with a replacement
  int max_fails_alone = 5;   ///< ... and one without a replacement
  Time stale_after{60'000};  ///< a full bucket's oldest entry is pinged when older than this
};

struct RoutingEntry {
  Contact contact;
  Time last_seen{0};
  int fails = 0;
  bool pinging = false;  ///< a liveness ping is in flight
};

class RoutingTable {
 public:
  RoutingTable(const NodeId& self, RoutingOptions opts);

  const NodeId& self() const noexcept { return self_; }
  /// The contact sent us a message or answered. Returns an entry to ping (the bucket's stale
  /// oldest one) when `c` had to wait in the replacement cache of a full bucket.
  std::optional<Contact> heard_from(const Contact& c, Time now);
  /// A request to `id` timed out or could not be delivered.
  void failed(const NodeId& id);
  /// A liveness ping to `id` ended (answered or not): the entry can be pinged again.
  void ping_done(const NodeId& id);
  /// Up to n entries closest to target, nearest first (entries with failures last-resort only
  /// when there are not enough healthy ones).
  std::vector<Contact> closest(const Key& target, std::size_t n) const;
  bool contains(const NodeId& id) const;
  std::size_t size() const noexcept { return size_; }
  std::size_t replacement_count() const;
  /// Highest bucket index holding any entry (-1 when empty).
  int depth() const;
  /// Buckets up to depth()+1 not looked into since `now - interval`; marks them refreshed.
  std::vector<int> take_stale_buckets(Time now, Time interval);
  /// Record that a lookup for a target in bucket `b` ran.
  void touch_bucket(int b, Time now);
  int bucket_of(const NodeId& id) const;
  std::vector<RoutingEntry> entries() const;
  /// Up to n recently evicted contacts, in rotation (each stays until it is heard from again or
  /// pushed out by newer evictions): pinging them now and then lets a healed partition or a
  /// returning node reconnect.
  std::vector<Contact> take_dormant(std::size_t n);

 private:
  struct Bucket {
    std::vector<RoutingEntry> live;  // least recently seen first
    std::deque<RoutingEntry> spare;  // replacement cache, most recent last
    Time refreshed{0};
  };
  NodeId self_;
  RoutingOptions opts_;
  std::vector<Bucket> buckets_;
  std::size_t size_ = 0;
  std::deque<Contact> dormant_;
  void bury(const Contact& c);
};

}  // namespace grove::dht
