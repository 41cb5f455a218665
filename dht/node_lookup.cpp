// DhtNode's iterative lookups (node.hpp): α requests in flight over the k closest candidates,
// paged FIND_VALUE, quorum and spread gets; find_node and get are built on them. The rest of
// DhtNode is in node.cpp.
#include <algorithm>

#include "dht/node_internal.hpp"

namespace grove::dht {

// ---------------------------------------------------------------------------------------------
// Iterative lookups

std::uint64_t DhtNode::start_lookup(const Key& target, bool values, Time now, std::size_t quorum,
                                    std::function<void(Lookup&)> done, bool spread) {
  auto l = std::make_unique<Lookup>();
  const std::uint64_t lid = next_lookup_++;
  l->id = lid;
  l->target = target;
  l->values = values;
  l->quorum = quorum;
  l->spread = spread && values && quorum > 0 && quorum < opts_.k;
  l->deadline = now + opts_.lookup_deadline;
  l->done = std::move(done);
  for (const Contact& c : table_.closest(target, opts_.k))
    l->cands.emplace(distance(target, c.id), Lookup::Cand{c});
  if (values) {
    // Our own copy counts as found (we may be one of the closest nodes).
    for (Record& r : storage_.all(target, now))
      l->found.emplace(std::make_pair(r.owner, r.subkey), std::move(r));
  }
  ++stats_.lookups;
  table_.touch_bucket(table_.bucket_of(target), now);
  lookups_.emplace(lid, std::move(l));
  lookup_step(lid, now);
  return lid;
}

void DhtNode::lookup_query(Lookup& l, const Key& dist, Time now, std::optional<Cursor> cursor) {
  Lookup::Cand& c = l.cands.at(dist);
  if (c.st != Lookup::St::inflight) {
    c.st = Lookup::St::inflight;
    ++l.inflight;
  }
  ++l.queried;
  Message m;
  m.type = l.values && c.values ? MsgType::find_value : MsgType::find_node;
  m.target = l.target;
  m.cursor = std::move(cursor);
  const std::uint64_t lid = l.id;
  const Contact contact = c.c;
  send_rpc(
      Endpoint{contact.id, contact.address}, std::move(m), now,
      [this, lid, dist](const Peer&, Message& r) {
        const Time now = now_;
        auto it = lookups_.find(lid);
        if (it == lookups_.end()) return;
        Lookup& l = *it->second;
        auto cit = l.cands.find(dist);
        if (cit == l.cands.end()) return;
        Lookup::Cand& cand = cit->second;
        if (cand.st == Lookup::St::inflight) --l.inflight;
        cand.st = Lookup::St::done;  // (re-marked below if another page is fetched)
        const bool asked_values = l.values && cand.values;
        const bool expected = asked_values ? r.type == MsgType::value : r.type == MsgType::nodes;
        if (!expected) {
          cand.st = Lookup::St::failed;
          return lookup_step(lid, now);
        }
        for (const Contact& nc : r.contacts) {
          if (nc.id == id() || nc.address.empty()) continue;
          const Key d = distance(l.target, nc.id);
          if (!l.cands.count(d))
            l.cands.emplace(d, Lookup::Cand{nc, Lookup::St::fresh, cand.hop + 1});
        }
        bool got = false;
        for (Record& rec : r.records) {
          if (rec.key != l.target) {
            ++stats_.bad_records;
            continue;
          }
          auto slot = std::make_pair(rec.owner, rec.subkey);
          auto f = l.found.find(slot);
          if (f != l.found.end() &&
              (f->second.seq > rec.seq || (f->second.seq == rec.seq && f->second.sig == rec.sig))) {
            got = true;  // already have this or newer (no need to verify again)
            continue;
          }
          if (check_record(rec, now, opts_.wire.record, sig_cache_.get()) != RecordStatus::ok) {
            ++stats_.bad_records;
            continue;
          }
          got = true;
          l.found[slot] = std::move(rec);
        }
        if (asked_values) {
          if (got && cand.pages == 0) ++l.responders;
          ++cand.pages;
        }
        if (asked_values && r.cursor && cand.pages < opts_.max_pages) {
          // More records at this node: fetch the next page before counting it done.
          return lookup_query(l, dist, now, r.cursor);
        }
        lookup_step(lid, now);
      },
      [this, lid, dist] { lookup_settle(lid, dist, true); },
      // No answer within one timeout: free the slot for another node, keep listening.
      [this, lid, dist] { lookup_settle(lid, dist, false); });
}

// A request of a lookup failed (final) or is slow (one timeout passed): take it out of the
// requests in flight and let the lookup go on.
void DhtNode::lookup_settle(std::uint64_t lid, const Key& dist, bool failed) {
  auto it = lookups_.find(lid);
  if (it == lookups_.end()) return;
  Lookup& l = *it->second;
  auto cit = l.cands.find(dist);
  if (cit == l.cands.end()) return;
  auto& st = cit->second.st;
  if (st == Lookup::St::inflight) {
    --l.inflight;
  } else if (!failed || st != Lookup::St::slow) {
    return;  // answered meanwhile, or already settled
  }
  st = failed ? Lookup::St::failed : Lookup::St::slow;
  lookup_step(lid, now_);
}

void DhtNode::lookup_step(std::uint64_t lid, Time now) {
  auto it = lookups_.find(lid);
  if (it == lookups_.end()) return;
  Lookup& l = *it->second;
  if (l.finished) return;
  if (now >= l.deadline) return finish_lookup(lid);
  // Walk the k closest candidates that have not failed: ask fresh ones while fewer than alpha
  // requests are in flight. A slow request (one timeout passed, retry under way) gives up its
  // slot but still holds its place: the lookup ends only when each of the k closest answered
  // or failed, so one lost packet does not drop a true-closest node from the result.
  // Quorum gets end early: enough holders answered and nobody closer is still pending.
  // Spread gets ask each of the k closest for the records with probability 2·quorum/k (for
  // contacts only otherwise), so that the readers of a much-read key share its nearest holders
  // instead of all reading from the nearest `quorum`; when the walk ends with fewer than
  // `quorum` holders heard, that many of those asked for contacts only (drawn at random) are
  // asked again for the records.
  std::size_t considered = 0;
  bool pending = false;
  for (auto& [d, c] : l.cands) {
    if (c.st == Lookup::St::failed) continue;
    if (considered++ >= opts_.k) break;
    if (c.st == Lookup::St::fresh && l.inflight < opts_.alpha) {
      if (l.spread && !c.drawn) {
        c.drawn = true;
        c.values = rng_() % opts_.k < 2 * l.quorum;
      }
      lookup_query(l, d, now, std::nullopt);
      if (l.finished) return;
    }
    if (c.st != Lookup::St::done) pending = true;
    if (l.quorum && l.responders >= l.quorum && considered >= l.quorum && !pending)
      return finish_lookup(lid);
  }
  if (!pending && l.spread && l.responders < l.quorum) {
    std::vector<Lookup::Cand*> skipped;
    std::size_t seen = 0;
    for (auto& [d, c] : l.cands) {
      if (c.st == Lookup::St::failed) continue;
      if (seen++ >= opts_.k) break;
      if (c.st == Lookup::St::done && !c.values) skipped.push_back(&c);
    }
    if (!skipped.empty()) {
      std::shuffle(skipped.begin(), skipped.end(), rng_);
      skipped.resize(std::min(skipped.size(), l.quorum - l.responders));
      for (Lookup::Cand* c : skipped) {
        c->values = true;
        c->st = Lookup::St::fresh;
      }
      return lookup_step(lid, now);
    }
  }
  if (!pending) finish_lookup(lid);
}

void DhtNode::finish_lookup(std::uint64_t lid) {
  auto it = lookups_.find(lid);
  if (it == lookups_.end() || it->second->finished) return;
  std::unique_ptr<Lookup> l = std::move(it->second);
  lookups_.erase(it);
  l->finished = true;
  // Requests still in flight reply into nothing (their callbacks find no lookup).
  auto shared = std::shared_ptr<Lookup>(std::move(l));
  defer([shared] { shared->done(*shared); });
}

LookupResult DhtNode::result_of(const Lookup& l, std::size_t k) {
  LookupResult r;
  r.queried = l.queried;
  for (const auto& [d, c] : l.cands) {
    if (c.st != Lookup::St::done) continue;
    if (r.closest.empty()) r.hops = c.hop;
    r.closest.push_back(c.c);
    if (r.closest.size() >= k) break;
  }
  return r;
}

void DhtNode::find_node(const Key& target, Time now, NodesCallback done) {
  Entry guard(*this, now);
  const std::size_t k = opts_.k;
  start_lookup(target, false, now, 0, [done = std::move(done), k](Lookup& l) {
    if (done) done(result_of(l, k));
  });
}

void DhtNode::get(const Key& key, Time now, GetCallback done, GetOptions opts) {
  Entry guard(*this, now);
  const std::size_t k = opts_.k;
  start_lookup(
      key, true, now, opts.quorum,
      [done = std::move(done), k](Lookup& l) {
        GetResult g;
        g.lookup = result_of(l, k);
        g.responders = l.responders;
        for (auto& [slot, rec] : l.found) g.records.push_back(std::move(rec));
        if (done) done(std::move(g));
      },
      opts.spread);
}

}  // namespace grove::dht
