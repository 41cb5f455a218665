#include "dht/record.hpp"

#include "transport/crypto.hpp"

#include <cstring>
#include <string_view>

namespace grove::dht {

const char* to_string(RecordStatus s) {
  switch (s) {
    case RecordStatus::ok:
      return "ok";
    case RecordStatus::bad_signature:
      return "bad signature";
    case RecordStatus::expired:
      return "expired";
    case RecordStatus::too_far_future:
      return "expiry too far in the future";
    case RecordStatus::too_large:
      return "too large";
    case RecordStatus::wrong_key:
      return "wrong key";
  }
  return "?";
}

std::vector<std::uint8_t> signing_bytes(const Record& r) {
  static constexpr std::string_view kDomain = "grove-dht-record-v1";
  std::vector<std::uint8_t> out(kDomain.size() + 32 + 2 + r.subkey.size() + 16 + 4 +
                                r.value.size());
  std::uint8_t* p = out.data();
  auto put = [&p](const void* src, std::size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  };
  auto put_be = [&p](std::uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) *p++ = static_cast<std::uint8_t>(v >> (8 * i));
  };
  put(kDomain.data(), kDomain.size());
  put(r.key.data(), r.key.size());
  put_be(r.subkey.size(), 2);
  put(r.subkey.data(), r.subkey.size());
  put_be(r.seq, 8);
  put_be(static_cast<std::uint64_t>(r.expires.count()), 8);
  put_be(r.value.size(), 4);
  put(r.value.data(), r.value.size());
  return out;
}

Record make_record(const transport::Identity& owner, const Key& key, std::string subkey,
                   std::uint64_t seq, Time expires, std::vector<std::uint8_t> value) {
  Record r;
  r.key = key;
  r.subkey = std::move(subkey);
  r.owner = owner.public_key();
  r.seq = seq;
  r.expires = expires;
  r.value = std::move(value);
  r.sig = owner.sign(signing_bytes(r));
  return r;
}

bool SignatureCache::verify(const PublicKey& owner, std::span<const std::uint8_t> msg,
                            const Signature& sig) {
  transport::Blake2b256 h;
  h.update(owner);
  h.update(sig);
  h.update(msg);
  const auto d = h.final();
  if (seen_.contains(d)) {
    ++hits_;
    return true;
  }
  if (!transport::verify_signature(owner, msg, sig)) return false;
  if (capacity_ == 0) return true;
  if (seen_.size() >= capacity_) {
    seen_.erase(order_.front());
    order_.pop_front();
  }
  seen_.insert(d);
  order_.push_back(d);
  return true;
}

RecordStatus check_record(const Record& r, Time now, const RecordLimits& limits,
                          SignatureCache* cache) {
  if (r.subkey.size() > limits.max_subkey || r.value.size() > limits.max_value)
    return RecordStatus::too_large;
  if (r.expires <= now) return RecordStatus::expired;
  if (r.expires > now + limits.max_ttl + limits.clock_skew) return RecordStatus::too_far_future;
  const auto msg = signing_bytes(r);
  if (!(cache ? cache->verify(r.owner, msg, r.sig)
              : transport::verify_signature(r.owner, msg, r.sig)))
    return RecordStatus::bad_signature;
  return RecordStatus::ok;
}

}  // namespace grove::dht
