#include "dht/messages.hpp"

#include <gtest/gtest.h>

namespace grove::dht {
namespace {

Message sample_value(std::size_t contacts, std::size_t records) {
  auto id = transport::Identity::from_seed({1});
  Message m;
  m.type = MsgType::value;
  m.txid = 42;
  m.sender_address = "10.0.0.1:4000";
  for (std::size_t i = 0; i < contacts; ++i) {
    Contact c;
    c.id[0] = static_cast<std::uint8_t>(i);
    c.address = "10.0.0." + std::to_string(i) + ":4000";
    m.contacts.push_back(c);
  }
  for (std::size_t i = 0; i < records; ++i)
    m.records.push_back(make_record(id, key_of("k"), "sub" + std::to_string(i), i + 1,
                                    Time(1'800'000'000'000), {1, 2, 3}));
  m.cursor = Cursor{id.public_key(), "sub"};
  return m;
}

TEST(Messages, RoundTripEveryType) {
  WireLimits lim;
  for (int t = 1; t <= 9; ++t) {
    Message m = sample_value(t == 4 || t == 6 ? 20 : 0, t == 6 || t == 7 ? 3 : 0);
    m.type = static_cast<MsgType>(t);
    if (m.type == MsgType::stored) m.codes = {StoreCode::stored, StoreCode::stale};
    if (m.type == MsgType::pong) m.observed = "1.2.3.4:5";
    if (m.type == MsgType::error) m.error = ErrorCode::rate_limited, m.text = "slow down";
    if (m.type != MsgType::find_value && m.type != MsgType::value) m.cursor.reset();
    auto bytes = encode(m);
    auto d = decode(bytes, lim);
    ASSERT_TRUE(d) << to_string(m.type) << ": " << d.error().message();
    EXPECT_EQ(d->type, m.type);
    EXPECT_EQ(d->txid, 42u);
    EXPECT_EQ(d->sender_address, m.sender_address);
    if (m.type == MsgType::value || m.type == MsgType::nodes) {
      EXPECT_EQ(d->contacts, m.contacts);
    }
    if (m.type == MsgType::value || m.type == MsgType::store) {
      ASSERT_EQ(d->records.size(), m.records.size());
      for (std::size_t i = 0; i < m.records.size(); ++i) {
        EXPECT_EQ(d->records[i].subkey, m.records[i].subkey);
        EXPECT_EQ(d->records[i].sig, m.records[i].sig);
        EXPECT_EQ(d->records[i].expires, m.records[i].expires);
      }
    }
    if (m.type == MsgType::value) {
      EXPECT_EQ(d->cursor, m.cursor);
    }
    if (m.type == MsgType::stored) {
      EXPECT_EQ(d->codes, m.codes);
    }
    if (m.type == MsgType::error) {
      EXPECT_EQ(d->text, "slow down");
    }
  }
}

TEST(Messages, EmptyListsDecode) {
  Message m = sample_value(0, 0);
  m.cursor.reset();
  auto d = decode(encode(m), WireLimits{});
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->records.empty());
  EXPECT_TRUE(d->contacts.empty());
  EXPECT_FALSE(d->cursor);
}

TEST(Messages, RejectsOverLimitsAndGarbage) {
  WireLimits lim;
  // Too many contacts.
  auto many = encode(sample_value(lim.max_contacts + 1, 0));
  EXPECT_FALSE(decode(many, lim));
  // Too many records in a store.
  Message st = sample_value(0, lim.max_store_records + 1);
  st.type = MsgType::store;
  EXPECT_FALSE(decode(encode(st), lim));
  // Oversized message.
  WireLimits small = lim;
  small.max_message = 100;
  EXPECT_FALSE(decode(encode(sample_value(20, 0)), small));
  // Truncations and garbage never decode into something wrong or crash.
  auto good = encode(sample_value(5, 2));
  for (std::size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(decode(std::span(good).first(n), lim)) << n;
  std::vector<std::uint8_t> junk(300, 0xc1);
  EXPECT_FALSE(decode(junk, lim));
  // Unknown version.
  auto v = encode(sample_value(0, 0));
  v[1] = 2;  // [array, version, ...]
  EXPECT_FALSE(decode(v, lim));
}

}  // namespace
}  // namespace grove::dht
