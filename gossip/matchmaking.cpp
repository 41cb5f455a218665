#include "gossip/matchmaking.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <msgpack.hpp>
#include <set>
#include <span>

#include <spdlog/spdlog.h>

#include "dht/membership.hpp"
#include "transport/crypto.hpp"
#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"
#include "transport/schema.hpp"

namespace grove::gossip {

using transport::errc;

namespace {
namespace sc = transport::schema;
constexpr auto kReadySchema = sc::record<ReadyInfo>(
    "ready record", 2,
    sc::field("addresses", &ReadyInfo::addresses, sc::List<sc::Str>{8, sc::Str{256}}),
    sc::field("run", &ReadyInfo::run_id, sc::Str{64, 1}),
    sc::field("round", &ReadyInfo::round, sc::Uint{}),
    sc::field("window", &ReadyInfo::window, sc::Uint{}),
    sc::field("group", &ReadyInfo::group, sc::Bool{}),
    sc::field("average_phi", &ReadyInfo::average_phi, sc::Bool{}),
    sc::field("phi_hash", &ReadyInfo::phi_hash, sc::Bin{32}),
    sc::field("wait_for", &ReadyInfo::wait_for, sc::Uint{}),
    sc::field("behind", &ReadyInfo::behind, sc::Bool{}),
    sc::field("fresh", &ReadyInfo::fresh, sc::Bool{}),
    sc::field("delta_norm", &ReadyInfo::delta_norm, sc::Real{0.0, 1e300, true}));
}  // namespace

std::vector<std::uint8_t> encode_ready(const ReadyInfo& r) {
  return sc::encode(kReadySchema, r);
}

transport::Result<ReadyInfo> decode_ready(std::span<const std::uint8_t> value) {
  return sc::decode(kReadySchema, value);
}

dht::Key ready_key(const std::string& run_id, std::uint64_t window, std::uint64_t bucket,
                   std::uint64_t buckets) {
  std::string name = "grove/run/" + run_id + "/ready/" + std::to_string(window);
  if (buckets > 1) name += "/" + std::to_string(bucket) + "of" + std::to_string(buckets);
  return dht::key_of(name);
}

std::size_t bucket_count(std::size_t swarm_size, const MatchOptions& o) {
  if (o.bucket_members == 0 || o.group_size == 0 || o.same_round) return 1;
  std::size_t b = 1;
  while (b * 2 <= swarm_size / o.bucket_members && b < (std::size_t{1} << 20)) b *= 2;
  return b;
}

std::uint64_t bucket_of(const std::string& run_id, std::uint64_t window, const NodeId& id,
                        std::size_t buckets) {
  if (buckets <= 1) return 0;
  transport::Blake2b256 h;
  const std::string tag = "grove-bucket-v1/" + run_id + "/" + std::to_string(window) + "/";
  h.update({reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()});
  h.update(id);
  const auto d = h.final();
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | d[static_cast<std::size_t>(i)];
  return v & (buckets - 1);
}

namespace {
transport::Hash256 order_hash(const std::string& run_id, std::uint64_t window, const NodeId& id) {
  transport::Blake2b256 h;
  const std::string tag = "grove-match-v1/" + run_id + "/" + std::to_string(window) + "/";
  h.update({reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()});
  h.update(id);
  return h.final();
}
}  // namespace

namespace {
// Consecutive members (in hash order) taken k at a time; a remainder of at least half a group
// (and two) is a group of its own, a smaller one is spread over the last groups.
void chunk_groups(std::span<const std::pair<transport::Hash256, NodeId>> keyed, std::size_t k,
                  std::vector<std::vector<NodeId>>& groups) {
  const std::size_t first = groups.size();
  std::size_t i = 0;
  for (; i + k <= keyed.size(); i += k) {
    groups.emplace_back();
    for (std::size_t j = i; j < i + k; ++j) groups.back().push_back(keyed[j].second);
  }
  const std::size_t rest = keyed.size() - i;
  if (rest > 0 && (groups.size() == first || (rest >= 2 && 2 * rest >= k))) {
    groups.emplace_back();  // a remainder big enough to be a group of its own
    for (; i < keyed.size(); ++i) groups.back().push_back(keyed[i].second);
  }
  for (std::size_t g = groups.size(); i < keyed.size(); ++i) {  // else spread over the last ones
    g = g == first ? groups.size() - 1 : g - 1;
    groups[g].push_back(keyed[i].second);
  }
}
}  // namespace

std::vector<std::vector<NodeId>> make_groups(const std::string& run_id, std::uint64_t window,
                                             std::vector<NodeId> ids, std::size_t group_size) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<std::pair<transport::Hash256, NodeId>> keyed;
  for (const auto& id : ids) keyed.emplace_back(order_hash(run_id, window, id), id);
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::vector<NodeId>> groups;
  if (group_size == 0) {  // everyone in one group
    chunk_groups(keyed, std::max<std::size_t>(keyed.size(), 1), groups);
    return groups;
  }
  const std::size_t k = group_size;
  // Runs: the hash order is cut after every member whose hash ends in a byte ≡ 0 mod 8
  // (content-defined, like chunking a file by its bytes), and each run is grouped on its own.
  // Two readers whose record sets differ by one member then disagree on that member's run only
  // (8 members on average), not on every group after it in hash order, which in a window of a
  // thousand meant most pairs. A run is at least a group long; a tail shorter joins the last run.
  std::size_t begin = 0;
  while (begin < keyed.size()) {
    std::size_t end = begin;
    while (end < keyed.size()) {
      const bool boundary = keyed[end].first.back() % 8 == 0;
      ++end;
      if (boundary && end - begin >= k) break;
    }
    if (keyed.size() - end < k) end = keyed.size();  // a tail too small for a group joins us
    chunk_groups(std::span(keyed).subspan(begin, end - begin), k, groups);
    begin = end;
  }
  return groups;
}

OpId group_op(const std::string& run_id, std::uint64_t window, std::vector<NodeId> group) {
  std::sort(group.begin(), group.end());
  transport::Blake2b256 h;
  const std::string tag = "grove-group-v1/" + run_id + "/" + std::to_string(window) + "/";
  h.update({reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()});
  for (const auto& id : group) h.update(id);
  const auto d = h.final();
  OpId op;
  std::copy_n(d.begin(), op.size(), op.begin());
  return op;
}

std::map<NodeId, std::string> undeclared_norms(
    const std::vector<std::pair<NodeId, double>>& members) {
  std::map<NodeId, std::string> out;
  const auto declared = static_cast<std::size_t>(std::count_if(
      members.begin(), members.end(), [](const auto& m) { return std::isfinite(m.second); }));
  if (declared == 0) return out;  // nobody declared one (members of an older version)
  for (const auto& [id, x] : members)
    if (!std::isfinite(x))
      out[id] = "it declared no pseudo-gradient norm while " + std::to_string(declared) +
                " other member(s) of its round did";
  return out;
}

double norm_clip(std::vector<double> norms) {
  std::erase_if(norms, [](double x) { return !std::isfinite(x); });
  if (norms.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto mid = norms.begin() + static_cast<std::ptrdiff_t>(norms.size() / 2);
  std::nth_element(norms.begin(), mid, norms.end());  // the upper middle of an even count
  return kMaxNormToMedian * *mid;
}

Matchmaker::Matchmaker(dht::RecordStore& store, std::string run_id, MatchOptions opts)
    : store_(store), run_id_(std::move(run_id)), opts_(opts) {
  if (!dht::valid_run_id(run_id_)) throw transport::ConfigError("invalid run id: " + run_id_);
  if (opts_.window <= Time(0)) throw transport::ConfigError("matchmaking window must be > 0");
}

void Matchmaker::ready(std::uint64_t round, std::vector<std::string> addresses, Time now,
                       std::function<void(MatchResult)> done, bool average_phi,
                       const std::array<std::uint8_t, 32>& phi_hash, std::uint32_t wait_for,
                       bool behind, bool fresh, double delta_norm) {
  behind_ = behind;
  delta_norm_ = delta_norm;
  fresh_ = fresh;
  round_ = round;
  average_phi_ = average_phi;
  phi_hash_ = phi_hash;
  wait_for_ = wait_for;
  done_ = std::move(done);
  addresses_ = std::move(addresses);
  window_ = 0;
  publish(now);
  first_read_ = read_at_;
  busy_seen_ = Time::min();
}

namespace {
// The first window that closes at least `lead` after now.
std::uint64_t window_after(Time now, Time lead, Time window) {
  const auto w = window.count();
  return static_cast<std::uint64_t>((now + lead).count() + w - 1) / static_cast<std::uint64_t>(w);
}
}  // namespace

Time Matchmaker::read_time(Time now) const {
  const auto w = window_after(now, lead(), opts_.window);
  return Time(static_cast<std::int64_t>(w) * opts_.window.count()) + opts_.settle;
}

Time Matchmaker::lead() const {
  if (write_times_.size() < 3) return opts_.min_lead;
  std::vector<Time> t(write_times_.begin(), write_times_.end());
  std::nth_element(t.begin(), t.end() - 3, t.end());
  return std::clamp(*(t.end() - 3), opts_.min_lead, std::max(opts_.min_lead, opts_.max_lead));
}

void Matchmaker::on_written(std::uint64_t window, Time started, Time close) {
  const Time now = store_.now();
  write_times_.push_back(now - started);
  while (write_times_.size() > 8) write_times_.pop_front();
  written_window_ = window;
  if (now > close) late_window_ = window;
}

void Matchmaker::publish(Time now) {
  ++attempt_;
  const auto w = opts_.window.count();
  window_ = std::max(window_ + 1, window_after(now, lead(), opts_.window));
  const Time close{static_cast<std::int64_t>(window_) * w};
  read_at_ = close + opts_.settle;
  give_up_at_ = read_at_ + opts_.read_timeout;
  state_ = State::waiting;
  buckets_ = bucket_count(swarm_size_, opts_);
  bucket_ = bucket_of(run_id_, window_, store_.id(), buckets_);
  ReadyInfo info;
  info.addresses = addresses_;
  info.run_id = run_id_;
  info.round = round_;
  info.window = window_;
  info.group = opts_.same_round;
  info.average_phi = average_phi_;
  info.phi_hash = phi_hash_;
  info.wait_for = wait_for_;
  info.behind = behind_;
  info.fresh = fresh_;
  info.delta_norm = delta_norm_;
  // seq = window: a later window's record replaces an earlier one in our slot.
  store_.write(ready_key(run_id_, window_, bucket_, buckets_), "ready", window_,
               close + 4 * opts_.window, encode_ready(info), now,
               [this, window = window_, now, close](bool) { on_written(window, now, close); });
}

void Matchmaker::on_timer(Time now) {
  if (state_ == State::waiting && now >= read_at_) {
    state_ = State::reading;
    const std::uint64_t attempt = attempt_;
    store_.read(ready_key(run_id_, window_, bucket_, buckets_), now,
                [this, attempt](std::vector<dht::Record> r) { on_read(attempt, std::move(r)); });
    return;
  }
  if (state_ == State::reading && now >= give_up_at_) {
    MatchResult r;
    r.window = window_;
    r.group = {store_.id()};
    r.buckets = buckets_;
    r.note = "the read of the ready records timed out";
    finish(std::move(r));
  }
}

std::optional<Time> Matchmaker::next_deadline() const {
  if (state_ == State::waiting) return read_at_;
  if (state_ == State::reading) return give_up_at_;
  return std::nullopt;
}

void Matchmaker::on_read(std::uint64_t attempt, std::vector<dht::Record> records) {
  if (attempt != attempt_ || state_ != State::reading) return;
  MatchResult r;
  r.window = window_;
  r.buckets = buckets_;
  r.write_late = late_window_ == window_ || written_window_ != window_;
  struct Seen {
    NodeId id;
    std::uint64_t round;
    std::array<std::uint8_t, 32> phi_hash;
    std::uint32_t wait_for;
    bool behind, fresh;
    double delta_norm;
  };
  std::vector<Seen> seen;
  std::map<std::uint64_t, std::size_t> rounds;
  std::uint64_t highest = 0;
  for (const auto& rec : records) {
    if (seen.size() >= opts_.max_ready) break;
    if (rec.subkey != "ready") continue;
    auto info = decode_ready(rec.value);
    if (!info || info->run_id != run_id_ || info->window != window_ ||
        info->group != opts_.same_round)
      continue;
    const NodeId id = rec.owner_id();
    if (id != store_.id() && live_ && !live_(id)) {  // stale or departed member
      ++r.ready_not_live;
      continue;
    }
    // A record stored under a bucket its owner does not land in (a member writing to several
    // buckets to be grouped several times) is left out.
    if (buckets_ > 1 && bucket_of(run_id_, window_, id, buckets_) != bucket_) continue;
    seen.push_back({id, info->round, info->phi_hash, info->wait_for, info->behind, info->fresh,
                    info->delta_norm});
    ++rounds[info->round];
    highest = std::max(highest, info->round);
    r.average_phi |= opts_.same_round && info->average_phi;
    if (!info->addresses.empty()) r.addresses[id] = info->addresses.front();
  }
  r.ready_seen = seen.size();
  std::size_t best = 0;
  for (const auto& [round, count] : rounds)  // ascending: ties go to the higher round
    if (count >= best) best = count, r.swarm_round = round;
  if (r.average_phi) r.swarm_round = highest;
  r.at_swarm_round = rounds.count(r.swarm_round) ? rounds[r.swarm_round] : 0;
  // DiLoCo (Δ alone): a member that declared no ‖Δ‖ while others of its round did is left out,
  // decided from the records alike by every reader (its Δ could not be bounded).
  std::map<NodeId, std::string> outliers;
  if (opts_.same_round && !r.average_phi) {
    std::vector<std::pair<NodeId, double>> at_round;
    for (const auto& e : seen)
      if (e.round == r.swarm_round) at_round.emplace_back(e.id, e.delta_norm);
    outliers = undeclared_norms(at_round);
  }
  std::vector<NodeId> ids;
  for (const auto& e : seen)
    if (!opts_.same_round || r.average_phi || (e.round == r.swarm_round && !outliers.count(e.id)))
      ids.push_back(e.id);
  for (const auto& [id, why] : outliers) r.left_out.push_back(id);
  r.group = {store_.id()};
  const bool found =
      std::any_of(seen.begin(), seen.end(), [&](const Seen& e) { return e.id == store_.id(); });
  if (!found) {
    r.note = "our own ready record was not found";
  } else if (opts_.same_round && !r.average_phi && round_ != r.swarm_round) {
    r.out_of_sync = true;
    r.note = "our round " + std::to_string(round_) + " is not the swarm's round " +
             std::to_string(r.swarm_round);
  } else if (auto it = outliers.find(store_.id()); it != outliers.end()) {
    r.norm_excluded = true;
    r.note = it->second;
  } else {
    for (auto& g : make_groups(run_id_, window_, ids, opts_.group_size))
      if (std::find(g.begin(), g.end(), store_.id()) != g.end()) r.group = g;
    if (opts_.same_round) {
      r.all_fresh = r.group.size() > 1;
      for (const auto& e : seen)
        if (std::find(r.group.begin(), r.group.end(), e.id) != r.group.end()) {
          r.wait_for = std::max<std::size_t>(r.wait_for, e.wait_for);
          r.behind |= e.behind;
          r.all_fresh &= e.fresh;
        }
      // The members the records counted at this round include those left out: not waited for.
      r.wait_for -= std::min(r.wait_for, outliers.size());
    }
    if (opts_.same_round && !r.average_phi && r.group.size() > 1) {
      // Members of one round that name different slow weights (the swarm split for a while and
      // its parts ended the same round apart): this group averages φ too and ends with one.
      std::set<std::array<std::uint8_t, 32>> hashes;
      for (const auto& e : seen)
        if (std::find(r.group.begin(), r.group.end(), e.id) != r.group.end())
          hashes.insert(e.phi_hash);
      if (hashes.size() > 1) {
        r.average_phi = true;
        r.note = "the group's members hold " + std::to_string(hashes.size()) +
                 " different slow weights: averaging them";
      }
    }
    if (opts_.same_round && !r.average_phi && r.group.size() > 1) {
      for (const auto& e : seen)
        if (std::isfinite(e.delta_norm) &&
            std::find(r.group.begin(), r.group.end(), e.id) != r.group.end())
          r.delta_norms[e.id] = e.delta_norm;
      if (r.delta_norms.size() != r.group.size()) r.delta_norms.clear();
      std::vector<double> norms;
      for (const auto& [id, x] : r.delta_norms) norms.push_back(x);
      r.clip_norm = norm_clip(std::move(norms));
    }
    if (r.group.size() == 1) {
      const Time now = store_.now();
      // Patience counts from our first window's read, not from ready(): a node whose lead is
      // longer than the others' (its writes queued behind a state it serves over a slow link)
      // lands a window or more after theirs, and still waits a whole round of theirs. Others
      // still in a round of theirs move its start to now (busy_cap).
      if (busy_ && now - first_read_ < opts_.busy_cap && busy_(now)) busy_seen_ = now;
      if (now + opts_.window - std::max(first_read_, busy_seen_) <= opts_.patience)
        return publish(now);  // next window
      r.note = "nobody else was ready in this window";
    }
  }
  finish(std::move(r));
}

void Matchmaker::finish(MatchResult r) {
  state_ = State::idle;
  ++attempt_;
  if (auto done = std::exchange(done_, nullptr)) done(std::move(r));
}

}  // namespace grove::gossip
