#include "gossip/catch_up.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "dht/key.hpp"
#include "gossip/guarded.hpp"
#include "transport/crypto.hpp"

namespace grove::gossip {

CatchUp::CatchUp(dht::RecordStore& store, std::string run_id, std::uint64_t min_round,
                 std::set<NodeId> donors, CatchUpOptions opts, Time now,
                 std::optional<SyncPartial> resume)
    : store_(store),
      run_id_(std::move(run_id)),
      min_round_(min_round),
      donors_(std::move(donors)),
      opts_(std::move(opts)),
      started_(now),
      partial_(std::move(resume)) {
  // A donor's offer cannot make us allocate more than a state of our size can take.
  if (opts_.values)
    opts_.sync.max_size =
        std::min<std::uint64_t>(opts_.sync.max_size, 3 * 4 * *opts_.values + 4096);
  read_offers(now);
}

CatchUp::~CatchUp() {
  *alive_ = false;
}

void CatchUp::read_offers(Time now) {
  reading_ = true;
  retry_at_ = Time::max();
  store_.read(state_key(run_id_), now, guarded(alive_, [this](std::vector<dht::Record> res) {
                on_offers(std::move(res), store_.now());
              }));
}

void CatchUp::on_offers(std::vector<dht::Record> records, Time now) {
  reading_ = false;
  if (status_ != OpStatus::running || download_) return;
  std::vector<std::pair<Digest, StateOffer>> found;
  for (const auto& rec : records) {
    if (rec.subkey != "state") continue;
    auto o = decode_offer(rec.value);
    if (!o || o->run_id != run_id_ || offer_head(*o) < min_round_) continue;
    o->donor = rec.owner_id();
    if (o->donor == store_.id() || o->address.empty()) continue;
    if (offer_donors_.size() < 64) offer_donors_[o->donor] = o->address;
    if (!donors_.empty() && !donors_.contains(o->donor)) continue;
    if (opts_.distrust.contains(o->donor)) continue;
    if (const auto d = dropped_.find({o->donor, o->root}); d != dropped_.end() && now < d->second)
      continue;
    // Joiners spread over the donors of the newest round: order ties by a hash of both ids.
    transport::Blake2b256 h;
    h.update(store_.id());
    h.update(o->donor);
    found.emplace_back(h.final(), std::move(*o));
  }
  if (found.empty() && opts_.nobody_ahead && opts_.nobody_ahead()) {
    if (!nobody_since_) nobody_since_ = now;
    if (now - *nobody_since_ >= opts_.nobody_ahead_settle)
      return fail("no member is ahead of round " + std::to_string(min_round_ - 1) +
                  ": every other live member is catching up too");
  } else {
    nobody_since_.reset();
  }
  if (found.empty()) {
    // (Offers left out for a moment after they failed count as offers while the sync has made
    // progress within offers_wait, as when every donor failed.)
    const bool cooling = std::any_of(dropped_.begin(), dropped_.end(),
                                     [&](const auto& d) { return now < d.second; });
    if (now - started_ < opts_.offers_wait ||
        (cooling && now - last_progress_ < opts_.offers_wait)) {
      retry_at_ = now + opts_.offers_retry;
      return;
    }
    return fail(last_failure_.empty() ? "no state offers for run " + run_id_
                                      : last_failure_ + "; no other state offers");
  }
  // The newest state first: the round its deltas reach, then the newest snapshot (the fewest
  // deltas to replay after it).
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    const auto ha = offer_head(a.second), hb = offer_head(b.second);
    if (ha != hb) return ha > hb;
    return a.second.round != b.second.round ? a.second.round > b.second.round : a.first < b.first;
  });
  // Donors our member view has live before the others (a donor gone leaves its offer behind
  // until it expires), when the view has any.
  if (opts_.members) {
    std::set<NodeId> live;
    for (const auto& [id, addr] : opts_.members()) live.insert(id);
    if (!live.empty())
      std::stable_partition(found.begin(), found.end(),
                            [&](const auto& f) { return live.contains(f.second.donor); });
  }
  // The snapshot an earlier attempt had begun, when a donor still offers it, goes first: only
  // its missing chunks are fetched.
  if (partial_)
    std::stable_partition(found.begin(), found.end(),
                          [&](const auto& f) { return f.second.root == partial_->root; });
  std::vector<StateOffer> offers;
  for (auto& [h, o] : found) offers.push_back(std::move(o));
  if (opts_.have && plan_deltas(offers, now)) return;
  download_ = std::make_unique<StateDownload>(run_id_, std::move(offers), opts_.sync, now,
                                              std::exchange(partial_, std::nullopt));
}

bool CatchUp::plan_deltas(const std::vector<StateOffer>& found, Time now) {
  const auto& best = found.front();
  const std::uint64_t head = offer_head(best);
  if (head <= opts_.have->round) return false;
  std::vector<std::vector<StateOffer>> plan;
  Digest at = opts_.have->hash;
  std::uint64_t total = 0;
  for (std::uint64_t k = opts_.have->round + 1; k <= head; ++k) {
    const auto d = std::find_if(best.deltas.begin(), best.deltas.end(),
                                [&](const DeltaOffer& x) { return x.round == k && x.from == at; });
    if (d == best.deltas.end()) return false;
    std::vector<StateOffer> donors;
    for (const auto& o : found)
      if (std::any_of(o.deltas.begin(), o.deltas.end(),
                      [&](const DeltaOffer& x) { return x.root == d->root; }))
        donors.push_back({o.donor, o.address, run_id_, k, d->size, d->root, {}});
    plan.push_back(std::move(donors));
    at = d->to;
    total += d->size;
  }
  spdlog::info(
      "state sync: fetching the deltas of rounds {}..{} ({} bytes) from {} instead of "
      "the state ({} bytes)",
      opts_.have->round + 1, head, total, dht::short_hex(best.donor), best.size);
  plan_ = std::move(plan);
  deltas_total_ = total;
  offer_ = best;
  std::reverse(plan_.begin(), plan_.end());  // taken from the back
  next_delta(now);
  return true;
}

void CatchUp::next_delta(Time now) {
  deltas_mode_ = true;
  download_ = std::make_unique<StateDownload>(run_id_, std::move(plan_.back()), opts_.sync, now);
  plan_.pop_back();
}

SyncProgress CatchUp::progress(Time now) const {
  if (!download_) return {};
  auto p = download_->progress(now);
  if (deltas_mode_) {
    p.bytes += bytes_;
    p.total = deltas_total_;
  }
  return p;
}

std::vector<StateDownload::Request> CatchUp::take_requests() {
  auto out = std::exchange(probe_out_, {});
  if (download_)
    for (auto& r : download_->take_requests()) out.push_back(std::move(r));
  return out;
}

void CatchUp::on_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now) {
  if (probes_.contains(id)) return on_probe(id, decode_probe_answer(body), now);
  if (!download_) return;
  download_->on_response(id, body, now);
  settle(now);
}

void CatchUp::on_failure(std::uint64_t id, Time now, const std::string& why) {
  if (probes_.contains(id))
    return on_probe(id, transport::Result<ProbeAnswer>(transport::errc::rejected, why), now);
  if (!download_) return;
  download_->on_failure(id, now, why);
  settle(now);
}

void CatchUp::on_timer(Time now) {
  if (status_ != OpStatus::running) return;
  if (probing_) {
    // A probe past its deadline (with a second's grace for the driver's own timeout) failed.
    for (auto it = probes_.begin(); it != probes_.end();) {
      const auto id = (it++)->first;
      if (now >= probes_.at(id).deadline + Time(1000))
        on_probe(id, transport::Result<ProbeAnswer>(transport::errc::timed_out, "no answer"), now);
    }
    if (probing_ && probes_.empty() && now >= probe_again_) probe(now);
    return;
  }
  if (download_) {
    download_->on_timer(now);
    return settle(now);
  }
  if (!reading_ && now >= retry_at_) read_offers(now);
}

std::optional<Time> CatchUp::next_deadline() const {
  // Ended in a DHT callback (no offers): due at once, so that the engine hears of it now.
  if (status_ != OpStatus::running) return started_;
  if (probing_) {
    Time t = probe_again_;
    for (const auto& [id, p] : probes_) t = std::min(t, p.deadline + Time(1000));
    return t;
  }
  if (download_) return download_->next_deadline();
  if (retry_at_ != Time::max()) return retry_at_;
  return std::nullopt;
}

void CatchUp::settle(Time now) {
  if (!download_) return;
  if (download_->status() == OpStatus::running) {
    if (const auto b = progress(now).bytes; b > progress_bytes_) {
      progress_bytes_ = b;
      last_progress_ = now;
    }
    return;
  }
  if (deltas_mode_) {
    if (download_->status() == OpStatus::failed) {
      spdlog::info("state sync: a delta failed ({}); reading the offers again for the whole state",
                   download_->failure());
      deltas_mode_ = false;
      opts_.have.reset();
      plan_.clear();
      deltas_.clear();
      bytes_ = 0;
      download_.reset();
      retry_at_ = now + opts_.offers_retry;
      return;
    }
    bytes_ += download_->offer().size;
    deltas_.push_back(download_->take_blob());
    download_.reset();
    if (!plan_.empty()) return next_delta(now);
    deltas_mode_ = false;
    state_round_ = offer_head(offer_);
    return probe(now);
  }
  if (download_->status() == OpStatus::failed) {
    // The donors may have moved on to a newer state since their offers were read (a snapshot
    // they no longer hold is refused), or have gone: read the offers again, keeping the chunks
    // verified, while the sync has made progress within offers_wait.
    for (auto& d : download_->dropped_offers())
      if (dropped_.size() < 256) dropped_[d] = now + std::min(Time(2000), opts_.offers_wait / 4);
    last_failure_ = download_->failure();
    if (now - last_progress_ < opts_.offers_wait) {
      spdlog::info("state sync: {}; reading the offers again", download_->failure());
      if (auto p = download_->take_partial()) partial_ = std::move(p);
      download_.reset();
      retry_at_ = now + opts_.offers_retry;
      return;
    }
    return fail(download_->failure());
  }
  blob_ = download_->take_blob();
  offer_ = download_->offer();
  bytes_ = offer_.size;
  download_.reset();
  state_round_ = offer_.round;
  probe(now);
}

// ---- the witnesses -----------------------------------------------------------------------------

void CatchUp::probe(Time now) {
  if (!probing_) {
    probing_ = true;
    probe_started_ = now;
    // The donor first (it must stand by its state), then the other live members.
    // Every member we know of: the live ones in our view (a joiner's may be empty yet) and the
    // donors of the offers read (signed records: a donor cannot hide the others).
    std::map<NodeId, std::string> known = offer_donors_;
    if (opts_.members)
      for (auto& [id, addr] : opts_.members())
        if (auto& a = known[id]; a.empty()) a = addr;
    known.erase(store_.id());
    known[offer_.donor] = offer_.address;
    witness_at_.clear();
    witness_at_.emplace_back(offer_.donor, offer_.address);
    for (const auto& [id, addr] : known)
      if (id != offer_.donor && witness_at_.size() < kMaxWitnesses)
        witness_at_.emplace_back(id, addr);
    witnesses_.clear();
    for (const auto& w : witness_at_) witnesses_.push_back({w.first, std::nullopt, {}});
  }
  probe_again_ = Time::max();
  const auto body = encode_probe({state_round_, opts_.probe_seed, kProbeSamples});
  for (std::size_t i = 0; i < witnesses_.size(); ++i) {
    if (useful(witnesses_[i])) continue;
    const auto id = probe_id_++;
    probes_[id] = {i, now + opts_.sync.request_floor};
    probe_out_.push_back(
        {id, witness_at_[i].first, witness_at_[i].second, body, now + opts_.sync.request_floor});
  }
  if (probes_.empty()) finish_probes();
}

bool CatchUp::useful(const Witness& w) const {
  if (!w.answer) return false;
  const bool hash =
      w.answer->round == state_round_ && std::any_of(w.answer->hash.begin(), w.answer->hash.end(),
                                                     [](std::uint8_t b) { return b != 0; });
  const bool same = opts_.same_hash && opts_.same_hash(state_round_);
  return hash || (!same && w.answer->samples.size() == kProbeSamples);
}

bool CatchUp::probes_enough() const {
  // One member besides the donor that can vouch for the state (or nobody besides the donor to
  // ask): the judgement is the engine's (gossip/state_check.hpp).
  if (witnesses_.size() <= 1) return true;
  return std::any_of(witnesses_.begin() + 1, witnesses_.end(),
                     [&](const Witness& w) { return useful(w); });
}

void CatchUp::on_probe(std::uint64_t id, const transport::Result<ProbeAnswer>& a, Time now) {
  const auto it = probes_.find(id);
  if (it == probes_.end()) return;
  auto& w = witnesses_.at(it->second.witness);
  probes_.erase(it);
  if (a) {
    w.answer = *a;
    w.failure.clear();
  } else {
    w.failure = a.text();
  }
  if (!probes_.empty()) return;
  // Members a moment behind the round report it within seconds; after that the samples decide.
  if (probes_enough() || now - probe_started_ >= std::min(opts_.offers_wait, Time(3000)))
    return finish_probes();
  probe_again_ = now + Time(1000);  // members that had not ended the round yet may have now
}

void CatchUp::finish_probes() {
  probing_ = false;
  status_ = OpStatus::done;
}

void CatchUp::fail(std::string why) {
  failure_ = std::move(why);
  if (download_ && !deltas_mode_)
    if (auto p = download_->take_partial()) partial_ = std::move(p);
  download_.reset();
  retry_at_ = Time::max();
  status_ = OpStatus::failed;
}

}  // namespace grove::gossip
