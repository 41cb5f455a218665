// Signed DHT records. A record lives at a key, in a slot named by (owner, subkey): the owner is
// the Ed25519 key that signed it, so nobody can overwrite another node's slot, and many writers
// can share one key (a dictionary: the members of a run all write under the run's key). In a
// slot the highest sequence number wins; a record expires at an absolute wall-clock time.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "dht/key.hpp"
#include "transport/identity.hpp"

namespace grove::dht {

/// Wall-clock milliseconds since the Unix epoch: record expiry and every deadline of the
/// sans-IO cores are in this unit (the drivers inject it; the simulator's clock is virtual).
using Time = std::chrono::milliseconds;
using transport::PublicKey;
using transport::Signature;

struct Record {
  Key key{};
  std::string subkey;  ///< "" for a plain record
  PublicKey owner{};
  std::uint64_t seq = 0;
  Time expires{0};
  std::vector<std::uint8_t> value;
  Signature sig{};

  NodeId owner_id() const { return transport::node_id_from_key(owner); }
  /// Approximate bytes held/sent for this record (quota accounting).
  std::size_t footprint() const { return 32 + subkey.size() + 32 + 8 + 8 + value.size() + 64; }
  bool same_slot(const Record& o) const {
    return key == o.key && owner == o.owner && subkey == o.subkey;
  }
};

struct RecordLimits {
  std::size_t max_subkey = 64;
  std::size_t max_value = 8192;
  Time max_ttl{std::chrono::hours(24)};       ///< expiry further than this (+skew) is refused
  Time clock_skew{std::chrono::seconds(60)};  ///< tolerated difference between node clocks
};

/// Why a record was refused (ok = valid).
enum class RecordStatus {
  ok,
  bad_signature,
  expired,
  too_far_future,
  too_large,
  wrong_key,  ///< a reply carried a record for a key that was not asked for
};
const char* to_string(RecordStatus s);

/// The bytes the owner signs: a domain tag and every field but the signature.
std::vector<std::uint8_t> signing_bytes(const Record& r);

/// Builds and signs a record.
Record make_record(const transport::Identity& owner, const Key& key, std::string subkey,
                   std::uint64_t seq, Time expires, std::vector<std::uint8_t> value);

/// Size limits, expiry window and signature (in that order: cheap checks first).
/// Signatures already verified, by a BLAKE2b-256 of (owner, signature, signed bytes): the same
/// record comes back on every poll of a key and from several replicas, and an Ed25519 check
/// costs ~50 µs against ~1 µs for the hash. Only successes are kept (a forgery is checked again
/// every time), in a bounded first-in first-out set.
class SignatureCache {
 public:
  explicit SignatureCache(std::size_t capacity = 16384) : capacity_(capacity) {}
  /// transport::verify_signature, remembered.
  bool verify(const PublicKey& owner, std::span<const std::uint8_t> msg, const Signature& sig);
  std::uint64_t hits() const { return hits_; }

 private:
  std::size_t capacity_;
  std::set<std::array<std::uint8_t, 32>> seen_;
  std::deque<std::array<std::uint8_t, 32>> order_;
  std::uint64_t hits_ = 0;
};

/// `cache` (optional) skips the signature check of a record verified before.
RecordStatus check_record(const Record& r, Time now, const RecordLimits& limits,
                          SignatureCache* cache = nullptr);

}  // namespace grove::dht
