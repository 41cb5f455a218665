#include "dht/messages.hpp"

#include <msgpack.hpp>

#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

namespace grove::dht {

using transport::errc;

const char* to_string(MsgType t) {
  switch (t) {
    case MsgType::ping:
      return "ping";
    case MsgType::pong:
      return "pong";
    case MsgType::find_node:
      return "find_node";
    case MsgType::nodes:
      return "nodes";
    case MsgType::find_value:
      return "find_value";
    case MsgType::value:
      return "value";
    case MsgType::store:
      return "store";
    case MsgType::stored:
      return "stored";
    case MsgType::error:
      return "error";
  }
  return "?";
}

const char* to_string(StoreCode c) {
  switch (c) {
    case StoreCode::stored:
      return "stored";
    case StoreCode::updated:
      return "updated";
    case StoreCode::unchanged:
      return "unchanged";
    case StoreCode::stale:
      return "stale";
    case StoreCode::invalid:
      return "invalid";
    case StoreCode::over_quota:
      return "over quota";
  }
  return "?";
}

namespace {

constexpr std::uint64_t kVersion = 1;
using transport::mp::get_array;
using transport::mp::get_bytes;
using transport::mp::get_fixed;
using transport::mp::get_str;
using transport::mp::get_u64;
using transport::mp::Obj;
using transport::mp::pack_bin;
using transport::mp::pack_str;
using transport::mp::Packer;

void pack_contacts(Packer& p, const std::vector<Contact>& cs) {
  p.pack_array(static_cast<std::uint32_t>(cs.size()));
  for (const auto& c : cs) {
    p.pack_array(2);
    pack_bin(p, c.id);
    pack_str(p, c.address);
  }
}
void pack_records(Packer& p, const std::vector<Record>& rs) {
  p.pack_array(static_cast<std::uint32_t>(rs.size()));
  for (const auto& r : rs) {
    p.pack_array(7);
    pack_bin(p, r.key);
    pack_str(p, r.subkey);
    pack_bin(p, r.owner);
    p.pack_uint64(r.seq);
    p.pack_uint64(static_cast<std::uint64_t>(r.expires.count()));
    pack_bin(p, r.value);
    pack_bin(p, r.sig);
  }
}
void pack_cursor(Packer& p, const std::optional<Cursor>& c) {
  if (!c) return p.pack_nil(), void();
  p.pack_array(2);
  pack_bin(p, c->owner);
  pack_str(p, c->subkey);
}

// ---- decoding helpers: each checks the type and bounds, never throws ----
bool get_contacts(const Obj& o, const WireLimits& lim, std::vector<Contact>& out) {
  std::size_t n = 0;
  const Obj* a = get_array(o, lim.max_contacts, n);
  if (!a) return false;
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t m = 0;
    const Obj* c = get_array(a[i], 2, m);
    if (!c || m != 2 || !get_fixed(c[0], out[i].id) ||
        !get_str(c[1], lim.max_address, out[i].address))
      return false;
  }
  return true;
}

bool get_records(const Obj& o, std::size_t max, const WireLimits& lim, std::vector<Record>& out) {
  std::size_t n = 0;
  const Obj* a = get_array(o, max, n);
  if (!a) return false;
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t m = 0;
    const Obj* f = get_array(a[i], 7, m);
    std::uint64_t expires = 0;
    Record& r = out[i];
    if (!f || m != 7 || !get_fixed(f[0], r.key) ||
        !get_str(f[1], lim.record.max_subkey, r.subkey) || !get_fixed(f[2], r.owner) ||
        !get_u64(f[3], r.seq) || !get_u64(f[4], expires) ||
        !get_bytes(f[5], lim.record.max_value, r.value) || !get_fixed(f[6], r.sig))
      return false;
    if (expires > static_cast<std::uint64_t>(INT64_MAX)) return false;
    r.expires = Time(static_cast<std::int64_t>(expires));
  }
  return true;
}

bool get_cursor(const Obj& o, const WireLimits& lim, std::optional<Cursor>& out) {
  if (o.type == msgpack::type::NIL) return out.reset(), true;
  std::size_t m = 0;
  const Obj* c = get_array(o, 2, m);
  Cursor cur;
  if (!c || m != 2 || !get_fixed(c[0], cur.owner) ||
      !get_str(c[1], lim.record.max_subkey, cur.subkey))
    return false;
  out = std::move(cur);
  return true;
}

}  // namespace

std::vector<std::uint8_t> encode(const Message& m) {
  msgpack::sbuffer buf;
  Packer p(buf);
  std::uint32_t body = 0;
  switch (m.type) {
    case MsgType::ping:
      body = 0;
      break;
    case MsgType::pong:
      body = 1;
      break;
    case MsgType::find_node:
      body = 1;
      break;
    case MsgType::nodes:
      body = 1;
      break;
    case MsgType::find_value:
      body = 2;
      break;
    case MsgType::value:
      body = 3;
      break;
    case MsgType::store:
      body = 1;
      break;
    case MsgType::stored:
      body = 1;
      break;
    case MsgType::error:
      body = 2;
      break;
  }
  p.pack_array(4 + body);
  p.pack_uint64(kVersion);
  p.pack_uint8(static_cast<std::uint8_t>(m.type));
  p.pack_uint64(m.txid);
  pack_str(p, m.sender_address);
  switch (m.type) {
    case MsgType::ping:
      break;
    case MsgType::pong:
      pack_str(p, m.observed);
      break;
    case MsgType::find_node:
      pack_bin(p, m.target);
      break;
    case MsgType::nodes:
      pack_contacts(p, m.contacts);
      break;
    case MsgType::find_value:
      pack_bin(p, m.target);
      pack_cursor(p, m.cursor);
      break;
    case MsgType::value:
      pack_records(p, m.records);
      pack_contacts(p, m.contacts);
      pack_cursor(p, m.cursor);
      break;
    case MsgType::store:
      pack_records(p, m.records);
      break;
    case MsgType::stored: {
      std::vector<std::uint8_t> c(m.codes.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<std::uint8_t>(m.codes[i]);
      pack_bin(p, c);
      break;
    }
    case MsgType::error:
      p.pack_uint8(static_cast<std::uint8_t>(m.error));
      pack_str(p, m.text);
      break;
  }
  const auto* d = reinterpret_cast<const std::uint8_t*>(buf.data());
  return {d, d + buf.size()};
}

transport::Result<Message> decode(std::span<const std::uint8_t> bytes, const WireLimits& lim) {
  if (bytes.size() > lim.max_message) return errc::malformed;
  auto oh = transport::unpack_bounded(
      bytes, {.array = std::max({lim.max_contacts, lim.max_records, std::size_t{8}}),
              .map = 0,
              .str = std::max(lim.max_address, lim.record.max_subkey),
              .bin = std::max(lim.record.max_value, std::size_t{256}),
              .ext = 0,
              .depth = 4});
  if (!oh) return oh.error();
  const Obj& root = oh->get();
  std::size_t n = 0;
  const Obj* a = get_array(root, 8, n);
  if (!a || n < 4) return errc::malformed;
  std::uint64_t version = 0, type = 0;
  Message m;
  if (!get_u64(a[0], version) || version != kVersion || !get_u64(a[1], type) ||
      type < static_cast<std::uint64_t>(MsgType::ping) ||
      type > static_cast<std::uint64_t>(MsgType::error) || !get_u64(a[2], m.txid) ||
      !get_str(a[3], lim.max_address, m.sender_address))
    return errc::malformed;
  m.type = static_cast<MsgType>(type);
  const Obj* b = a + 4;
  const std::size_t nb = n - 4;
  bool ok = false;
  switch (m.type) {
    case MsgType::ping:
      ok = nb == 0;
      break;
    case MsgType::pong:
      ok = nb == 1 && get_str(b[0], lim.max_address, m.observed);
      break;
    case MsgType::find_node:
      ok = nb == 1 && get_fixed(b[0], m.target);
      break;
    case MsgType::nodes:
      ok = nb == 1 && get_contacts(b[0], lim, m.contacts);
      break;
    case MsgType::find_value:
      ok = nb == 2 && get_fixed(b[0], m.target) && get_cursor(b[1], lim, m.cursor);
      break;
    case MsgType::value:
      ok = nb == 3 && get_records(b[0], lim.max_records, lim, m.records) &&
           get_contacts(b[1], lim, m.contacts) && get_cursor(b[2], lim, m.cursor);
      break;
    case MsgType::store:
      ok = nb == 1 && get_records(b[0], lim.max_store_records, lim, m.records);
      break;
    case MsgType::stored: {
      std::vector<std::uint8_t> c;
      ok = nb == 1 && get_bytes(b[0], lim.max_store_records, c);
      for (std::size_t i = 0; ok && i < c.size(); ++i) {
        if (c[i] > static_cast<std::uint8_t>(StoreCode::over_quota))
          ok = false;
        else
          m.codes.push_back(static_cast<StoreCode>(c[i]));
      }
      break;
    }
    case MsgType::error: {
      std::uint64_t code = 0;
      ok = nb == 2 && get_u64(b[0], code) && code >= 1 && code <= 3 && get_str(b[1], 200, m.text);
      m.error = static_cast<ErrorCode>(code);
      break;
    }
  }
  if (!ok) return errc::malformed;
  return m;
}

}  // namespace grove::dht
