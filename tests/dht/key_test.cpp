#include "dht/key.hpp"

#include <gtest/gtest.h>

namespace grove::dht {
namespace {

TEST(Key, XorMetric) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const Key a = random_key(rng), b = random_key(rng), t = random_key(rng);
    EXPECT_EQ(distance(a, b), distance(b, a));
    EXPECT_EQ(common_prefix_bits(a, a), kKeyBits);
    EXPECT_FALSE(closer(t, a, a));
    EXPECT_NE(closer(t, a, b), closer(t, b, a));  // distinct keys: exactly one is closer
    EXPECT_EQ(closer(t, a, b), distance(t, a) < distance(t, b));
  }
  EXPECT_NE(key_of("a"), key_of("b"));
  EXPECT_EQ(key_of("run/x"), key_of("run/x"));
}

TEST(Key, RandomKeyInBucketHasExactPrefix) {
  std::mt19937_64 rng(2);
  const Key self = random_key(rng);
  for (int p = 0; p < kKeyBits; ++p)
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(common_prefix_bits(self, random_key_in_bucket(self, p, rng)), p);
}

}  // namespace
}  // namespace grove::dht
