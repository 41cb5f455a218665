// OpDeadlines: an averaging operation's deadline scales with its bytes and the measured rate.
#include "gossip/op_deadline.hpp"

#include <gtest/gtest.h>

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;

TEST(OpDeadlines, ScalesWithTheBytesAtTheAssumedRateUntilOneIsMeasured) {
  OpDeadlines d;  // floor 60 s, ×3, 256 KiB/s assumed
  EXPECT_FALSE(d.measured());
  EXPECT_EQ(d.deadline_for(0), Time(60'000));
  // An 8B-parameter pair exchange in fp16 (16 GB): the hours it needs at 2 Mbit/s, not 300 s.
  const std::uint64_t bytes = exchange_wire_bytes(WireCodec::fp16, 8'000'000'000ull, 1);
  EXPECT_EQ(bytes, 16'000'000'000ull);
  const auto t = d.deadline_for(bytes);
  EXPECT_GT(t, Time(static_cast<std::int64_t>(3 * 16e9 / (256 * 1024) * 1000)));
  EXPECT_EQ(d.deadline_for(2 * bytes) - Time(60'000), 2 * (t - Time(60'000)));
  EXPECT_NE(d.describe(bytes).find("assumed"), std::string::npos);
}

TEST(OpDeadlines, FollowsTheMeasuredRateButNeverBelowTheLeastRate) {
  OpDeadlines d;
  d.observe(1'000'000'000, Time(100'000));  // 10 MB/s
  EXPECT_TRUE(d.measured());
  EXPECT_DOUBLE_EQ(d.rate(), 1e7);
  EXPECT_EQ(d.deadline_for(1'000'000'000), Time(60'000 + 300'000));
  EXPECT_NE(d.describe(1'000'000'000).find("measured"), std::string::npos);
  d.observe(1'000'000'000, Time(50'000));  // 20 MB/s: the mean moves half way
  EXPECT_DOUBLE_EQ(d.rate(), 1.5e7);
  d.observe(0, Time(1000));  // nothing sent: ignored
  d.observe(10, Time(0));
  EXPECT_DOUBLE_EQ(d.rate(), 1.5e7);
  OpDeadlines slow;
  slow.observe(1000, Time(1000));  // 1 kB/s: a partner's slow line, not ours
  EXPECT_DOUBLE_EQ(slow.rate(), 256.0 * 1024);
}

TEST(OpDeadlines, SilenceScalesWithTheBytesBetweenTwoMessagesAboveItsFloor) {
  OpDeadlines d;
  const std::uint64_t chunk = 512 * 1024;                         // fp16 of 2^18 values
  EXPECT_EQ(d.silence_for(3 * chunk, Time(2'000)), Time(2'000));  // nothing measured: the floor
  d.observe(1'000'000, Time(4'000));  // 250 kB/s measured: below the least rate, 256 KiB/s
  // 3 × 2 s, under the 10 s floor; three partners' chunks between two of one's: 18 s.
  EXPECT_EQ(d.silence_for(chunk, Time(10'000)), Time(10'000));
  EXPECT_EQ(d.silence_for(3 * chunk, Time(10'000)), Time(18'000));
  OpDeadlines fast;
  fast.observe(1'000'000'000, Time(100'000));  // 10 MB/s: the floor again
  EXPECT_EQ(fast.silence_for(3 * chunk, Time(10'000)), Time(10'000));
  EXPECT_EQ(fast.silence_for(100'000'000, Time(10'000)), Time(30'000));
}

// A long operation gives a peer a fifth of its expected time: a 1 GB exchange at 10 MB/s (100 s)
// 20 s, a 100 MB one still the floor; nothing measured, the floor whatever the size.
TEST(OpDeadlines, SilenceGrowsWithTheOperationsLength) {
  const std::uint64_t chunk = 512 * 1024;
  OpDeadlines fast;
  fast.observe(1'000'000'000, Time(100'000));  // 10 MB/s
  EXPECT_EQ(fast.silence_for(chunk, Time(10'000), 1'000'000'000), Time(20'000));
  EXPECT_EQ(fast.silence_for(chunk, Time(10'000), 100'000'000), Time(10'000));
  EXPECT_EQ(fast.silence_for(chunk, Time(10'000), 8'000'000'000), Time(160'000));
  OpDeadlines none;
  EXPECT_EQ(none.silence_for(chunk, Time(10'000), 8'000'000'000), Time(10'000));
}

TEST(OpDeadlines, WireBytesOfTheRing) {
  EXPECT_EQ(allreduce_wire_bytes(WireCodec::fp16, 1000, 1), 0u);
  EXPECT_EQ(allreduce_wire_bytes(WireCodec::fp16, 1000, 2), 2000u);  // 2 · (1/2) · 2000
  EXPECT_EQ(allreduce_wire_bytes(WireCodec::fp32, 1000, 4), 6000u);  // 2 · (3/4) · 4000
  EXPECT_EQ(exchange_wire_bytes(WireCodec::fp32, 1000, 2), 8000u);
}

}  // namespace
}  // namespace grove::gossip
