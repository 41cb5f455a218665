// CatchUp (gossip/catch_up.hpp) for a member that holds a state: the newest offer's deltas from
// its own φ are fetched instead of the state, from every donor listing them; a chain that does
// not start at its φ, or a delta no donor serves any more, means the whole state.
#include "gossip/catch_up.hpp"

#include <gtest/gtest.h>

#include <map>

#include "gossip/state_delta.hpp"
#include "tests/gossip/fake_store.hpp"

namespace grove::gossip {
namespace {

using test::Board;
using test::FakeStore;

Digest digest(std::uint8_t v) {
  Digest d{};
  d.fill(v);
  return d;
}

// A donor: its store (for its offer) and its server.
struct Donor {
  explicit Donor(std::shared_ptr<Board> b) : store(std::move(b)) {}
  FakeStore store;
  StateServer server;
  void offer(const StateOffer& o) {
    store.write(state_key("run-c"), "state", 1, Time(600'000), encode_offer(o), Time(0));
  }
};

std::shared_ptr<const StateSnapshot> snapshot(std::uint64_t round, std::size_t bytes,
                                              std::uint8_t fill) {
  return std::make_shared<StateSnapshot>("run-c", round, std::vector<std::uint8_t>(bytes, fill),
                                         256);
}

// Runs a catch-up to its end, the donors answering its requests.
void drive(CatchUp& c, FakeStore& self, std::map<NodeId, Donor*>& donors) {
  Time now{0};
  for (int guard = 0; guard < 2000 && c.status() == OpStatus::running; ++guard) {
    now += Time(100);
    self.deliver(now);
    for (auto& r : c.take_requests()) {
      auto body = donors.at(r.to)->server.answer(r.body);
      if (body)
        c.on_response(r.id, *body, now);
      else
        c.on_failure(r.id, now, "not held");
    }
    c.on_timer(now);
  }
}

struct Fixture {
  std::shared_ptr<Board> board = std::make_shared<Board>();
  Donor a{board}, b{board};
  FakeStore self{board};
  std::map<NodeId, Donor*> donors{{a.store.id(), &a}, {b.store.id(), &b}};
  std::shared_ptr<const StateSnapshot> state = snapshot(5, 4000, 9);
  std::shared_ptr<const StateSnapshot> d4 = snapshot(4, 1000, 4), d5 = snapshot(5, 1000, 5);
  // Round 4 leads from φ hash 3 to 4, round 5 from 4 to 5.
  std::vector<DeltaOffer> deltas{{4, d4->size(), d4->root(), digest(3), digest(4)},
                                 {5, d5->size(), d5->root(), digest(4), digest(5)}};

  void serve(Donor& d, bool with_deltas) {
    d.server.add(state);
    if (with_deltas) {
      d.server.add_delta(d4);
      d.server.add_delta(d5);
    }
    d.offer({{}, "127.0.0.1:1", "run-c", 5, state->size(), state->root(), deltas});
  }
  CatchUpOptions held(std::uint64_t round, std::uint8_t hash) {
    CatchUpOptions o;
    o.have = CatchUpOptions::Held{round, digest(hash)};
    return o;
  }
};

std::vector<std::uint8_t> read_all(const StateBlob& b) {
  std::vector<std::uint8_t> v(b.size());
  EXPECT_TRUE(b.read(0, v));
  return v;
}

// A catch-up from `have` that ends with the whole state of round 5.
void expect_whole_state(Fixture& f, CatchUpOptions have) {
  CatchUp c(f.self, "run-c", 4, {}, std::move(have), Time(0));
  drive(c, f.self, f.donors);
  ASSERT_EQ(c.status(), OpStatus::done) << c.failure();
  EXPECT_TRUE(c.take_deltas().empty());
  auto blob = c.take_blob();
  ASSERT_TRUE(blob);
  EXPECT_EQ(read_all(*blob), std::vector<std::uint8_t>(4000, 9));
  EXPECT_EQ(c.bytes(), 4000u);
}

TEST(CatchUp, AMemberAFewRoundsBehindFetchesTheDeltasFromEveryDonor) {
  Fixture f;
  f.serve(f.a, true);
  f.serve(f.b, true);
  CatchUp c(f.self, "run-c", 4, {}, f.held(3, 3), Time(0));
  drive(c, f.self, f.donors);
  ASSERT_EQ(c.status(), OpStatus::done) << c.failure();
  EXPECT_EQ(c.take_blob(), nullptr);
  auto d = c.take_deltas();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(read_all(*d[0]), std::vector<std::uint8_t>(1000, 4));
  EXPECT_EQ(read_all(*d[1]), std::vector<std::uint8_t>(1000, 5));
  EXPECT_EQ(c.bytes(), 2000u);
  EXPECT_EQ(c.offer().round, 5u);
  // One round behind: only the last delta.
  CatchUp one(f.self, "run-c", 5, {}, f.held(4, 4), Time(0));
  drive(one, f.self, f.donors);
  ASSERT_EQ(one.status(), OpStatus::done) << one.failure();
  EXPECT_EQ(one.take_deltas().size(), 1u);
}

TEST(CatchUp, DeltasFromOtherSlowWeightsOrTooFarBackMeanTheWholeState) {
  Fixture f;
  f.serve(f.a, true);
  for (const auto& [round, hash] : {std::pair<std::uint64_t, std::uint8_t>{3, 7}, {2, 2}}) {
    expect_whole_state(f, f.held(round, hash));
  }
}

TEST(CatchUp, ADeltaNoDonorServesAnyMoreMeansTheWholeState) {
  Fixture f;
  f.serve(f.a, false);  // listed in the offer, but no longer held
  expect_whole_state(f, f.held(3, 3));
}

TEST(CatchUp, TheServerHoldsTheLatestDeltasApartFromTheStates) {
  StateServer s(1, 0, 2);
  s.add(snapshot(1, 500, 1));
  auto d1 = snapshot(1, 100, 1), d2 = snapshot(2, 100, 2), d3 = snapshot(3, 100, 3);
  EXPECT_TRUE(s.add_delta(d1).empty());
  EXPECT_TRUE(s.add_delta(d2).empty());
  auto gone = s.add_delta(d3);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], d1);
  EXPECT_EQ(s.latest()->round(), 1u);  // the state, not a delta
  EXPECT_FALSE(s.answer(encode_state_request({d1->root(), 0})));
  EXPECT_TRUE(s.answer(encode_state_request({d3->root(), std::nullopt})));
  // An offer with its deltas round-trips.
  StateOffer o{
      {},
      "a:1",
      "run-c",
      3,
      500,
      d3->root(),
      {{2, 100, d2->root(), digest(1), digest(2)}, {3, 100, d3->root(), digest(2), digest(3)}}};
  auto back = decode_offer(encode_offer(o));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, o);
  o.deltas.resize(kMaxOfferDeltas + 1);
  EXPECT_FALSE(decode_offer(encode_offer(o)));  // bounded
}

}  // namespace
}  // namespace grove::gossip
