#include "gossip/state_sync.hpp"

#include <algorithm>
#include <cstring>
#include <msgpack.hpp>

#include <spdlog/spdlog.h>

#include "transport/crypto.hpp"
#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

namespace grove::gossip {

using transport::errc;

namespace {
constexpr std::uint8_t kVersion = 1;

using transport::mp::bytes_of;
using transport::mp::get_fixed;
using transport::mp::get_str;
using transport::mp::get_u64;
using transport::mp::pack_bin;
}  // namespace

// ---- manifest, offer, request ----

std::vector<std::uint8_t> encode_manifest(const StateManifest& m) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(6);
  pk.pack(kVersion);
  pk.pack(m.run_id);
  pk.pack(m.round);
  pk.pack(m.size);
  pk.pack(m.chunk_bytes);
  pk.pack_array(static_cast<std::uint32_t>(m.chunks.size()));
  for (const auto& d : m.chunks) pack_bin(pk, d);
  return bytes_of(sb);
}

transport::Result<StateManifest> decode_manifest(std::span<const std::uint8_t> bytes,
                                                 std::size_t max_chunks) {
  auto oh = transport::unpack_bounded(bytes, {.array = std::max<std::size_t>(6, max_chunks),
                                              .map = 0,
                                              .str = 64,
                                              .bin = 32,
                                              .ext = 0,
                                              .depth = 2});
  if (!oh) return oh.error();
  const auto& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 6) return errc::malformed;
  const auto* a = o.via.array.ptr;
  StateManifest m;
  std::uint64_t version = 0, chunk_bytes = 0;
  if (!get_u64(a[0], version) || version != kVersion || !get_str(a[1], 64, m.run_id) ||
      !get_u64(a[2], m.round) || !get_u64(a[3], m.size) || !get_u64(a[4], chunk_bytes) ||
      chunk_bytes == 0 || chunk_bytes > UINT32_MAX || a[5].type != msgpack::type::ARRAY)
    return errc::malformed;
  m.chunk_bytes = static_cast<std::uint32_t>(chunk_bytes);
  const auto& hs = a[5].via.array;
  if (hs.size > max_chunks || hs.size != (m.size + chunk_bytes - 1) / chunk_bytes)
    return errc::malformed;
  m.chunks.resize(hs.size);
  for (std::uint32_t i = 0; i < hs.size; ++i)
    if (!get_fixed(hs.ptr[i], m.chunks[i])) return errc::malformed;
  return m;
}

Digest manifest_root(std::span<const std::uint8_t> manifest_bytes) {
  return transport::blake2b_256(manifest_bytes);
}

std::vector<std::uint8_t> encode_offer(const StateOffer& o) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(5);
  pk.pack(o.address);
  pk.pack(o.run_id);
  pk.pack(o.round);
  pk.pack(o.size);
  pack_bin(pk, o.root);
  return bytes_of(sb);
}

transport::Result<StateOffer> decode_offer(std::span<const std::uint8_t> value) {
  auto oh = transport::unpack_bounded(
      value, {.array = 5, .map = 0, .str = 256, .bin = 32, .ext = 0, .depth = 1});
  if (!oh) return oh.error();
  const auto& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 5) return errc::malformed;
  const auto* a = o.via.array.ptr;
  StateOffer r;
  if (!get_str(a[0], 256, r.address) || !get_str(a[1], 64, r.run_id) || !get_u64(a[2], r.round) ||
      !get_u64(a[3], r.size) || !get_fixed(a[4], r.root))
    return errc::malformed;
  return r;
}

dht::Key state_key(const std::string& run_id) {
  return dht::key_of("grove/run/" + run_id + "/state");
}

std::vector<std::uint8_t> encode_state_request(const StateRequest& r) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(3);
  pk.pack(kVersion);
  pack_bin(pk, r.root);
  if (r.index)
    pk.pack(*r.index);
  else
    pk.pack_nil();
  return bytes_of(sb);
}

transport::Result<StateRequest> decode_state_request(std::span<const std::uint8_t> bytes) {
  auto oh = transport::unpack_bounded(
      bytes, {.array = 3, .map = 0, .str = 0, .bin = 32, .ext = 0, .depth = 1});
  if (!oh) return oh.error();
  const auto& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) return errc::malformed;
  const auto* a = o.via.array.ptr;
  StateRequest r;
  std::uint64_t version = 0, index = 0;
  if (!get_u64(a[0], version) || version != kVersion || !get_fixed(a[1], r.root))
    return errc::malformed;
  if (a[2].type != msgpack::type::NIL) {
    if (!get_u64(a[2], index) || index > UINT32_MAX) return errc::malformed;
    r.index = static_cast<std::uint32_t>(index);
  }
  return r;
}

// ---- donor side ----

StateSnapshot::StateSnapshot(std::string run_id, std::uint64_t round,
                             std::vector<std::uint8_t> blob, std::uint32_t chunk_bytes)
    : StateSnapshot(std::move(run_id), round,
                    std::make_shared<const std::vector<std::uint8_t>>(std::move(blob)),
                    chunk_bytes) {}

StateSnapshot::StateSnapshot(std::string run_id, std::uint64_t round,
                             std::shared_ptr<const std::vector<std::uint8_t>> blob,
                             std::uint32_t chunk_bytes)
    : blob_(blob ? std::move(blob) : std::make_shared<const std::vector<std::uint8_t>>()) {
  const auto& b = *blob_;
  manifest_.run_id = std::move(run_id);
  manifest_.round = round;
  manifest_.size = b.size();
  manifest_.chunk_bytes = chunk_bytes;
  for (std::size_t off = 0; off < b.size(); off += chunk_bytes)
    manifest_.chunks.push_back(transport::blake2b_256(
        std::span(b).subspan(off, std::min<std::size_t>(chunk_bytes, b.size() - off))));
  manifest_bytes_ = encode_manifest(manifest_);
  root_ = manifest_root(manifest_bytes_);
}

std::span<const std::uint8_t> StateSnapshot::chunk(std::uint32_t i) const {
  const std::size_t off = std::size_t{i} * manifest_.chunk_bytes;
  if (i >= chunks()) return {};
  return std::span(*blob_).subspan(
      off, std::min<std::size_t>(manifest_.chunk_bytes, blob_->size() - off));
}

// Newest first: an older snapshot stays while it fits in the budget (with `held` bytes already
// held) or a joiner asked for it since the last add(); at most `room` of them.
void StateServer::prune(std::uint64_t held, std::size_t room) {
  std::vector<Held> kept;
  for (auto it = snaps_.rbegin(); it != snaps_.rend() && kept.size() < room; ++it) {
    if (!it->asked && held + it->snap->size() > budget_) continue;
    held += it->snap->size();
    kept.push_back({it->snap, it->asked});
  }
  snaps_.assign(kept.rbegin(), kept.rend());
}

void StateServer::add(std::shared_ptr<const StateSnapshot> s) {
  std::lock_guard lock(mu_);
  prune(s->size(), std::max<std::size_t>(keep_, 1) - 1);
  for (auto& h : snaps_) h.asked = false;
  snaps_.push_back({std::move(s)});
}

void StateServer::make_room() {
  std::lock_guard lock(mu_);
  if (!snaps_.empty()) prune(snaps_.back().snap->size(), std::max<std::size_t>(keep_, 1) - 1);
}

std::shared_ptr<const StateSnapshot> StateServer::latest() const {
  std::lock_guard lock(mu_);
  return snaps_.empty() ? nullptr : snaps_.back().snap;
}

transport::Result<std::vector<std::uint8_t>> StateServer::answer(
    std::span<const std::uint8_t> request) const {
  auto r = decode_state_request(request);
  if (!r) return r.error();
  std::lock_guard lock(mu_);
  for (const auto& h : snaps_) {
    const auto& s = h.snap;
    if (s->root() != r->root) continue;
    h.asked = true;
    if (!r->index) return s->manifest_bytes();
    if (*r->index >= s->chunks()) return errc::rejected;
    const auto c = s->chunk(*r->index);
    return std::vector<std::uint8_t>(c.begin(), c.end());
  }
  return errc::rejected;  // not (or no longer) held
}

// ---- joiner side ----

StateDownload::StateDownload(std::string run_id, std::vector<StateOffer> offers,
                             StateSyncOptions opts, Time now)
    : run_id_(std::move(run_id)), offers_(std::move(offers)), opts_(opts) {
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
    return next_donor("offer of another run or too large", now);
  if (manifest_ && manifest_root_ == o.root) {
    fill(now);  // same snapshot: resume with the chunks we have
    return;
  }
  manifest_.reset();
  have_.clear();
  asked_.clear();
  next_chunk_ = 0;
  verified_ = 0;
  blob_.clear();
  request(std::nullopt, now);
}

void StateDownload::next_donor(const std::string& why, Time now) {
  if (status_ != OpStatus::running) return;
  spdlog::warn("state sync: dropping donor {}: {}", dht::short_hex(offers_[current_].donor), why);
  pending_.clear();  // late answers from the dropped donor are ignored
  asked_.clear();
  if (++current_ >= offers_.size()) {
    current_ = offers_.size() - 1;
    status_ = OpStatus::failed;
    failure_ = "every donor failed (last: " + why + ")";
    return;
  }
  start_donor(now);
}

void StateDownload::request(std::optional<std::uint32_t> index, Time now) {
  const StateOffer& o = offers_[current_];
  Request r;
  r.id = next_id_++;
  r.to = o.donor;
  r.address = o.address;
  r.body = encode_state_request({o.root, index});
  r.deadline = now + opts_.request_timeout;
  pending_[r.id] = {index, r.deadline};
  out_.push_back(std::move(r));
}

void StateDownload::fill(Time now) {
  if (!manifest_) return;
  const auto total = static_cast<std::uint32_t>(manifest_->chunks.size());
  for (std::uint32_t i = 0; i < total && pending_.size() < opts_.parallel; ++i) {
    const std::uint32_t c = (next_chunk_ + i) % total;
    if (have_[c] || asked_.count(c)) continue;
    asked_.insert(c);
    request(c, now);
  }
}

void StateDownload::on_response(std::uint64_t id, std::span<const std::uint8_t> body, Time now) {
  auto it = pending_.find(id);
  if (status_ != OpStatus::running || it == pending_.end()) return;
  const auto index = it->second.index;
  pending_.erase(it);
  const StateOffer& o = offers_[current_];
  if (!index) {
    if (manifest_root(body) != o.root)
      return next_donor("manifest does not match the signed root", now);
    auto m = decode_manifest(body, opts_.max_chunks);
    if (!m || m->run_id != run_id_ || m->round != o.round || m->size != o.size ||
        m->chunk_bytes > opts_.max_chunk_bytes)
      return next_donor("manifest malformed or inconsistent with the offer", now);
    manifest_ = std::move(*m);
    manifest_root_ = o.root;
    have_.assign(manifest_->chunks.size(), false);
    blob_.clear();
    blob_.resize(manifest_->size);
    if (manifest_->chunks.empty()) {
      status_ = OpStatus::done;
      return;
    }
    fill(now);
    return;
  }
  const std::uint32_t c = *index;
  asked_.erase(c);
  if (!manifest_ || c >= have_.size() || have_[c]) return;
  const std::size_t off = std::size_t{c} * manifest_->chunk_bytes;
  const std::size_t len = std::min<std::size_t>(manifest_->chunk_bytes, manifest_->size - off);
  if (body.size() != len || transport::blake2b_256(body) != manifest_->chunks[c])
    return next_donor("chunk " + std::to_string(c) + " does not match the manifest", now);
  std::memcpy(blob_.data() + off, body.data(), len);
  have_[c] = true;
  ++fetched_;
  next_chunk_ = c + 1;
  if (++verified_ == have_.size()) {
    status_ = OpStatus::done;
    pending_.clear();
    return;
  }
  fill(now);
}

void StateDownload::on_failure(std::uint64_t id, Time now) {
  if (status_ != OpStatus::running || !pending_.count(id)) return;
  next_donor("request failed", now);
}

void StateDownload::on_timer(Time now) {
  if (status_ != OpStatus::running) return;
  for (const auto& [id, p] : pending_)
    if (now >= p.deadline) return next_donor("request timed out", now);
}

std::optional<Time> StateDownload::next_deadline() const {
  if (status_ != OpStatus::running || pending_.empty()) return std::nullopt;
  Time t = Time::max();
  for (const auto& [id, p] : pending_) t = std::min(t, p.deadline);
  return t;
}

}  // namespace grove::gossip
