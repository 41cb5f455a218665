#include "gossip/state_sync.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <msgpack.hpp>

#include <spdlog/spdlog.h>

#include "gossip/state_check.hpp"
#include "transport/crypto.hpp"
#include "transport/frame.hpp"
#include "transport/schema.hpp"

namespace grove::gossip {

using transport::errc;

namespace {
namespace sc = transport::schema;
constexpr auto manifest_schema(std::size_t max_chunks) {
  return sc::record<StateManifest>(
      "state manifest", 1, sc::field("run", &StateManifest::run_id, sc::Str{64, 1}),
      sc::field("round", &StateManifest::round, sc::Uint{}),
      sc::field("size", &StateManifest::size, sc::Uint{}),
      sc::field("chunk_bytes", &StateManifest::chunk_bytes, sc::Uint{}),
      sc::field("chunks", &StateManifest::chunks, sc::List<sc::Bin>{max_chunks, sc::Bin{32}}));
}
constexpr auto kOfferSchema = sc::record<StateOffer>(
    "state offer", 2, sc::field("address", &StateOffer::address, sc::Str{256}),
    sc::field("run", &StateOffer::run_id, sc::Str{64, 1}),
    sc::field("round", &StateOffer::round, sc::Uint{}),
    sc::field("size", &StateOffer::size, sc::Uint{}),
    sc::field("root", &StateOffer::root, sc::Bin{32}),
    sc::field("deltas", &StateOffer::deltas,
              sc::list(kMaxOfferDeltas,
                       sc::row<DeltaOffer>("state delta",
                                           sc::field("round", &DeltaOffer::round, sc::Uint{}),
                                           sc::field("size", &DeltaOffer::size, sc::Uint{}),
                                           sc::field("root", &DeltaOffer::root, sc::Bin{32}),
                                           sc::field("from", &DeltaOffer::from, sc::Bin{32}),
                                           sc::field("to", &DeltaOffer::to, sc::Bin{32})))));
constexpr auto kRequestSchema = sc::record<StateRequest>(
    "state request", 1, sc::field("root", &StateRequest::root, sc::Bin{32}),
    sc::field("index", &StateRequest::index, sc::Maybe<sc::Uint>{}));
}  // namespace

// ---- manifest, offer, request ----

std::vector<std::uint8_t> encode_manifest(const StateManifest& m) {
  return sc::encode(manifest_schema(m.chunks.size()), m);
}

transport::Result<StateManifest> decode_manifest(std::span<const std::uint8_t> bytes,
                                                 std::size_t max_chunks) {
  auto m = sc::decode(manifest_schema(max_chunks), bytes);
  if (!m) return m;
  if (m->chunk_bytes == 0) return {errc::malformed, "state manifest: chunk size 0"};
  if (m->chunks.size() != (m->size + m->chunk_bytes - 1) / m->chunk_bytes)
    return {errc::malformed, "state manifest: the chunk count does not match the size"};
  return m;
}

Digest manifest_root(std::span<const std::uint8_t> manifest_bytes) {
  return transport::blake2b_256(manifest_bytes);
}

std::vector<std::uint8_t> encode_offer(const StateOffer& o) {
  return sc::encode(kOfferSchema, o);
}

transport::Result<StateOffer> decode_offer(std::span<const std::uint8_t> value) {
  return sc::decode(kOfferSchema, value);
}

std::uint64_t offer_head(const StateOffer& o) {
  std::uint64_t head = o.round;
  const DeltaOffer* last = nullptr;
  for (const auto& d : o.deltas) {
    if (d.round != head + 1 || (last && d.from != last->to)) continue;
    head = d.round;
    last = &d;
  }
  return head;
}

dht::Key state_key(const std::string& run_id) {
  return dht::key_of("grove/run/" + run_id + "/state");
}

std::vector<std::uint8_t> encode_state_request(const StateRequest& r) {
  return sc::encode(kRequestSchema, r);
}

transport::Result<StateRequest> decode_state_request(std::span<const std::uint8_t> bytes) {
  return sc::decode(kRequestSchema, bytes);
}

// ---- donor side ----

transport::Result<std::shared_ptr<const StateSnapshot>> StateSnapshot::of(
    std::string run_id, std::uint64_t round, std::shared_ptr<const StateBlob> blob,
    std::uint32_t chunk_bytes) {
  if (!blob) blob = memory_blob({});
  if (chunk_bytes == 0) return {errc::rejected, "snapshot chunk size 0"};
  StateManifest m;
  m.run_id = std::move(run_id);
  m.round = round;
  m.size = blob->size();
  m.chunk_bytes = chunk_bytes;
  std::vector<std::uint8_t> buf(
      static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, m.size)));
  for (std::uint64_t off = 0; off < m.size; off += chunk_bytes) {
    const auto piece = std::span(buf).first(
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, m.size - off)));
    if (auto r = blob->read(off, piece); !r) return r.failure();
    m.chunks.push_back(transport::blake2b_256(piece));
  }
  return std::shared_ptr<const StateSnapshot>(new StateSnapshot(std::move(blob), std::move(m)));
}

StateSnapshot::StateSnapshot(std::shared_ptr<const StateBlob> blob, StateManifest m)
    : blob_(std::move(blob)), manifest_(std::move(m)) {
  manifest_bytes_ = encode_manifest(manifest_);
  root_ = manifest_root(manifest_bytes_);
}

StateSnapshot::StateSnapshot(std::string run_id, std::uint64_t round,
                             std::vector<std::uint8_t> blob, std::uint32_t chunk_bytes)
    : StateSnapshot(**of(std::move(run_id), round, memory_blob(std::move(blob)), chunk_bytes)) {}

transport::Result<std::vector<std::uint8_t>> StateSnapshot::chunk(std::uint32_t i) const {
  if (i >= chunks()) return {errc::rejected, "no such chunk"};
  const std::uint64_t off = std::uint64_t{i} * manifest_.chunk_bytes;
  std::vector<std::uint8_t> b(
      static_cast<std::size_t>(std::min<std::uint64_t>(manifest_.chunk_bytes, size() - off)));
  if (auto r = blob_->read(off, b); !r) return r.failure();
  return b;
}

// Newest first: an older snapshot stays while it fits in the budget (with `held` bytes already
// held) or a joiner asked for it since the last add(); at most `room` of them.
std::vector<std::shared_ptr<const StateSnapshot>> StateServer::prune(std::uint64_t held,
                                                                     std::size_t room) {
  std::vector<Held> kept;
  std::vector<std::shared_ptr<const StateSnapshot>> dropped;
  for (auto it = snaps_.rbegin(); it != snaps_.rend(); ++it) {
    if (kept.size() >= room || (!it->asked && held + it->snap->size() > budget_)) {
      dropped.push_back(it->snap);
      continue;
    }
    held += it->snap->size();
    kept.push_back({it->snap, it->asked});
  }
  snaps_.assign(kept.rbegin(), kept.rend());
  return dropped;
}

std::vector<std::shared_ptr<const StateSnapshot>> StateServer::add(
    std::shared_ptr<const StateSnapshot> s) {
  std::lock_guard lock(mu_);
  auto dropped = prune(s->size(), std::max<std::size_t>(keep_, 1) - 1);
  for (auto& h : snaps_) h.asked = false;
  snaps_.push_back({std::move(s)});
  return dropped;
}

std::vector<std::shared_ptr<const StateSnapshot>> StateServer::add_delta(
    std::shared_ptr<const StateSnapshot> s) {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<const StateSnapshot>> dropped;
  deltas_.push_back({std::move(s)});
  while (deltas_.size() > keep_deltas_) {
    dropped.push_back(deltas_.front().snap);
    deltas_.erase(deltas_.begin());
  }
  return dropped;
}

std::shared_ptr<const StateSnapshot> StateServer::latest() const {
  std::lock_guard lock(mu_);
  return snaps_.empty() ? nullptr : snaps_.back().snap;
}

void StateServer::note_hash(std::uint64_t round, const Digest& hash) {
  std::lock_guard lock(mu_);
  hashes_[round] = hash;
  while (hashes_.size() > kHashHistory) hashes_.erase(hashes_.begin());
}

transport::Result<std::vector<std::uint8_t>> StateServer::answer(
    std::span<const std::uint8_t> request) const {
  auto r = decode_state_request(request);
  if (!r) {
    auto p = decode_probe(request);
    if (!p) return r.error();
    ProbeAnswer a;
    a.round = p->round;
    std::shared_ptr<const StateSnapshot> latest;
    {
      std::lock_guard lock(mu_);
      if (auto it = hashes_.find(p->round); it != hashes_.end()) a.hash = it->second;
      if (!snaps_.empty()) latest = snaps_.back().snap;
    }
    if (latest && p->samples > 0) {  // a few small reads, outside the lock
      if (auto s = read_samples(latest->blob(), p->seed, p->samples)) {
        a.sampled = s->round;
        a.values = s->values;
        a.samples = std::move(s->at);
      }
    }
    return encode_probe_answer(a);
  }
  std::shared_ptr<const StateSnapshot> s;
  {
    std::lock_guard lock(mu_);
    for (const auto* held : {&snaps_, &deltas_})
      for (const auto& h : *held)
        if (h.snap->root() == r->root) {
          h.asked = true;
          s = h.snap;
        }
  }
  if (!s) return errc::rejected;  // not (or no longer) held
  if (!r->index) return s->manifest_bytes();
  // Read outside the lock (a chunk of a file-backed snapshot is a read of a few MiB).
  auto c = s->chunk(*r->index);
  if (!c && c.error() != make_error_code(errc::rejected))
    spdlog::warn("state sync: cannot read chunk {} of our snapshot: {}", *r->index, c.text());
  return c;
}

// ---- joiner side ----

StateDownload::StateDownload(std::string run_id, std::vector<StateOffer> offers,
                             StateSyncOptions opts, Time now, std::optional<SyncPartial> resume)
    : run_id_(std::move(run_id)), offers_(std::move(offers)), opts_(opts) {
  if (resume && resume->blob && resume->have.size() == resume->manifest.chunks.size() &&
      resume->blob->size() == resume->manifest.size) {
    manifest_ = std::move(resume->manifest);
    manifest_root_ = resume->root;
    have_ = std::move(resume->have);
    verified_ = resume->verified;
    blob_ = std::move(resume->blob);
  }
  if (offers_.empty()) {
    status_ = OpStatus::failed;
    failure_ = "no donor offers the state";
    return;
  }
  start_donor(now);
}

void StateDownload::start_donor(Time now) {
  const StateOffer& o = offers_[current_];
  if (o.run_id != run_id_ || o.size > opts_.max_size)
    return drop(current_, "offer of another run or too large", now);
  active_.clear();
  active_[current_] = Donor{now, 0, 0, 0, std::nullopt};
  if (manifest_ && manifest_root_ == o.root) {
    // Same snapshot: resume with the chunks we have.
    spdlog::info("state sync: resuming from {} with {} of {} chunks ({} of {} bytes) verified",
                 dht::short_hex(o.donor), verified_, have_.size(), verified_bytes(),
                 manifest_->size);
    add_helpers(now);
    fill(now);
    return;
  }
  manifest_.reset();
  have_.clear();
  asked_.clear();
  next_chunk_ = 0;
  verified_ = 0;
  blob_.reset();
  request(std::nullopt, current_, now);
}

void StateDownload::add_helpers(Time now) {
  std::string names;
  for (std::size_t i = 0; i < offers_.size(); ++i) {
    const StateOffer& o = offers_[i];
    if (active_.count(i) || dropped_.count(i) || o.root != manifest_root_ || o.run_id != run_id_ ||
        o.size > opts_.max_size || o.donor == offers_[current_].donor)
      continue;
    active_[i] = Donor{now, 0, 0, 0, std::nullopt};
    names += (names.empty() ? "" : ", ") + dht::short_hex(o.donor);
  }
  if (!names.empty())
    spdlog::info("state sync: {} also offer{} this state: fetching from {} donors at once", names,
                 active_.size() == 2 ? "s" : "", active_.size());
}

void StateDownload::drop(std::size_t d, const std::string& why, Time now) {
  if (status_ != OpStatus::running) return;
  spdlog::warn("state sync: dropping donor {}: {}", dht::short_hex(offers_[d].donor), why);
  dropped_.insert(d);
  active_.erase(d);
  for (auto it = pending_.begin(); it != pending_.end();) {  // late answers are ignored
    if (it->second.donor != d) {
      ++it;
      continue;
    }
    if (it->second.index) asked_.erase(*it->second.index);
    it = pending_.erase(it);
  }
  if (!active_.empty()) {  // the others go on (with its chunks)
    if (d == current_) current_ = active_.begin()->first;
    return fill(now);
  }
  while (current_ < offers_.size() && dropped_.count(current_)) ++current_;
  if (current_ >= offers_.size()) {
    current_ = offers_.size() - 1;
    status_ = OpStatus::failed;
    failure_ = "every donor failed (last: " + why + ")";
    return;
  }
  start_donor(now);
}

void StateDownload::request(std::optional<std::uint32_t> index, std::size_t d, Time now) {
  const StateOffer& o = offers_[d];
  Donor& dn = active_.at(d);
  Request r;
  r.id = next_id_++;
  r.to = o.donor;
  r.address = o.address;
  r.body = encode_state_request({o.root, index});
  // The bytes in flight to this donor once this request is out.
  const Time given = allowance(dn, dn.in_flight + 1, now);
  r.deadline = now + given;
  // The transport waits out the deadlines a late donor may still be given (on_timer).
  r.give_up = now + given * (index ? 1 + opts_.late_allowed : 1);
  ++dn.in_flight;
  pending_[r.id] = {index, r.deadline, d, now};
  out_.push_back(std::move(r));
}

void StateDownload::fill(Time now) {
  if (!manifest_ || status_ != OpStatus::running) return;
  const auto total = static_cast<std::uint32_t>(manifest_->chunks.size());
  // The next chunk neither verified nor asked for, from next_chunk_ on (wrapping).
  std::uint32_t scanned = 0;
  const auto next_wanted = [&]() -> std::optional<std::uint32_t> {
    for (; scanned < total; ++scanned) {
      const std::uint32_t c = (next_chunk_ + scanned) % total;
      if (!have_[c] && !asked_.count(c)) return c;
    }
    return std::nullopt;
  };
  // Round robin over the donors, up to `parallel` requests each.
  for (bool asked = true; asked;) {
    asked = false;
    for (auto& [d, dn] : active_) {
      if (dn.in_flight >= opts_.parallel) continue;
      const auto c = next_wanted();
      if (!c) return;
      asked_.insert(*c);
      next_chunk_ = (*c + 1) % total;  // (chunks given back by a dropped donor: found on wrapping)
      scanned = 0;
      request(*c, d, now);
      asked = true;
    }
  }
}

void StateDownload::on_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now) {
  auto it = pending_.find(id);
  if (status_ != OpStatus::running || it == pending_.end()) return;
  const auto index = it->second.index;
  const std::size_t d = it->second.donor;
  pending_.erase(it);
  const auto a = active_.find(d);  // (a dropped donor's requests are gone from pending_)
  if (a == active_.end()) return;
  Donor& dn = a->second;
  --dn.in_flight;
  const StateOffer& o = offers_[d];
  if (!index) {
    if (manifest_root(body) != o.root)
      return drop(d, "manifest does not match the signed root", now);
    auto m = decode_manifest(body, opts_.max_chunks);
    if (!m || m->run_id != run_id_ || m->round != o.round || m->size != o.size ||
        m->chunk_bytes > opts_.max_chunk_bytes)
      return drop(d, "manifest malformed or inconsistent with the offer", now);
    manifest_ = std::move(*m);
    manifest_root_ = o.root;
    have_.assign(manifest_->chunks.size(), false);
    blob_.reset();
    auto store = opts_.store ? opts_.store : memory_blob_store();
    auto w = store->create(manifest_->size);
    if (!w) {
      // Our own fault (a full disk), not the donor's: another donor would not help.
      status_ = OpStatus::failed;
      failure_ =
          "cannot keep a state of " + std::to_string(manifest_->size) + " bytes: " + w.text();
      pending_.clear();
      return;
    }
    blob_ = std::move(*w);
    spdlog::info(
        "state sync: {} bytes of round {} in {} chunks of {} from {}; a request is given {} s "
        "plus its bytes in flight at {:.2f} MB/s (then the measured rate) x {}",
        manifest_->size, manifest_->round, manifest_->chunks.size(), manifest_->chunk_bytes,
        dht::short_hex(o.donor), opts_.request_floor.count() / 1000, opts_.min_rate / 1e6,
        opts_.rate_margin);
    if (manifest_->chunks.empty()) {
      status_ = OpStatus::done;
      return;
    }
    add_helpers(now);
    fill(now);
    return;
  }
  const std::uint32_t c = *index;
  asked_.erase(c);
  if (!manifest_ || c >= have_.size() || have_[c]) return fill(now);
  const std::size_t off = std::size_t{c} * manifest_->chunk_bytes;
  const std::size_t len = std::min<std::size_t>(manifest_->chunk_bytes, manifest_->size - off);
  if (body.size() != len || transport::blake2b_256(body) != manifest_->chunks[c])
    return drop(d, "chunk " + std::to_string(c) + " does not match the manifest", now);
  if (auto w = blob_->write(off, body); !w) {
    status_ = OpStatus::failed;
    failure_ = "cannot write the state's chunk " + std::to_string(c) + ": " + w.text();
    pending_.clear();
    return;
  }
  have_[c] = true;
  ++fetched_;
  dn.bytes += len;
  dn.late = 0;
  if (++verified_ == have_.size()) {
    status_ = OpStatus::done;
    pending_.clear();
    return;
  }
  fill(now);
}

void StateDownload::on_failure(std::uint64_t id, Time now, const std::string& why) {
  auto it = pending_.find(id);
  if (status_ != OpStatus::running || it == pending_.end()) return;
  const auto p = it->second;
  // A chunk request the transport gave up on while its deadline here still runs (a late donor's
  // deadlines move on; the transport's timeout was set when the request left): asked again, as a
  // lateness of the donor (a chunk it delivers clears it), not as a failure of it.
  const auto a = active_.find(p.donor);
  const bool counted = a != active_.end() && a->second.late_at && p.sent < *a->second.late_at;
  if (a != active_.end() && p.index && now < p.deadline && a->second.bytes > 0 &&
      (counted || a->second.late < opts_.late_allowed)) {
    if (!counted) {
      ++a->second.late;
      a->second.late_at = now;
    }
    --a->second.in_flight;
    asked_.erase(*p.index);
    pending_.erase(it);
    if (!counted)  // (the other requests that were in flight through this stall: quietly)
      spdlog::info("state sync: asking again for chunk {} ({} of {} for donor {}): {}", *p.index,
                   a->second.late, opts_.late_allowed, dht::short_hex(offers_[p.donor].donor),
                   why.empty() ? std::string("its request failed") : why);
    next_chunk_ = std::min(next_chunk_, *p.index);
    return fill(now);
  }
  drop(p.donor,
       (p.index ? "the request for chunk " + std::to_string(*p.index) : "the manifest request") +
           " failed" + (why.empty() ? std::string() : ": " + why),
       now);
}

void StateDownload::on_timer(Time now) {
  while (status_ == OpStatus::running) {
    const auto late = std::find_if(pending_.begin(), pending_.end(),
                                   [&](const auto& e) { return now >= e.second.deadline; });
    if (late == pending_.end()) return;
    const Pending p = late->second;
    const auto a = active_.find(p.donor);
    const Donor dn = a != active_.end() ? a->second : Donor{};
    const std::string what =
        p.index ? "chunk " + std::to_string(*p.index) : std::string("the manifest");
    const std::string load = "(" + std::to_string(dn.in_flight) + " requests in flight at " +
                             (dn.bytes ? "the measured " : "the assumed ") +
                             std::to_string(static_cast<long long>(rate(dn, now) / 1000)) +
                             " kB/s)";
    if (a == active_.end() || !p.index || dn.bytes == 0 || dn.late >= opts_.late_allowed) {
      drop(p.donor, what + " not answered by its deadline " + load, now);
      continue;
    }
    // A donor that has delivered: every request of its in flight waits for a new deadline (the
    // stall that delayed one delays them all: each must not spend a missed deadline of its own).
    const Time more = allowance(dn, dn.in_flight, now);
    for (auto& [id, q] : pending_)
      if (q.donor == p.donor) q.deadline = std::max(q.deadline, now + more);
    ++a->second.late;
    a->second.late_at = now;
    spdlog::info("state sync: donor {} is late with {} {}: waiting {:.1f} s more ({} of {})",
                 dht::short_hex(offers_[p.donor].donor), what, load,
                 static_cast<double>(more.count()) / 1000.0, a->second.late, opts_.late_allowed);
  }
}

Time StateDownload::allowance(const Donor& dn, std::size_t requests, Time now) const {
  // (A manifest counts as small.)
  const std::uint64_t each = manifest_ ? manifest_->chunk_bytes : 64u << 10;
  const double in_flight = static_cast<double>(each * requests);
  return opts_.request_floor +
         Time(std::llround(1000.0 * opts_.rate_margin * in_flight / rate(dn, now)));
}

double StateDownload::measured_rate(const Donor& d, Time now) const {
  const double secs = static_cast<double>((now - d.since).count()) / 1000.0;
  return d.bytes && secs > 0 ? static_cast<double>(d.bytes) / secs : 0;
}

double StateDownload::rate(const Donor& d, Time now) const {
  return std::max(measured_rate(d, now), opts_.min_rate);
}

std::uint64_t StateDownload::verified_bytes() const {
  if (!manifest_) return 0;
  std::uint64_t b =
      std::min<std::uint64_t>(verified_ * std::uint64_t{manifest_->chunk_bytes}, manifest_->size);
  if (!have_.empty() && have_.back() && verified_ < have_.size())  // the short last chunk
    b -= manifest_->chunk_bytes * std::uint64_t{have_.size()} - manifest_->size;
  return b;
}

SyncProgress StateDownload::progress(Time now) const {
  SyncProgress p;
  if (!manifest_) return p;
  p.total = manifest_->size;
  p.bytes = verified_bytes();
  for (const auto& [d, dn] : active_) p.rate += measured_rate(dn, now);
  return p;
}

std::shared_ptr<const StateBlob> StateDownload::take_blob() {
  if (status_ != OpStatus::done) return nullptr;
  if (!blob_) return memory_blob({});  // an empty state (no chunks)
  auto b = blob_->seal();
  blob_.reset();
  return b;
}

std::optional<SyncPartial> StateDownload::take_partial() {
  if (!manifest_ || !blob_ || verified_ == 0 || status_ == OpStatus::done) return std::nullopt;
  SyncPartial p;
  p.root = manifest_root_;
  p.manifest = std::move(*manifest_);
  p.have = std::move(have_);
  p.verified = verified_;
  p.blob = std::move(blob_);
  manifest_.reset();
  verified_ = 0;
  return p;
}

std::optional<Time> StateDownload::next_deadline() const {
  if (status_ != OpStatus::running || pending_.empty()) return std::nullopt;
  Time t = Time::max();
  for (const auto& [id, p] : pending_) t = std::min(t, p.deadline);
  return t;
}

}  // namespace grove::gossip
