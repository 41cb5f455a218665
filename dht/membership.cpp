#include "dht/membership.hpp"

#include "transport/schema.hpp"

namespace grove::dht {

const char* to_string(MemberEvent e) {
  switch (e) {
    case MemberEvent::joined:
      return "joined";
    case MemberEvent::updated:
      return "updated";
    case MemberEvent::left:
      return "left";
  }
  return "?";
}

bool valid_run_id(const std::string& run_id) {
  if (run_id.empty() || run_id.size() > 64) return false;
  for (unsigned char c : run_id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

Key members_key(const std::string& run_id) {
  return key_of("grove/run/" + run_id + "/members");
}

namespace {
namespace sc = transport::schema;
constexpr auto kMemberSchema = sc::record<MemberInfo>(
    "member record", 1, sc::field("addresses", &MemberInfo::addresses, sc::list(8, sc::Str{200})),
    sc::field("run", &MemberInfo::run_id, sc::Str{64, 1}),
    sc::field("status", &MemberInfo::status, sc::Str{32}),
    sc::field("reach", &MemberInfo::reach,
              sc::Uint{static_cast<std::uint64_t>(transport::Reachability::unreachable)}),
    sc::field("payload", &MemberInfo::payload, sc::Bin{kMaxMemberPayload}));
}  // namespace

std::vector<std::uint8_t> encode_member(const MemberInfo& m) {
  return sc::encode(kMemberSchema, m);
}

transport::Result<MemberInfo> decode_member(std::span<const std::uint8_t> value) {
  return sc::decode(kMemberSchema, value);
}

Membership::Membership(RecordStore& store, std::string run_id, MembershipOptions opts)
    : store_(store), run_id_(std::move(run_id)), key_(members_key(run_id_)), opts_(opts) {
  if (!valid_run_id(run_id_))
    throw transport::ConfigError("run id must be 1-64 printable ASCII characters without spaces");
  if (opts_.publish_every >= opts_.ttl || opts_.poll_every >= opts_.ttl)
    throw transport::ConfigError("membership: publish and poll intervals must be below the TTL");
}

void Membership::set_self(MemberInfo info) {
  info.id = store_.id();
  info.run_id = run_id_;
  self_ = std::move(info);
  publishing_ = true;
  leaving_ = false;
  next_publish_ = Time(0);  // at the next on_timer
}

void Membership::leave(Time now, std::function<void()> done) {
  if (!publishing_) {
    if (done) done();
    return;
  }
  self_.status = "leaving";
  leaving_ = true;
  publish(now, std::move(done));
  publishing_ = false;
  next_publish_ = Time::max();
}

void Membership::on_timer(Time now) {
  if (publishing_ && now >= next_publish_) publish(now);
  if (now >= next_poll_) poll(now);
}

void Membership::publish(Time now, std::function<void()> done) {
  next_publish_ = now + opts_.publish_every;
  // Sequence numbers grow with the clock, and always by at least one (restarts included).
  seq_ = std::max<std::uint64_t>(seq_ + 1, static_cast<std::uint64_t>(now.count()));
  const Time expires = now + (leaving_ ? opts_.publish_every : record_ttl());
  Record r = store_.write(key_, "member", seq_, expires, encode_member(self_), now,
                          [done = std::move(done)](bool) {
                            if (done) done();
                          });
  // Our own record enters our view at once (a put does not report back to us).
  merge({std::move(r)}, now);
}

void Membership::poll(Time now) {
  next_poll_ = now + poll_interval();
  if (polling_) return;  // the previous poll is still running (slow network)
  polling_ = true;
  std::weak_ptr<bool> alive = alive_;
  store_.read(
      key_, now,
      [this, alive](std::vector<Record> records) {
        if (alive.expired()) return;
        polling_ = false;
        ++polls_;
        merge(std::move(records), store_.now());
      },
      GetOptions{opts_.read_quorum, true});
}

void Membership::merge(std::vector<Record> records, Time now) {
  std::map<NodeId, MemberInfo> seen;
  for (Record& r : records) {
    if (r.subkey != "member") continue;
    auto m = decode_member(r.value);
    if (!m || m->run_id != run_id_) continue;  // another run's record under a colliding key
    m->id = r.owner_id();
    m->expires = r.expires;
    m->seq = r.seq;
    auto& slot = seen[m->id];
    if (slot.seq < m->seq) slot = std::move(*m);
  }
  // Updates and joins.
  for (auto& [id, m] : seen) {
    if (m.expires <= now) continue;
    auto it = view_.find(id);
    if (m.status == "leaving") {
      if (it != view_.end() && it->second.seq <= m.seq) {
        MemberInfo gone = it->second;
        view_.erase(it);
        emit(MemberEvent::left, gone);
      }
      continue;
    }
    if (it == view_.end()) {
      if (view_.size() >= opts_.max_members) continue;
      view_.emplace(id, m);
      emit(MemberEvent::joined, m);
    } else if (it->second.seq < m.seq) {
      const bool changed = it->second.addresses != m.addresses || it->second.status != m.status ||
                           it->second.reach != m.reach || it->second.payload != m.payload;
      it->second = m;
      if (changed) emit(MemberEvent::updated, m);
    }
  }
  // Departures: records that expired (the node stopped refreshing).
  for (auto it = view_.begin(); it != view_.end();) {
    if (it->second.expires <= now) {
      MemberInfo gone = it->second;
      it = view_.erase(it);
      emit(MemberEvent::left, gone);
    } else {
      ++it;
    }
  }
}

void Membership::emit(MemberEvent e, const MemberInfo& m) {
  for (auto& w : watchers_) w(e, m);
}

std::vector<MemberInfo> Membership::live(Time now) const {
  std::vector<MemberInfo> out;
  for (const auto& [id, m] : view_)
    if (m.expires > now) out.push_back(m);
  return out;
}

}  // namespace grove::dht
