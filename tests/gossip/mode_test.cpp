// The run-time switch between NoLoCo and DiLoCo: signed mode records in the DHT and the schedule
// every node derives from them.
#include "gossip/mode.hpp"

#include <gtest/gtest.h>

#include "transport/identity.hpp"

namespace grove::gossip {
namespace {

TEST(OuterModeSwitch, ScheduleSwitchesToDiLoCoAndBack) {
  auto a = transport::Identity::generate(), b = transport::Identity::generate();
  // a asks for DiLoCo from round 10 and, later, b to go back to NoLoCo from round 20 and a
  // again for DiLoCo from 30: a's two requests live in two slots, so both count.
  std::vector<dht::Record> recs = {
      dht::make_record(a, mode_key("run-m"), mode_subkey(10), 1, dht::Time(1'000'000),
                       encode_mode({{}, "run-m", OuterMode::diloco, 10})),
      dht::make_record(b, mode_key("run-m"), mode_subkey(20), 1, dht::Time(1'000'000),
                       encode_mode({{}, "run-m", OuterMode::noloco, 20})),
      dht::make_record(a, mode_key("run-m"), mode_subkey(30), 1, dht::Time(1'000'000),
                       encode_mode({{}, "run-m", OuterMode::diloco, 30})),
      // Ignored: another run, another subkey, a subkey that does not name the value's round, a
      // malformed value.
      dht::make_record(b, mode_key("run-m"), "mode2", 1, dht::Time(1'000'000),
                       encode_mode({{}, "run-m", OuterMode::diloco, 0})),
      dht::make_record(b, mode_key("run-m"), mode_subkey(1), 1, dht::Time(1'000'000),
                       encode_mode({{}, "run-m", OuterMode::diloco, 0})),
      dht::make_record(a, mode_key("run-m"), mode_subkey(40), 2, dht::Time(1'000'000), {1, 2, 3}),
  };
  recs.push_back(dht::make_record(b, mode_key("run-x"), mode_subkey(0), 1, dht::Time(1'000'000),
                                  encode_mode({{}, "run-x", OuterMode::diloco, 0})));
  const auto reqs = mode_requests("run-m", recs);
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].requester, a.id());
  for (std::uint64_t r : {0u, 5u, 9u})
    EXPECT_EQ(mode_for_round(reqs, r, OuterMode::noloco), OuterMode::noloco);
  for (std::uint64_t r : {10u, 15u, 19u})
    EXPECT_EQ(mode_for_round(reqs, r, OuterMode::noloco), OuterMode::diloco);
  for (std::uint64_t r : {20u, 29u})
    EXPECT_EQ(mode_for_round(reqs, r, OuterMode::noloco), OuterMode::noloco);
  for (std::uint64_t r : {30u, 100u})
    EXPECT_EQ(mode_for_round(reqs, r, OuterMode::noloco), OuterMode::diloco);
  // A run configured for DiLoCo at bootstrap stays so until a request says otherwise.
  EXPECT_EQ(mode_for_round({}, 3, OuterMode::diloco), OuterMode::diloco);
}

TEST(OuterModeSwitch, TiesGoToTheGreaterRequesterAndOrderDoesNotMatter) {
  NodeId lo{}, hi{};
  hi[0] = 9;
  std::vector<ModeRequest> r = {{lo, "r", OuterMode::diloco, 5}, {hi, "r", OuterMode::noloco, 5}};
  EXPECT_EQ(mode_for_round(r, 5, OuterMode::diloco), OuterMode::noloco);
  std::swap(r[0], r[1]);
  EXPECT_EQ(mode_for_round(r, 5, OuterMode::diloco), OuterMode::noloco);
}

TEST(OuterModeSwitch, ValueCodecIsBounded) {
  const ModeRequest m{{}, "run-m", OuterMode::diloco, 77};
  auto back = decode_mode(encode_mode(m));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, m);
  const auto bytes = encode_mode(m);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_mode(std::span(bytes).first(n)));
  EXPECT_EQ(parse_mode("diloco"), OuterMode::diloco);
  EXPECT_FALSE(parse_mode("sgd"));
}

}  // namespace
}  // namespace grove::gossip
