#include "dht/record.hpp"

#include <gtest/gtest.h>

namespace grove::dht {
namespace {

const Time kNow{1'800'000'000'000};

TEST(Record, SignedRecordChecks) {
  auto id = transport::Identity::from_seed({7});
  RecordLimits lim;
  Record r = make_record(id, key_of("k"), "sub", 3, kNow + Time(60'000), {1, 2, 3});
  EXPECT_EQ(check_record(r, kNow, lim), RecordStatus::ok);
  EXPECT_EQ(r.owner_id(), id.id());
  // Any field changed after signing breaks the signature.
  for (int f = 0; f < 5; ++f) {
    Record x = r;
    switch (f) {
      case 0:
        x.key[0] ^= 1;
        break;
      case 1:
        x.subkey = "other";
        break;
      case 2:
        x.seq = 4;
        break;
      case 3:
        x.expires += Time(1);
        break;
      case 4:
        x.value[0] ^= 1;
        break;
    }
    EXPECT_EQ(check_record(x, kNow, lim), RecordStatus::bad_signature) << f;
  }
  // Signed by someone else's key but claiming this owner.
  Record forged =
      make_record(transport::Identity::from_seed({8}), r.key, r.subkey, 9, r.expires, r.value);
  forged.owner = r.owner;
  EXPECT_EQ(check_record(forged, kNow, lim), RecordStatus::bad_signature);
  EXPECT_EQ(check_record(r, r.expires, lim), RecordStatus::expired);
  Record far = make_record(id, r.key, "", 1, kNow + lim.max_ttl + lim.clock_skew + Time(1), {});
  EXPECT_EQ(check_record(far, kNow, lim), RecordStatus::too_far_future);
  Record big = make_record(id, r.key, "", 1, kNow + Time(1000),
                           std::vector<std::uint8_t>(lim.max_value + 1));
  EXPECT_EQ(check_record(big, kNow, lim), RecordStatus::too_large);
  Record longsub =
      make_record(id, r.key, std::string(lim.max_subkey + 1, 'x'), 1, kNow + Time(1000), {});
  EXPECT_EQ(check_record(longsub, kNow, lim), RecordStatus::too_large);
}

TEST(Record, SignatureCacheRemembersOnlyWhatVerified) {
  auto id = transport::Identity::from_seed({7});
  RecordLimits lim;
  SignatureCache cache(2);
  Record r = make_record(id, key_of("k"), "sub", 3, kNow + Time(60'000), {1, 2, 3});
  EXPECT_EQ(check_record(r, kNow, lim, &cache), RecordStatus::ok);
  EXPECT_EQ(check_record(r, kNow, lim, &cache), RecordStatus::ok);
  EXPECT_EQ(cache.hits(), 1u);
  // The same signature over other bytes is checked (and fails), and failures are not kept.
  Record x = r;
  x.value[0] ^= 1;
  EXPECT_EQ(check_record(x, kNow, lim, &cache), RecordStatus::bad_signature);
  EXPECT_EQ(check_record(x, kNow, lim, &cache), RecordStatus::bad_signature);
  EXPECT_EQ(cache.hits(), 1u);
  // Bounded: two more records push the first one out; it verifies again, still ok.
  for (std::uint64_t seq : {4, 5})
    EXPECT_EQ(
        check_record(make_record(id, key_of("k"), "sub", seq, r.expires, {9}), kNow, lim, &cache),
        RecordStatus::ok);
  EXPECT_EQ(check_record(r, kNow, lim, &cache), RecordStatus::ok);
  EXPECT_EQ(cache.hits(), 1u);
}

}  // namespace
}  // namespace grove::dht
