// MemberStatus: the wire form round-trips, and what a peer sends is shown safely (printable ASCII
// only, one table row per member whatever the strings' lengths).
#include "node/status.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace grove::node {
namespace {

MemberStatus sample() {
  MemberStatus m;
  m.node = "0123456789abcdef";
  m.address = "10.0.0.7:7400";
  m.status = "training";
  m.run = "gpt-0123456789ab";
  m.step = 1200;
  m.round = 24;
  m.loss = 1.25;
  m.eval_loss = 1.5;
  m.loss_floor = 0.79;
  m.tokens_per_s = 2048;
  m.last_sync_ms = 840;
  m.last_partner = "fedcba98";
  m.bytes_sent = 6'520'000;
  m.bytes_received = 6'510'000;
  m.round_s = 30.5;
  m.uptime_s = 600;
  m.algorithm = "sparseloco (top-64/4096 fp32 + error feedback)";
  return m;
}

TEST(Status, RoundTripsAndRendersOneRowPerMember) {
  const std::vector<MemberStatus> v = {sample(), sample()};
  const auto back = decode_status(encode_status(v));
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].node, "0123456789abcdef");
  EXPECT_EQ((*back)[0].bytes_sent, 6'520'000u);
  EXPECT_DOUBLE_EQ((*back)[0].round_s, 30.5);
  const auto table = status_table(*back);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 3);
  EXPECT_NE(table.find("fedcba98"), std::string::npos);
  EXPECT_NE(table.find(" sparseloco "), std::string::npos);  // the outer column
  const auto json = status_json(*back);
  EXPECT_NE(json.find(R"x("algorithm":"sparseloco (top-64/4096 fp32 + error feedback)")x"),
            std::string::npos);
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 2);
}

TEST(Status, AJoinersStateSyncShowsItsProgressRateAndTimeLeft) {
  auto m = sample();
  m.status = "joining";
  m.sync_bytes = 2'000'000'000;
  m.sync_total = 8'000'000'000;
  m.sync_rate = 12.5e6;
  const auto back = decode_status(encode_status({m, sample()}));
  ASSERT_TRUE(back);
  EXPECT_EQ((*back)[0].sync_total, 8'000'000'000u);
  EXPECT_DOUBLE_EQ((*back)[0].sync_rate, 12.5e6);
  EXPECT_EQ(sync_progress_text((*back)[0]), "25% of 8.00 GB at 12.5 MB/s, 8 min left");
  EXPECT_EQ(sync_progress_text((*back)[1]), "-");
  const auto table = status_table(*back);
  EXPECT_NE(table.find("state sync: 25% of 8.00 GB"), std::string::npos);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4);  // header, 2 rows, the sync line
  const auto json = status_json(*back);
  EXPECT_NE(json.find("\"sync_total\":8000000000"), std::string::npos);
  m.sync_rate = NAN;  // before the first chunk: no rate, no time left
  EXPECT_EQ(sync_progress_text(m), "25% of 8.00 GB");
}

// Numbers a peer may send that are finite but absurd (1e300 MB/s, 2^64 bytes, a step of 2^64−1)
// keep every member on one row: the fuzzer found a row cut short of its newline, and a sync rate
// that overran the progress text's buffer.
TEST(Status, HugeNumbersKeepOneRowPerMember) {
  auto m = sample();
  m.step = m.round = ~std::uint64_t{0};
  m.loss = m.eval_loss = m.tokens_per_s = m.last_sync_ms = m.round_s = 1e300;
  m.bytes_sent = m.bytes_received = ~std::uint64_t{0};
  m.address = std::string(200, 'a');
  m.sync_bytes = 1;
  m.sync_total = ~std::uint64_t{0};
  m.sync_rate = 1e300;
  auto slow = m;
  slow.sync_rate = 1e-300;  // centuries left
  const auto table = status_table({m, slow, sample()});
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1 + 3 + 2) << table;
  EXPECT_NE(table.find("1e+300"), std::string::npos) << table;
  EXPECT_LT(table.size(), 2000u);
}

TEST(Status, HostileStringsCannotReachTheTerminal) {
  auto m = sample();
  m.status = "\x1b[2J\x1b[31mpwned\r";
  m.address = std::string(200, 'x') + "\n";
  m.last_partner = "\x07\x07\x07\x07\x07\x07\x07\x07\x07";
  m.node = "caf\xc3\xa9";
  const std::vector<MemberStatus> v = {m, sample()};
  for (const auto& text : {status_table(v), status_json(v)}) {
    for (char c : text) {
      const auto u = static_cast<unsigned char>(c);
      EXPECT_TRUE(c == '\n' || (u >= 0x20 && u < 0x7f)) << static_cast<int>(u);
    }
  }
  const auto table = status_table(v);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 3);  // header + two rows, none merged
  EXPECT_NE(table.find("?[2J?[31mpw "), std::string::npos);
  EXPECT_EQ(json_string("a\"b\\c\x01"), "\"a\\\"b\\\\c?\"");
}

}  // namespace
}  // namespace grove::node
