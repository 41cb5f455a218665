// Record storage of one DHT node, with quotas. Records are grouped by key; within a key each
// slot (owner, subkey) holds the newest valid record. Quotas: total bytes, records per key and
// bytes per source (the owner that signed the records). When a quota is hit the largest
// consumer gives way first: a new record from a source using less than the largest one evicts
// that one's records, so a flooding source can only ever evict its own. Pure data structure.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "dht/messages.hpp"

namespace grove::dht {

struct StorageLimits {
  std::size_t max_bytes = 32u << 20;
  std::size_t max_records_per_key = 1024;
  std::size_t max_bytes_per_source = 512u << 10;
};

struct StorageStats {
  std::size_t records = 0, bytes = 0, keys = 0, sources = 0;
  std::uint64_t evicted = 0, refused = 0;
};

class Storage {
 public:
  explicit Storage(StorageLimits limits) : limits_(limits) {}

  /// Stores a record the caller has validated (check_record).
  StoreCode put(const Record& r, Time now);
  /// One page of a key's live records, in slot order after `after`; `next` is set when more
  /// remain. At least one record is returned when any remains, even over max_bytes.
  std::vector<Record> get(const Key& key, Time now, const std::optional<Cursor>& after,
                          std::size_t max_records, std::size_t max_bytes,
                          std::optional<Cursor>& next) const;
  /// Drops expired records.
  void expire(Time now);
  /// Keys holding records that were last received (stored or republished) before `before`,
  /// i.e. the ones a node should republish; marks them as republished at `now`.
  std::vector<Key> take_keys_to_republish(Time before, Time now);
  /// Every live record of a key (all pages).
  std::vector<Record> all(const Key& key, Time now) const;
  /// The keys that hold records.
  std::vector<Key> keys() const;

  std::size_t source_bytes(const PublicKey& owner) const;
  const StorageStats& stats() const { return stats_; }

 private:
  using Slot = std::pair<PublicKey, std::string>;
  struct Entry {
    Record rec;
    Time received{0};
  };
  struct KeyData {
    std::map<Slot, Entry> slots;
    Time republished{0};
  };
  void remove(const Key& key, std::map<Slot, Entry>::iterator it);
  bool evict_one_of(const PublicKey& src);

  StorageLimits limits_;
  std::map<Key, KeyData> keys_;
  std::map<PublicKey, std::size_t> source_bytes_;
  std::map<PublicKey, std::set<std::pair<Key, Slot>>> by_source_;
  StorageStats stats_;
};

}  // namespace grove::dht
