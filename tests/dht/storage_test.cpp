#include "dht/storage.hpp"

#include <gtest/gtest.h>

namespace grove::dht {
namespace {

const Time kNow{1'800'000'000'000};

TEST(Storage, NewestSequenceWinsAndReplaysAreRefused) {
  Storage s(StorageLimits{});
  auto id = transport::Identity::from_seed({1});
  const Key k = key_of("k");
  auto r1 = make_record(id, k, "", 1, kNow + Time(60'000), {1});
  auto r2 = make_record(id, k, "", 2, kNow + Time(60'000), {2});
  EXPECT_EQ(s.put(r1, kNow), StoreCode::stored);
  EXPECT_EQ(s.put(r1, kNow), StoreCode::unchanged);
  EXPECT_EQ(s.put(r2, kNow), StoreCode::updated);
  EXPECT_EQ(s.put(r1, kNow), StoreCode::stale);  // replay of an older record
  auto same_seq = make_record(id, k, "", 2, kNow + Time(60'000), {9});
  EXPECT_EQ(s.put(same_seq, kNow), StoreCode::stale);  // equal sequence, different content
  auto all = s.all(k, kNow);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].value, std::vector<std::uint8_t>{2});
  // Expired records disappear.
  s.expire(kNow + Time(60'000));
  EXPECT_TRUE(s.all(k, kNow + Time(60'000)).empty());
  EXPECT_EQ(s.stats().bytes, 0u);
}

TEST(Storage, DictionarySlotsAndPaging) {
  Storage s(StorageLimits{});
  const Key k = key_of("run");
  for (int i = 0; i < 30; ++i) {
    auto id = transport::Identity::from_seed({static_cast<std::uint8_t>(i + 1)});
    EXPECT_EQ(s.put(make_record(id, k, "member", 1, kNow + Time(60'000), {1}), kNow),
              StoreCode::stored);
  }
  std::optional<Cursor> cur, next;
  std::size_t seen = 0, pages = 0;
  do {
    auto page = s.get(k, kNow, cur, 7, 1 << 20, next);
    seen += page.size();
    ++pages;
    cur = next;
  } while (cur);
  EXPECT_EQ(seen, 30u);
  EXPECT_EQ(pages, 5u);
}

TEST(Storage, FlooderEvictsOnlyItself) {
  StorageLimits lim;
  lim.max_bytes = 64 << 10;
  lim.max_bytes_per_source = 48 << 10;
  lim.max_records_per_key = 50;
  Storage s(lim);
  const Key run = key_of("run");
  // Honest members: one small record each.
  for (int i = 0; i < 10; ++i) {
    auto id = transport::Identity::from_seed({static_cast<std::uint8_t>(100 + i)});
    ASSERT_EQ(s.put(make_record(id, run, "member", 1, kNow + Time(60'000),
                                std::vector<std::uint8_t>(200)),
                    kNow),
              StoreCode::stored);
  }
  // A flooder fills its per-source quota with large records, under the run key and others.
  auto flood = transport::Identity::from_seed({1});
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    const Key key = i % 2 ? run : key_of("junk" + std::to_string(i));
    auto c = s.put(make_record(flood, key, "x" + std::to_string(i), 1, kNow + Time(60'000),
                               std::vector<std::uint8_t>(2000)),
                   kNow);
    refused += c == StoreCode::over_quota;
  }
  EXPECT_GT(refused, 0);
  EXPECT_LE(s.source_bytes(flood.public_key()), lim.max_bytes_per_source);
  // Every honest record is still there.
  std::size_t honest = 0;
  for (auto& r : s.all(run, kNow)) honest += r.subkey == "member";
  EXPECT_EQ(honest, 10u);
  // A second flooder: total is full; honest newcomers still get in by evicting flooders.
  auto flood2 = transport::Identity::from_seed({2});
  for (int i = 0; i < 200; ++i)
    s.put(make_record(flood2, key_of("j2" + std::to_string(i)), "", 1, kNow + Time(60'000),
                      std::vector<std::uint8_t>(2000)),
          kNow);
  EXPECT_LE(s.stats().bytes, lim.max_bytes);
  auto newcomer = transport::Identity::from_seed({200});
  EXPECT_EQ(s.put(make_record(newcomer, run, "member", 1, kNow + Time(60'000),
                              std::vector<std::uint8_t>(200)),
                  kNow),
            StoreCode::stored);
  EXPECT_GT(s.stats().evicted, 0u);
  honest = 0;
  for (auto& r : s.all(run, kNow)) honest += r.subkey == "member";
  EXPECT_EQ(honest, 11u);
}

}  // namespace
}  // namespace grove::dht
