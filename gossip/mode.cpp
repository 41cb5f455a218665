#include "gossip/mode.hpp"

#include "dht/key.hpp"
#include "transport/schema.hpp"

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

namespace {
namespace sc = transport::schema;
constexpr auto kModeSchema = sc::record<ModeRequest>(
    "mode record", 1, sc::field("run", &ModeRequest::run_id, sc::Str{64, 1}),
    sc::field("mode", &ModeRequest::mode, sc::Uint{static_cast<std::uint64_t>(OuterMode::diloco)}),
    sc::field("from_round", &ModeRequest::from_round, sc::Uint{}));
}  // namespace

std::vector<std::uint8_t> encode_mode(const ModeRequest& r) {
  return sc::encode(kModeSchema, r);
}

transport::Result<ModeRequest> decode_mode(std::span<const std::uint8_t> value) {
  return sc::decode(kModeSchema, value);
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
