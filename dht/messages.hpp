// DHT wire messages. Every message is one msgpack array
//   [version=1, type, txid, sender_address, body...]
// carried as the payload of a transport one-way message (method "dht"). The sender's node ID is
// not in the message: the transport proved it in the handshake. sender_address is where the
// sender accepts connections ("" = it cannot be dialled). Bodies by type:
//   ping        []                          pong   [observed_address]
//   find_node   [target]                    nodes  [[contact...]]
//   find_value  [key, cursor|nil]           value  [[record...], [contact...], cursor|nil]
//   store       [[record...]]               stored [codes(bin, one StoreCode per record)]
//   error       [code, text]
// contact = [id(bin 32), address(str)]; cursor = [owner(bin 32), subkey(str)] (paging through a
// key with more records than fit one reply); record = [key, subkey, owner, seq, expires_ms,
// value, sig]. Decoding is bounded (explicit unpack_limit, counts, sizes) and never throws.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dht/record.hpp"
#include "transport/error.hpp"

namespace grove::dht {

enum class MsgType : std::uint8_t {
  ping = 1,
  pong,
  find_node,
  nodes,
  find_value,
  value,
  store,
  stored,
  error,
};
const char* to_string(MsgType t);
inline bool is_request(MsgType t) {
  return t == MsgType::ping || t == MsgType::find_node || t == MsgType::find_value ||
         t == MsgType::store;
}

struct Contact {
  NodeId id{};
  std::string address;
  friend bool operator==(const Contact&, const Contact&) = default;
};

/// Where a page of records resumes: after (owner, subkey) in the key's slot order.
struct Cursor {
  PublicKey owner{};
  std::string subkey;
  friend bool operator==(const Cursor&, const Cursor&) = default;
};

/// Outcome of storing one record (the `stored` reply carries one per record).
enum class StoreCode : std::uint8_t {
  stored = 0,  ///< new slot
  updated,     ///< replaced an older sequence number
  unchanged,   ///< the same record was already held
  stale,       ///< an equal or newer sequence number is held (replay)
  invalid,     ///< signature, size or expiry check failed
  over_quota,  ///< storage quotas refused it
};
const char* to_string(StoreCode c);

enum class ErrorCode : std::uint8_t { rate_limited = 1, malformed, internal };

struct Message {
  MsgType type = MsgType::ping;
  std::uint64_t txid = 0;
  std::string sender_address;
  Key target{};                   ///< find_node target / find_value key
  std::optional<Cursor> cursor;   ///< find_value: resume point; value: next page
  std::vector<Contact> contacts;  ///< nodes, value
  std::vector<Record> records;    ///< value, store
  std::vector<StoreCode> codes;   ///< stored
  std::string observed;           ///< pong: the requester's address as the responder saw it
  ErrorCode error = ErrorCode::internal;
  std::string text;  ///< error
};

struct WireLimits {
  std::size_t max_message = 160 * 1024;  ///< encoded bytes
  std::size_t max_contacts = 32;
  std::size_t max_records = 64;
  std::size_t max_store_records = 16;
  std::size_t max_address = 200;
  RecordLimits record;
};

std::vector<std::uint8_t> encode(const Message& m);
/// Rejects anything malformed, over a limit or of an unknown version (errc::malformed).
transport::Result<Message> decode(std::span<const std::uint8_t> bytes, const WireLimits& limits);

}  // namespace grove::dht
