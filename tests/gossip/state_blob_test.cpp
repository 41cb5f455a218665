// State blobs in memory: a state written piece by piece reads back whole, bounds hold, a damaged
// blob does not load.
#include "gossip/state_blob.hpp"

#include <gtest/gtest.h>

namespace grove::gossip {
namespace {

optim::OuterState sample(std::size_t n) {
  optim::OuterState s;
  s.round = 12;
  std::vector<float> phi, m;
  for (std::size_t i = 0; i < n; ++i) {
    phi.push_back(static_cast<float>(i) * 0.5f);
    m.push_back(-static_cast<float>(i) * 0.25f);
  }
  s.phi = std::move(phi);
  s.momentum = std::move(m);
  return s;
}

TEST(StateBlob, AStateSavedPieceByPieceLoadsBack) {
  auto store = memory_blob_store();
  const auto s = sample(400'000);  // more than one piece of the writer
  auto blob = save_state(*store, s);
  ASSERT_TRUE(blob) << blob.text();
  EXPECT_EQ((*blob)->size(), optim::serialized_size(s));
  std::vector<std::uint8_t> all((*blob)->size());
  ASSERT_TRUE((*blob)->read(0, all));
  EXPECT_EQ(all, optim::serialize(s));
  auto back = load_state(**blob);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, s);
  EXPECT_FALSE(load_state(**blob, 1000)) << "over the caller's bound";
}

TEST(StateBlob, WritesAndReadsStayWithinTheBlob) {
  auto w = memory_blob_store()->create(100);
  ASSERT_TRUE(w);
  std::vector<std::uint8_t> ten(10, 7);
  EXPECT_TRUE((*w)->write(90, ten));
  EXPECT_EQ((*w)->write(91, ten).error(), make_error_code(transport::errc::rejected));
  EXPECT_EQ((*w)->write(~std::uint64_t{0}, ten).error(),
            make_error_code(transport::errc::rejected));
  std::vector<std::uint8_t> back(10);
  EXPECT_TRUE((*w)->read(90, back));
  EXPECT_EQ(back, ten);
  auto blob = (*w)->seal();
  ASSERT_TRUE(blob);
  EXPECT_EQ(blob->size(), 100u);
  EXPECT_TRUE(blob->read(90, back));
  EXPECT_EQ(back, ten);
  EXPECT_FALSE(blob->read(95, back));
}

TEST(StateBlob, ADamagedBlobDoesNotLoad) {
  auto bytes = optim::serialize(sample(1000));
  bytes[200] ^= 4;
  EXPECT_FALSE(load_state(*memory_blob(bytes)));
  EXPECT_FALSE(load_state(*memory_blob({})));
}

}  // namespace
}  // namespace grove::gossip
