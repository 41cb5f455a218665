// DhtNode (node.hpp): the driver interface, the requests we answer, our RPCs, storing, bootstrap
// and maintenance. The iterative lookups are in node_lookup.cpp; the state of operations in
// flight is in node_internal.hpp.
#include "dht/node.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "dht/node_internal.hpp"

namespace grove::dht {

DhtNode::DhtNode(std::shared_ptr<const transport::Identity> identity, std::string address,
                 DhtOptions opts, std::uint64_t seed)
    : identity_(std::move(identity)),
      address_(std::move(address)),
      opts_(opts),
      rng_(seed),
      table_(identity_->id(),
             [&] {
               RoutingOptions r = opts.routing;
               r.k = opts.k;
               return r;
             }()),
      storage_(opts.storage) {}

DhtNode::~DhtNode() = default;

// ---------------------------------------------------------------------------------------------
// Driver interface

// Every public entry point holds one: it advances now_ and counts the nesting, and the
// outermost one runs the deferred callbacks when it returns.
DhtNode::Entry::Entry(DhtNode& n, Time now) : node(n) {
  n.now_ = std::max(n.now_, now);
  ++n.depth_;
}
DhtNode::Entry::~Entry() {
  if (--node.depth_ == 0) node.flush();
}

void DhtNode::flush() {
  while (!deferred_.empty()) {
    auto fns = std::move(deferred_);
    deferred_.clear();
    ++depth_;
    for (auto& f : fns) f();
    --depth_;
  }
}

std::vector<Outgoing> DhtNode::take_outgoing() {
  std::vector<Outgoing> o;
  o.swap(out_);
  return o;
}

Time DhtNode::next_deadline() const {
  Time t = next_maintenance_;
  if (!rpc_deadlines_.empty()) t = std::min(t, rpc_deadlines_.begin()->first);
  return t;
}

// At most one warning a second: a peer sending garbage must not flood the log.
bool DhtNode::may_warn(Time now) {
  if (now - last_warn_ < Time(1000)) return false;
  last_warn_ = now;
  return true;
}

bool DhtNode::admit(const NodeId& from, Time now) {
  auto it = rate_.find(from);
  if (it == rate_.end()) {
    if (rate_.size() >= opts_.rate_sources) {
      // Forget the source idle the longest (a full bucket again when it returns).
      auto oldest = std::min_element(rate_.begin(), rate_.end(), [](const auto& a, const auto& b) {
        return a.second.last < b.second.last;
      });
      rate_.erase(oldest);
    }
    it = rate_.emplace(from, RateBucket{opts_.rate_burst, now}).first;
  }
  RateBucket& b = it->second;
  const double dt = std::chrono::duration<double>(now - b.last).count();
  b.tokens = std::min(opts_.rate_burst, b.tokens + std::max(0.0, dt) * opts_.rate_per_second);
  b.last = std::max(b.last, now);
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

void DhtNode::on_message(const Peer& from, std::span<const std::uint8_t> bytes, Time now) {
  Entry guard(*this, now);
  ++stats_.messages_in;
  if (from.id == id()) return;
  auto m = decode(bytes, opts_.wire);
  if (!m) {
    ++stats_.malformed;
    if (may_warn(now)) {
      spdlog::warn("dht: dropped a malformed message ({} bytes) from {} at {} ({} so far)",
                   bytes.size(), short_hex(from.id), from.observed_address, stats_.malformed);
    }
    return;
  }
  if (is_request(m->type)) {
    if (!admit(from.id, now)) {
      ++stats_.rate_limited;
      return;  // dropped: the flooder's own requests time out; nobody else's are delayed
    }
  }
  const bool known = table_.contains(from.id);
  if (auto stale = table_.heard_from(Contact{from.id, m->sender_address}, now)) {
    // The bucket is full: check that its oldest entry is still alive.
    const NodeId sid = stale->id;
    ping(Endpoint{stale->id, stale->address}, now, [this, sid](bool) { table_.ping_done(sid); });
  }
  if (!known && table_.contains(from.id)) hand_over(Contact{from.id, m->sender_address}, now);
  if (is_request(m->type))
    handle_request(from, *m, now);
  else
    handle_reply(from, std::move(*m), now);
}

void DhtNode::on_send_failed(std::uint64_t txid, Time now) {
  Entry guard(*this, now);
  if (rpcs_.count(txid)) rpc_failed(txid, false);
}

void DhtNode::on_timer(Time now) {
  Entry guard(*this, now);
  while (!rpc_deadlines_.empty() && rpc_deadlines_.begin()->first <= now) {
    const std::uint64_t txid = rpc_deadlines_.begin()->second;
    rpc_deadlines_.erase(rpc_deadlines_.begin());
    auto it = rpcs_.find(txid);
    if (it == rpcs_.end()) continue;
    Rpc& r = *it->second;
    if (r.retries_left > 0) {
      --r.retries_left;
      r.deadline = now + opts_.rpc_timeout;
      rpc_deadlines_.insert({r.deadline, txid});
      out_.push_back({r.to, r.bytes, txid});
      ++stats_.messages_out;
      if (auto slow = std::move(r.on_slow)) {
        r.on_slow = nullptr;
        slow();
      }
    } else {
      rpc_failed(txid, true);
    }
  }
  if (now >= next_maintenance_) {
    next_maintenance_ = now + opts_.maintenance_interval;
    maintenance(now);
  }
}

// ---------------------------------------------------------------------------------------------
// Requests we answer

void DhtNode::reply(const Peer& from, const Message& req, Message m) {
  m.txid = req.txid;
  m.sender_address = address_;
  out_.push_back({Endpoint{from.id, req.sender_address}, encode(m), 0});
  ++stats_.messages_out;
}

void DhtNode::handle_request(const Peer& from, const Message& m, Time now) {
  Message r;
  switch (m.type) {
    case MsgType::ping:
      r.type = MsgType::pong;
      r.observed = from.observed_address;
      break;
    case MsgType::find_node:
      r.type = MsgType::nodes;
      r.contacts = table_.closest(m.target, opts_.k);
      break;
    case MsgType::find_value: {
      r.type = MsgType::value;
      r.records =
          storage_.get(m.target, now, m.cursor, opts_.page_records, opts_.page_bytes, r.cursor);
      if (!m.cursor) r.contacts = table_.closest(m.target, opts_.k);
      break;
    }
    case MsgType::store: {
      r.type = MsgType::stored;
      for (const Record& rec : m.records) {
        const RecordStatus st = check_record(rec, now, opts_.wire.record, sig_cache_.get());
        if (st != RecordStatus::ok) {
          ++stats_.bad_records;
          if (may_warn(now)) {
            // How late an expired record came says where it waited (a sender whose writes queue
            // behind bulk data, or a receiver whose strand was busy).
            const std::string late =
                st == RecordStatus::expired
                    ? fmt::format(" {} ms ago (key {}, {} bytes)", (now - rec.expires).count(),
                                  short_hex(rec.key), rec.value.size())
                    : std::string();
            spdlog::warn("dht: refused a record from {} ({}): {}{}", short_hex(from.id),
                         from.observed_address, to_string(st), late);
          }
          r.codes.push_back(StoreCode::invalid);
          continue;
        }
        r.codes.push_back(storage_.put(rec, now));
      }
      break;
    }
    default:
      return;
  }
  reply(from, m, std::move(r));
}

// ---------------------------------------------------------------------------------------------
// Our requests

std::uint64_t DhtNode::send_rpc(const Endpoint& to, Message m, Time now,
                                std::function<void(const Peer&, Message&)> on_reply,
                                std::function<void()> on_fail, std::function<void()> on_slow) {
  if (rpcs_.size() >= opts_.max_rpcs) {
    ++stats_.rpc_failures;
    defer(std::move(on_fail));
    return 0;
  }
  std::uint64_t txid;
  do txid = rng_();
  while (txid == 0 || rpcs_.count(txid));
  m.txid = txid;
  m.sender_address = address_;
  auto r = std::make_unique<Rpc>();
  r->txid = txid;
  r->to = to;
  r->bytes = encode(m);
  r->deadline = now + opts_.rpc_timeout;
  r->retries_left = opts_.rpc_retries;
  r->on_reply = std::move(on_reply);
  r->on_fail = std::move(on_fail);
  r->on_slow = std::move(on_slow);
  out_.push_back({to, r->bytes, txid});
  ++stats_.messages_out;
  ++stats_.rpcs_sent;
  rpc_deadlines_.insert({r->deadline, txid});
  rpcs_.emplace(txid, std::move(r));
  return txid;
}

void DhtNode::rpc_failed(std::uint64_t txid, bool timeout) {
  auto it = rpcs_.find(txid);
  if (it == rpcs_.end()) return;
  std::unique_ptr<Rpc> r = std::move(it->second);
  rpcs_.erase(it);
  rpc_deadlines_.erase({r->deadline, txid});
  if (timeout)
    ++stats_.rpc_timeouts;
  else
    ++stats_.rpc_failures;
  if (r->to.id) table_.failed(*r->to.id);
  if (r->on_fail) r->on_fail();
}

void DhtNode::handle_reply(const Peer& from, Message m, Time) {
  auto it = rpcs_.find(m.txid);
  if (it == rpcs_.end() || (it->second->to.id && *it->second->to.id != from.id)) {
    ++stats_.unexpected_replies;  // late (already timed out), or not from whom we asked
    return;
  }
  std::unique_ptr<Rpc> r = std::move(it->second);
  rpcs_.erase(it);
  rpc_deadlines_.erase({r->deadline, r->txid});
  if (m.type == MsgType::error) {
    ++stats_.rpc_failures;
    if (r->on_fail) r->on_fail();
    return;
  }
  if (r->on_reply) r->on_reply(from, m);
}

void DhtNode::ping(const Endpoint& e, Time now, PingCallback done) {
  Entry guard(*this, now);
  Message m;
  m.type = MsgType::ping;
  auto shared = std::make_shared<PingCallback>(std::move(done));
  send_rpc(
      e, std::move(m), now,
      [shared](const Peer&, Message& r) {
        if (*shared) (*shared)(r.type == MsgType::pong);
      },
      [shared] {
        if (*shared) (*shared)(false);
      });
}

void DhtNode::add_contact(const Endpoint& e, Time now, PingCallback done) {
  if (e.id && *e.id == id()) return;
  ping(e, now, std::move(done));
}

// ---------------------------------------------------------------------------------------------
// Storing

void DhtNode::put(std::vector<Record> records, Time now, PutCallback done) {
  Entry guard(*this, now);
  if (records.empty()) {
    if (done) defer([done] { done(PutResult{}); });
    return;
  }
  const Key key = records.front().key;
  std::erase_if(records, [&](const Record& r) { return r.key != key; });
  for (const Record& r : records)
    if (r.owner == identity_->public_key()) own_[{r.key, {r.owner, r.subkey}}] = r;
  replicate(std::move(records), now, std::move(done));
}

// Finds the k closest nodes to the records' key and stores the records on them.
void DhtNode::replicate(std::vector<Record> records, Time now, PutCallback done) {
  const Key key = records.front().key;
  start_lookup(key, false, now, 0,
               [this, records = std::move(records), done = std::move(done)](Lookup& l) mutable {
                 // The lookup took time: a record that expired meanwhile is not sent (its
                 // receivers would refuse it, and log that they did).
                 std::erase_if(records, [&](const Record& r) { return r.expires <= now_; });
                 if (records.empty()) {
                   if (done) done(PutResult{});
                   return;
                 }
                 store_on(result_of(l, opts_.k).closest, records, now_, done);
               });
}

void DhtNode::put_signed(const Key& key, std::string subkey, std::uint64_t seq, Time expires,
                         std::vector<std::uint8_t> value, Time now, PutCallback done) {
  put({make_record(*identity_, key, std::move(subkey), seq, expires, std::move(value))}, now,
      std::move(done));
}

void DhtNode::do_read(const Key& key, Time now, ReadDone done, GetOptions opts) {
  get(
      key, now, [done = std::move(done)](GetResult r) { done(std::move(r.records)); }, opts);
}

Record DhtNode::do_write(const Key& key, std::string subkey, std::uint64_t seq, Time expires,
                         std::vector<std::uint8_t> value, Time now, WriteDone done) {
  Record r = make_record(*identity_, key, std::move(subkey), seq, expires, std::move(value));
  put({r}, now, [done = std::move(done)](PutResult p) {
    if (done) done(p.acked > 0 || p.local);
  });
  return r;
}

void DhtNode::forget(const Key& key, const std::string& subkey) {
  own_.erase({key, {identity_->public_key(), subkey}});
}

// Kademlia's hand-over (Maymounkov & Mazieres 2002, section 2.5): a node that enters our table
// may be one of the k closest to keys we hold. For each such key, the holder nearest to it (as
// far as our table knows, the newcomer aside) sends it the key's records, so that a record put
// while the swarm was small (a bootstrap node's state offer, stored on itself alone) is found by
// later joiners at once instead of after the next republish. Only the nearest holder sends:
// the newcomer gets one copy, not k.
void DhtNode::hand_over(const Contact& newcomer, Time now) {
  for (const Key& key : storage_.keys()) {
    const auto near = table_.closest(key, opts_.k);
    const bool among = std::any_of(near.begin(), near.end(),
                                   [&](const Contact& c) { return c.id == newcomer.id; });
    if (!among) continue;
    const bool nearest = std::none_of(near.begin(), near.end(), [&](const Contact& c) {
      return c.id != newcomer.id && closer(key, c.id, id());
    });
    if (!nearest) continue;
    auto recs = storage_.all(key, now);
    if (!recs.empty()) store_on({newcomer}, std::move(recs), now, nullptr, false);
  }
}

void DhtNode::store_on(std::vector<Contact> targets, std::vector<Record> records, Time now,
                       PutCallback done, bool keep_local) {
  auto op = std::make_shared<PutOp>();
  op->done = std::move(done);
  // Keep a copy ourselves when we are among the k closest to the key.
  const Key key = records.front().key;
  if (keep_local && (targets.size() < opts_.k || closer(key, id(), targets.back().id))) {
    bool any = false;
    for (const Record& r : records) {
      if (check_record(r, now, opts_.wire.record, sig_cache_.get()) != RecordStatus::ok) continue;
      const StoreCode c = storage_.put(r, now);
      any |= c == StoreCode::stored || c == StoreCode::updated || c == StoreCode::unchanged;
    }
    op->result.local = any;
  }
  auto finish_one = [this, op] {
    if (--op->pending == 0 && op->done) {
      auto d = std::move(op->done);
      op->done = nullptr;
      PutResult res = op->result;
      defer([d, res] { d(res); });
    }
  };
  for (const Contact& c : targets) {
    for (std::size_t i = 0; i < records.size(); i += opts_.wire.max_store_records) {
      Message m;
      m.type = MsgType::store;
      const std::size_t end = std::min(records.size(), i + opts_.wire.max_store_records);
      m.records.assign(records.begin() + static_cast<std::ptrdiff_t>(i),
                       records.begin() + static_cast<std::ptrdiff_t>(end));
      const bool first = i == 0;
      ++op->pending;
      if (first) ++op->result.tried;
      send_rpc(
          Endpoint{c.id, c.address}, std::move(m), now,
          [op, first, finish_one](const Peer&, Message& r) {
            const bool ok = r.type == MsgType::stored && !r.codes.empty() &&
                            std::all_of(r.codes.begin(), r.codes.end(), [](StoreCode s) {
                              return s == StoreCode::stored || s == StoreCode::updated ||
                                     s == StoreCode::unchanged;
                            });
            if (ok && first) ++op->result.acked;
            finish_one();
          },
          finish_one);
    }
  }
  if (op->pending == 0 && op->done) {
    auto d = std::move(op->done);
    PutResult res = op->result;
    defer([d, res] { d(res); });
  }
}

// ---------------------------------------------------------------------------------------------
// Bootstrap and maintenance

void DhtNode::bootstrap(std::vector<std::string> addresses, Time now,
                        std::function<void(std::size_t)> done) {
  Entry guard(*this, now);
  bootstrap_ = addresses;
  last_rebootstrap_ = now;
  std::erase(addresses, address_);
  auto pending = std::make_shared<std::size_t>(addresses.size());
  auto after = [this, done] {
    // Fill the table around our own ID; the stale-bucket refresh does the rest.
    find_node(id(), now_, [this, done](LookupResult) {
      if (done) done(table_.size());
    });
  };
  if (addresses.empty()) return after();
  for (const auto& a : addresses)
    ping(Endpoint{std::nullopt, a}, now, [pending, after](bool) {
      if (--*pending == 0) after();
    });
}

void DhtNode::maintenance(Time now) {
  storage_.expire(now);
  // Re-bootstrap after losing every contact (network outage, all peers gone).
  if (table_.size() == 0 && !bootstrap_.empty() &&
      now - last_rebootstrap_ >= opts_.rebootstrap_interval) {
    last_rebootstrap_ = now;
    bootstrap(bootstrap_, now);
  }
  // Revive: evicted contacts may be back (a healed partition); bootstrap nodes too.
  if (now - last_revive_ >= opts_.revive_interval) {
    last_revive_ = now;
    for (const Contact& c : table_.take_dormant(3)) ping(Endpoint{c.id, c.address}, now, nullptr);
    if (table_.size() < opts_.k)
      for (const auto& a : bootstrap_)
        if (a != address_) ping(Endpoint{std::nullopt, a}, now, nullptr);
  }
  // Bucket refresh: a lookup for a random ID in every bucket nobody looked into lately.
  if (table_.size() > 0) {
    for (int b : table_.take_stale_buckets(now, opts_.refresh_interval))
      find_node(random_key_in_bucket(id(), b, rng_), now, nullptr);
  }
  // Republish what we store for others (Kademlia: keys nobody republished to us lately) ...
  for (const Key& key : storage_.take_keys_to_republish(now - opts_.republish_interval, now)) {
    auto recs = storage_.all(key, now);
    if (!recs.empty()) replicate(std::move(recs), now, nullptr);
  }
  // ... and our own records, so the nodes now closest to their keys hold them.
  if (now - own_republished_ >= opts_.republish_interval) {
    own_republished_ = now;
    std::map<Key, std::vector<Record>> by_key;
    for (auto it = own_.begin(); it != own_.end();) {
      if (it->second.expires <= now) {
        it = own_.erase(it);
      } else {
        by_key[it->first.first].push_back(it->second);
        ++it;
      }
    }
    for (auto& [key, recs] : by_key) replicate(std::move(recs), now, nullptr);
  }
  // Lookups past their deadline end with what they have.
  std::vector<std::uint64_t> late;
  for (auto& [lid, l] : lookups_)
    if (now >= l->deadline) late.push_back(lid);
  for (auto lid : late) finish_lookup(lid);
}

}  // namespace grove::dht
