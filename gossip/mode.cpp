#include "gossip/mode.hpp"

#include <msgpack.hpp>

#include "dht/key.hpp"
#include "transport/frame.hpp"
#include "transport/msgpack_util.hpp"

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
  return transport::mp::bytes_of(sb);
}

transport::Result<ModeRequest> decode_mode(std::span<const std::uint8_t> value) {
  auto oh = transport::unpack_bounded(
      value, {.array = 3, .map = 0, .str = 64, .bin = 0, .ext = 0, .depth = 1});
  if (!oh) return oh.error();
  const auto& o = oh->get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) return errc::malformed;
  const auto* a = o.via.array.ptr;
  ModeRequest r;
  std::uint64_t mode = 0;
  if (!transport::mp::get_str(a[0], 64, r.run_id) || !transport::mp::get_u64(a[1], mode) ||
      mode > 1 || !transport::mp::get_u64(a[2], r.from_round))
    return errc::malformed;
  r.mode = static_cast<OuterMode>(mode);
  return r;
}

std::string mode_subkey(std::uint64_t from_round) {
  return "mode:" + std::to_string(from_round);
}

dht::Key mode_key(const std::string& run_id) {
  return dht::key_of("grove/run/" + run_id + "/mode");
}

std::vector<ModeRequest> mode_requests(const std::string& run_id,
                                       const std::vector<dht::Record>& records) {
  std::vector<ModeRequest> out;
  for (const auto& rec : records) {
    if (!rec.subkey.starts_with("mode")) continue;
    auto r = decode_mode(rec.value);
    if (!r || r->run_id != run_id || rec.subkey != mode_subkey(r->from_round)) continue;
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
