#include "dht/membership.hpp"

#include <cmath>
#include <cstring>

#include <msgpack.hpp>

#include "transport/frame.hpp"

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

std::vector<std::uint8_t> encode_member(const MemberInfo& m) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(8);
  p.pack_array(static_cast<std::uint32_t>(m.addresses.size()));
  for (const auto& a : m.addresses) p.pack(a);
  p.pack(m.run_id);
  p.pack_uint64(m.round);
  p.pack_uint64(m.step);
  p.pack(m.status);
  p.pack_double(m.throughput);
  p.pack_bin(32);
  p.pack_bin_body(reinterpret_cast<const char*>(m.weights_hash.data()), 32);
  p.pack_uint8(static_cast<std::uint8_t>(m.reach));
  const auto* d = reinterpret_cast<const std::uint8_t*>(buf.data());
  return {d, d + buf.size()};
}

transport::Result<MemberInfo> decode_member(std::span<const std::uint8_t> value) {
  auto oh = transport::unpack_bounded(
      value, {.array = 8, .map = 0, .str = 200, .bin = 32, .ext = 0, .depth = 2});
  if (!oh) return oh.error();
  const msgpack::object& o = oh->get();
  using T = msgpack::type::object_type;
  if (o.type != T::ARRAY || o.via.array.size < 7 || o.via.array.size > 8)
    return transport::errc::malformed;
  const msgpack::object* a = o.via.array.ptr;
  MemberInfo m;
  if (a[0].type != T::ARRAY) return transport::errc::malformed;
  for (std::uint32_t i = 0; i < a[0].via.array.size; ++i) {
    const auto& s = a[0].via.array.ptr[i];
    if (s.type != T::STR) return transport::errc::malformed;
    m.addresses.emplace_back(s.via.str.ptr, s.via.str.size);
  }
  if (a[1].type != T::STR || a[2].type != T::POSITIVE_INTEGER || a[3].type != T::POSITIVE_INTEGER ||
      a[4].type != T::STR ||
      (a[5].type != T::FLOAT64 && a[5].type != T::FLOAT32 && a[5].type != T::POSITIVE_INTEGER) ||
      a[6].type != T::BIN || a[6].via.bin.size != 32 || a[4].via.str.size > 32)
    return transport::errc::malformed;
  m.run_id.assign(a[1].via.str.ptr, a[1].via.str.size);
  m.round = a[2].via.u64;
  m.step = a[3].via.u64;
  m.status.assign(a[4].via.str.ptr, a[4].via.str.size);
  // msgpack-c packs a whole-number double as an integer.
  m.throughput =
      a[5].type == T::POSITIVE_INTEGER ? static_cast<double>(a[5].via.u64) : a[5].via.f64;
  if (!std::isfinite(m.throughput) || m.throughput < 0) return transport::errc::malformed;
  std::memcpy(m.weights_hash.data(), a[6].via.bin.ptr, 32);
  if (o.via.array.size == 8) {
    if (a[7].type != T::POSITIVE_INTEGER || a[7].via.u64 > 2) return transport::errc::malformed;
    m.reach = static_cast<transport::Reachability>(a[7].via.u64);
  }
  return m;
}

Membership::Membership(DhtNode& dht, std::string run_id, MembershipOptions opts)
    : dht_(dht), run_id_(std::move(run_id)), key_(members_key(run_id_)), opts_(opts) {
  if (!valid_run_id(run_id_))
    throw transport::ConfigError("run id must be 1-64 printable ASCII characters without spaces");
  if (opts_.publish_every >= opts_.ttl || opts_.poll_every >= opts_.ttl)
    throw transport::ConfigError("membership: publish and poll intervals must be below the TTL");
}

void Membership::set_self(MemberInfo info) {
  info.id = dht_.id();
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
  Record r = make_record(dht_.identity(), key_, "member", seq_, expires, encode_member(self_));
  // Our own record enters our view at once (a put does not report back to us).
  merge({r}, now);
  dht_.put({std::move(r)}, now, [done = std::move(done)](PutResult) {
    if (done) done();
  });
}

void Membership::poll(Time now) {
  next_poll_ = now + poll_interval();
  if (polling_) return;  // the previous poll is still running (slow network)
  polling_ = true;
  std::weak_ptr<bool> alive = alive_;
  dht_.get(
      key_, now,
      [this, alive](GetResult g) {
        if (alive.expired()) return;
        polling_ = false;
        ++polls_;
        merge(std::move(g.records), dht_.now());
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
      const bool changed = it->second.addresses != m.addresses || it->second.round != m.round ||
                           it->second.step != m.step || it->second.status != m.status ||
                           it->second.weights_hash != m.weights_hash || it->second.reach != m.reach;
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
