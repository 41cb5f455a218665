#include "dht/routing_table.hpp"

#include <algorithm>

namespace grove::dht {

RoutingTable::RoutingTable(const NodeId& self, RoutingOptions opts)
    : self_(self), opts_(opts), buckets_(kKeyBits) {}

int RoutingTable::bucket_of(const NodeId& id) const {
  return std::min(common_prefix_bits(self_, id), kKeyBits - 1);
}

std::optional<Contact> RoutingTable::heard_from(const Contact& c, Time now) {
  if (c.id == self_ || c.address.empty()) return std::nullopt;
  Bucket& b = buckets_[bucket_of(c.id)];
  if (!dormant_.empty()) std::erase_if(dormant_, [&](const Contact& d) { return d.id == c.id; });
  auto it = std::find_if(b.live.begin(), b.live.end(),
                         [&](const RoutingEntry& e) { return e.contact.id == c.id; });
  if (it != b.live.end()) {
    RoutingEntry e = *it;
    e.contact.address = c.address;  // a node may come back on another port
    e.last_seen = now;
    e.fails = 0;
    b.live.erase(it);
    b.live.push_back(std::move(e));
    return std::nullopt;
  }
  // Drop it from the replacement cache if there (it is re-added below if still needed).
  std::erase_if(b.spare, [&](const RoutingEntry& e) { return e.contact.id == c.id; });
  if (b.live.size() < opts_.k) {
    b.live.push_back({c, now, 0, false});
    ++size_;
    return std::nullopt;
  }
  // Full: replace an entry that has been failing, if any.
  auto worst = std::max_element(
      b.live.begin(), b.live.end(),
      [](const RoutingEntry& x, const RoutingEntry& y) { return x.fails < y.fails; });
  if (worst->fails > 0) {
    bury(worst->contact);
    b.live.erase(worst);
    b.live.push_back({c, now, 0, false});
    return std::nullopt;
  }
  b.spare.push_back({c, now, 0, false});
  while (b.spare.size() > opts_.k) b.spare.pop_front();
  RoutingEntry& oldest = b.live.front();
  if (!oldest.pinging && now - oldest.last_seen > opts_.stale_after) {
    oldest.pinging = true;
    return oldest.contact;
  }
  return std::nullopt;
}

void RoutingTable::failed(const NodeId& id) {
  Bucket& b = buckets_[bucket_of(id)];
  auto it = std::find_if(b.live.begin(), b.live.end(),
                         [&](const RoutingEntry& e) { return e.contact.id == id; });
  if (it == b.live.end()) {
    std::erase_if(b.spare, [&](const RoutingEntry& e) { return e.contact.id == id; });
    return;
  }
  ++it->fails;
  if (!b.spare.empty() && it->fails >= opts_.max_fails) {
    bury(it->contact);
    b.live.erase(it);
    RoutingEntry r = std::move(b.spare.back());  // the most recently heard replacement
    b.spare.pop_back();
    // Keep the least-recently-seen-first order.
    auto pos = std::upper_bound(b.live.begin(), b.live.end(), r.last_seen,
                                [](Time t, const RoutingEntry& e) { return t < e.last_seen; });
    b.live.insert(pos, std::move(r));
  } else if (it->fails >= opts_.max_fails_alone) {
    bury(it->contact);
    b.live.erase(it);
    --size_;
  }
}

void RoutingTable::ping_done(const NodeId& id) {
  Bucket& b = buckets_[bucket_of(id)];
  for (auto& e : b.live)
    if (e.contact.id == id) e.pinging = false;
}

std::vector<Contact> RoutingTable::closest(const Key& target, std::size_t n) const {
  std::vector<const RoutingEntry*> all;
  all.reserve(size_);
  for (const auto& b : buckets_)
    for (const auto& e : b.live) all.push_back(&e);
  auto less = [&](const RoutingEntry* a, const RoutingEntry* b) {
    const bool fa = a->fails > 0, fb = b->fails > 0;
    if (fa != fb) return fb;  // healthy first
    return closer(target, a->contact.id, b->contact.id);
  };
  const std::size_t m = std::min(n, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(m), all.end(), less);
  std::vector<Contact> out;
  out.reserve(m);
  for (std::size_t i = 0; i < m; ++i) out.push_back(all[i]->contact);
  std::sort(out.begin(), out.end(),
            [&](const Contact& a, const Contact& b) { return closer(target, a.id, b.id); });
  return out;
}

bool RoutingTable::contains(const NodeId& id) const {
  const Bucket& b = buckets_[bucket_of(id)];
  return std::any_of(b.live.begin(), b.live.end(),
                     [&](const RoutingEntry& e) { return e.contact.id == id; });
}

std::size_t RoutingTable::replacement_count() const {
  std::size_t n = 0;
  for (const auto& b : buckets_) n += b.spare.size();
  return n;
}

int RoutingTable::depth() const {
  for (int i = kKeyBits - 1; i >= 0; --i)
    if (!buckets_[i].live.empty()) return i;
  return -1;
}

std::vector<int> RoutingTable::take_stale_buckets(Time now, Time interval) {
  std::vector<int> out;
  const int last = std::min(depth() + 1, kKeyBits - 1);
  for (int i = 0; i <= last; ++i) {
    if (now - buckets_[i].refreshed >= interval) {
      buckets_[i].refreshed = now;
      out.push_back(i);
    }
  }
  return out;
}

void RoutingTable::touch_bucket(int b, Time now) {
  if (b >= 0 && b < kKeyBits) buckets_[b].refreshed = now;
}

void RoutingTable::bury(const Contact& c) {
  std::erase(dormant_, c);
  dormant_.push_back(c);
  while (dormant_.size() > 4 * opts_.k) dormant_.pop_front();
}

std::vector<Contact> RoutingTable::take_dormant(std::size_t n) {
  std::vector<Contact> out;
  // Rotate: a contact stays dormant (and is tried again later) until it is heard from or
  // pushed out by newer evictions.
  for (std::size_t i = 0; i < n && i < dormant_.size(); ++i) {
    out.push_back(dormant_.front());
    dormant_.pop_front();
    dormant_.push_back(out.back());
  }
  return out;
}

std::vector<RoutingEntry> RoutingTable::entries() const {
  std::vector<RoutingEntry> out;
  for (const auto& b : buckets_) out.insert(out.end(), b.live.begin(), b.live.end());
  return out;
}

}  // namespace grove::dht
