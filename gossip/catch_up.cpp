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
    if (!donors_.empty() && !donors_.contains(o->donor)) continue;
    // Joiners spread over the donors of the newest round: order ties by a hash of both ids.
    transport::Blake2b256 h;
    h.update(store_.id());
    h.update(o->donor);
    found.emplace_back(h.final(), std::move(*o));
  }
  if (found.empty()) {
    if (now - started_ < opts_.offers_wait) {
      retry_at_ = now + opts_.offers_retry;
      return;
    }
    return fail("no state offers for run " + run_id_);
  }
  // The newest state first: the round its deltas reach, then the newest snapshot (the fewest
  // deltas to replay after it).
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    const auto ha = offer_head(a.second), hb = offer_head(b.second);
    if (ha != hb) return ha > hb;
    return a.second.round != b.second.round ? a.second.round > b.second.round : a.first < b.first;
  });
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
  if (!download_) return {};
  return download_->take_requests();
}

void CatchUp::on_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now) {
  if (!download_) return;
  download_->on_response(id, body, now);
  settle(now);
}

void CatchUp::on_failure(std::uint64_t id, Time now, const std::string& why) {
  if (!download_) return;
  download_->on_failure(id, now, why);
  settle(now);
}

void CatchUp::on_timer(Time now) {
  if (status_ != OpStatus::running) return;
  if (download_) {
    download_->on_timer(now);
    return settle(now);
  }
  if (!reading_ && now >= retry_at_) read_offers(now);
}

std::optional<Time> CatchUp::next_deadline() const {
  // Ended in a DHT callback (no offers): due at once, so that the engine hears of it now.
  if (status_ != OpStatus::running) return started_;
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
    status_ = OpStatus::done;
    return;
  }
  if (download_->status() == OpStatus::failed) {
    // The donors may have moved on to a newer state since their offers were read (a snapshot
    // they no longer hold is refused), or have gone: read the offers again, keeping the chunks
    // verified, while the sync has made progress within offers_wait.
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
