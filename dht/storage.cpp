#include "dht/storage.hpp"

#include <algorithm>

namespace grove::dht {

std::size_t Storage::source_bytes(const PublicKey& owner) const {
  auto it = source_bytes_.find(owner);
  return it == source_bytes_.end() ? 0 : it->second;
}

void Storage::remove(const Key& key, std::map<Slot, Entry>::iterator it) {
  auto kit = keys_.find(key);
  const Slot slot = it->first;
  const std::size_t sz = it->second.rec.footprint();
  stats_.bytes -= sz;
  --stats_.records;
  auto sb = source_bytes_.find(slot.first);
  sb->second -= sz;
  auto& owned = by_source_[slot.first];
  owned.erase({key, slot});
  if (owned.empty()) {
    by_source_.erase(slot.first);
    source_bytes_.erase(sb);
  }
  kit->second.slots.erase(it);
  if (kit->second.slots.empty()) keys_.erase(kit);
  stats_.keys = keys_.size();
  stats_.sources = source_bytes_.size();
}

// Evicts the record of `src` that expires first.
bool Storage::evict_one_of(const PublicKey& src) {
  auto bs = by_source_.find(src);
  if (bs == by_source_.end() || bs->second.empty()) return false;
  const std::pair<Key, Slot>* victim = nullptr;
  Time soonest = Time::max();
  for (const auto& ks : bs->second) {
    const auto& e = keys_.at(ks.first).slots.at(ks.second);
    if (e.rec.expires < soonest) soonest = e.rec.expires, victim = &ks;
  }
  const auto ks = *victim;
  auto& slots = keys_.at(ks.first).slots;
  remove(ks.first, slots.find(ks.second));
  ++stats_.evicted;
  return true;
}

StoreCode Storage::put(const Record& r, Time now) {
  const Slot slot{r.owner, r.subkey};
  const std::size_t sz = r.footprint();
  auto kit = keys_.find(r.key);
  if (kit != keys_.end()) {
    auto sit = kit->second.slots.find(slot);
    if (sit != kit->second.slots.end()) {
      Entry& e = sit->second;
      if (r.seq < e.rec.seq) return StoreCode::stale;
      if (r.seq == e.rec.seq) {
        if (r.sig != e.rec.sig) return StoreCode::stale;
        e.received = now;
        return StoreCode::unchanged;
      }
      const std::size_t old = e.rec.footprint();
      const std::size_t src = source_bytes(r.owner);
      if (sz > old && (src + sz - old > limits_.max_bytes_per_source ||
                       stats_.bytes + sz - old > limits_.max_bytes)) {
        ++stats_.refused;
        return StoreCode::over_quota;
      }
      source_bytes_[r.owner] = src + sz - old;
      stats_.bytes = stats_.bytes + sz - old;
      e.rec = r;
      e.received = now;
      return StoreCode::updated;
    }
  }
  // A new slot.
  const std::size_t mine = source_bytes(r.owner);
  if (mine + sz > limits_.max_bytes_per_source || sz > limits_.max_bytes) {
    ++stats_.refused;
    return StoreCode::over_quota;
  }
  if (kit != keys_.end() && kit->second.slots.size() >= limits_.max_records_per_key) {
    // The key is full: the record whose source uses the most bytes gives way, if that source
    // uses more than the newcomer's would.
    auto victim = kit->second.slots.end();
    std::size_t most = 0;
    for (auto it = kit->second.slots.begin(); it != kit->second.slots.end(); ++it) {
      const std::size_t u = source_bytes(it->first.first);
      if (u > most) most = u, victim = it;
    }
    if (victim == kit->second.slots.end() || most <= mine + sz) {
      ++stats_.refused;
      return StoreCode::over_quota;
    }
    remove(r.key, victim);
    ++stats_.evicted;
  }
  while (stats_.bytes + sz > limits_.max_bytes) {
    auto largest =
        std::max_element(source_bytes_.begin(), source_bytes_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    if (largest == source_bytes_.end() || largest->first == r.owner ||
        largest->second <= mine + sz) {
      ++stats_.refused;
      return StoreCode::over_quota;
    }
    evict_one_of(largest->first);
  }
  auto& kd = keys_[r.key];
  kd.slots.emplace(slot, Entry{r, now});
  source_bytes_[r.owner] += sz;
  by_source_[r.owner].insert({r.key, slot});
  stats_.bytes += sz;
  ++stats_.records;
  stats_.keys = keys_.size();
  stats_.sources = source_bytes_.size();
  return StoreCode::stored;
}

std::vector<Record> Storage::get(const Key& key, Time now, const std::optional<Cursor>& after,
                                 std::size_t max_records, std::size_t max_bytes,
                                 std::optional<Cursor>& next) const {
  next.reset();
  std::vector<Record> out;
  auto kit = keys_.find(key);
  if (kit == keys_.end()) return out;
  const auto& slots = kit->second.slots;
  auto it = after ? slots.upper_bound(Slot{after->owner, after->subkey}) : slots.begin();
  std::size_t bytes = 0;
  for (; it != slots.end(); ++it) {
    const Record& r = it->second.rec;
    if (r.expires <= now) continue;
    if (!out.empty() && (out.size() >= max_records || bytes + r.footprint() > max_bytes)) {
      const Record& last = out.back();
      next = Cursor{last.owner, last.subkey};
      break;
    }
    bytes += r.footprint();
    out.push_back(r);
  }
  return out;
}

std::vector<Record> Storage::all(const Key& key, Time now) const {
  std::vector<Record> out;
  auto kit = keys_.find(key);
  if (kit == keys_.end()) return out;
  for (const auto& [slot, e] : kit->second.slots)
    if (e.rec.expires > now) out.push_back(e.rec);
  return out;
}

std::vector<Key> Storage::keys() const {
  std::vector<Key> out;
  out.reserve(keys_.size());
  for (const auto& [key, kd] : keys_) out.push_back(key);
  return out;
}

void Storage::expire(Time now) {
  for (auto kit = keys_.begin(); kit != keys_.end();) {
    const Key key = kit->first;
    auto& slots = kit->second.slots;
    bool erased_key = false;
    for (auto it = slots.begin(); it != slots.end();) {
      if (it->second.rec.expires <= now) {
        auto cur = it++;
        const bool last = slots.size() == 1;
        remove(key, cur);
        if (last) {
          erased_key = true;
          break;
        }
      } else {
        ++it;
      }
    }
    kit = erased_key ? keys_.upper_bound(key) : std::next(kit);
  }
}

std::vector<Key> Storage::take_keys_to_republish(Time before, Time now) {
  std::vector<Key> out;
  for (auto& [key, kd] : keys_) {
    if (kd.republished >= before) continue;
    // Republish only if some record was not itself received recently (someone else
    // republished it to us: no need to do it again, as in Kademlia).
    const bool stale = std::any_of(kd.slots.begin(), kd.slots.end(), [&](const auto& s) {
      return s.second.received < before && s.second.rec.expires > now;
    });
    if (!stale) continue;
    kd.republished = now;
    out.push_back(key);
  }
  return out;
}

}  // namespace grove::dht
