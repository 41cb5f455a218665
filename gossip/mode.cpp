#include "gossip/mode.hpp"

#include <msgpack.hpp>

#include "dht/key.hpp"
#include "transport/frame.hpp"

namespace grove::gossip {

using transport::errc;

const char* to_string(OuterMode m) {
  return m == OuterMode::diloco ? "diloco" : "noloco";
}

std::optional<OuterMode> parse_mode(std::string_view s) {
  if (s == "noloco") return OuterMode::noloco;
  if (s == "diloco") return OuterMode::diloco;
  return std::nullopt;
}

std::vector<std::uint8_t> encode_mode(const ModeRequest& r) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_array(3);
  pk.pack(r.run_id);
  pk.pack(static_cast<std::uint8_t>(r.mode));
  pk.pack(r.from_round);
  return {reinterpret_cast<const std::uint8_t*>(sb.data()),
          reinterpret_cast<const std::uint8_t*>(sb.data()) + sb.size()};
}

transport::Result<ModeRequest> decode_mode(std::span<const std::uint8_t> value) {
  auto oh = transport::unpack_bounded(
      value, {.array = 3, .map = 0, .str = 64, .bin = 0, .ext = 0, .depth = 1});
  if (!oh) return oh.error();
  const auto& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) return errc::malformed;
  const auto* a = o.via.array.ptr;
  if (a[0].type != msgpack::type::STR || a[1].type != msgpack::type::POSITIVE_INTEGER ||
      a[1].via.u64 > 1 || a[2].type != msgpack::type::POSITIVE_INTEGER)
    return errc::malformed;
  ModeRequest r;
  r.run_id.assign(a[0].via.str.ptr, a[0].via.str.size);
  r.mode = static_cast<OuterMode>(a[1].via.u64);
  r.from_round = a[2].via.u64;
  return r;
}

dht::Key mode_key(const std::string& run_id) {
  return dht::key_of("grove/run/" + run_id + "/mode");
}

std::vector<ModeRequest> mode_requests(const std::string& run_id,
                                       const std::vector<dht::Record>& records) {
  std::vector<ModeRequest> out;
  for (const auto& rec : records) {
    if (rec.subkey != "mode") continue;
    auto r = decode_mode(rec.value);
    if (!r || r->run_id != run_id) continue;
    r->requester = rec.owner_id();
    out.push_back(*r);
  }
  return out;
}

OuterMode mode_for_round(const std::vector<ModeRequest>& requests, std::uint64_t round,
                         OuterMode configured) {
  const ModeRequest* best = nullptr;
  for (const auto& r : requests) {
    if (r.from_round > round) continue;
    if (!best || r.from_round > best->from_round ||
        (r.from_round == best->from_round && r.requester > best->requester))
      best = &r;
  }
  return best ? best->mode : configured;
}

}  // namespace grove::gossip
