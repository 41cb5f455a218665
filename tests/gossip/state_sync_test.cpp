// State sync: verified chunked download of a donor's snapshot, donor failover and resume.
#include "gossip/state_sync.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <functional>
#include <random>

namespace grove::gossip {
namespace {

NodeId donor_id(int i) {
  NodeId id{};
  id[0] = static_cast<std::uint8_t>(i + 1);
  return id;
}

std::vector<std::uint8_t> random_blob(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// A finished download's bytes (read back from its blob).
std::vector<std::uint8_t> bytes_of(StateDownload& d) {
  auto b = d.take_blob();
  if (!b) return {};
  std::vector<std::uint8_t> v(b->size());
  if (!b->read(0, v)) return {};
  return v;
}

StateOffer offer_of(const StateSnapshot& s, int donor) {
  return {donor_id(donor),
          "127.0.0.1:" + std::to_string(4000 + donor),
          "run-s",
          s.round(),
          s.size(),
          s.root(),
          {}};
}

// Answers a download's requests. `hook(donor, request index, body)` may change an answer
// (return false to fail the request instead).
struct Donors {
  std::map<NodeId, StateServer> servers;
  std::function<bool(int, std::optional<std::uint32_t>, std::vector<std::uint8_t>&)> hook;
  std::map<int, std::size_t> answered;

  void run(StateDownload& d, dht::Time now = dht::Time(0)) {
    for (int guard = 0; guard < 100000 && d.status() == OpStatus::running; ++guard) {
      auto reqs = d.take_requests();
      if (reqs.empty()) break;
      for (auto& r : reqs) {
        const int donor = r.to[0] - 1;
        auto req = decode_state_request(r.body);
        ASSERT_TRUE(req);
        auto body = servers.at(r.to).answer(r.body);
        if (!body) {
          d.on_failure(r.id, now);
          continue;
        }
        if (hook && !hook(donor, req->index, *body)) {
          d.on_failure(r.id, now);
          continue;
        }
        ++answered[donor];
        d.on_response(r.id, *body, now);
      }
    }
  }
};

TEST(StateSync, DownloadsAndVerifiesEveryChunk) {
  const auto blob = random_blob(1'000'003, 1);
  auto snap = std::make_shared<StateSnapshot>("run-s", 7, blob, 65536);
  Donors ds;
  ds.servers[donor_id(0)].add(snap);
  StateDownload d("run-s", {offer_of(*snap, 0)}, {}, dht::Time(0));
  ds.run(d);
  ASSERT_EQ(d.status(), OpStatus::done) << d.failure();
  EXPECT_TRUE(bytes_of(d) == blob);
  EXPECT_EQ(d.chunks_fetched(), snap->chunks());
}

TEST(StateSync, AFailingDonorIsReplacedAndTheDownloadResumes) {
  const auto blob = random_blob(1u << 20, 2);
  auto snap = std::make_shared<StateSnapshot>("run-s", 3, blob, 65536);  // 16 chunks
  Donors ds;
  ds.servers[donor_id(0)].add(snap);
  ds.servers[donor_id(1)].add(snap);
  std::size_t served0 = 0;
  ds.hook = [&](int donor, std::optional<std::uint32_t> idx, std::vector<std::uint8_t>&) {
    if (donor == 0 && idx) return ++served0 <= 10;  // dies after 10 chunks
    return true;
  };
  StateDownload d("run-s", {offer_of(*snap, 0), offer_of(*snap, 1)}, {}, dht::Time(0));
  ds.run(d);
  ASSERT_EQ(d.status(), OpStatus::done) << d.failure();
  EXPECT_TRUE(bytes_of(d) == blob);
  EXPECT_EQ(d.donors_tried(), 2u);
  // Donor 1 served only what was missing (resume), not all 16 chunks again.
  EXPECT_LE(ds.answered[1], 16u - 10u + 4u);
  EXPECT_EQ(d.chunks_fetched(), 16u);
}

// Donors of the same state (DiLoCo members hold the very same bits) serve it together:
// after the manifest every donor of its root gets `parallel` requests, so a joiner downloads at
// the sum of their upload rates; a donor of another root is not asked.
TEST(StateSync, EveryDonorOfTheSameStateServesChunksAtOnce) {
  const auto blob = random_blob(1u << 20, 12);
  auto snap = std::make_shared<StateSnapshot>("run-s", 5, blob, 32768);  // 32 chunks
  auto other = std::make_shared<StateSnapshot>("run-s", 5, random_blob(1u << 20, 13), 32768);
  Donors ds;
  for (int i : {0, 1, 2}) ds.servers[donor_id(i)].add(snap);
  ds.servers[donor_id(3)].add(other);
  StateSyncOptions o;
  o.parallel = 2;
  StateDownload d("run-s",
                  {offer_of(*snap, 0), offer_of(*other, 3), offer_of(*snap, 1), offer_of(*snap, 2)},
                  o, dht::Time(0));
  // The manifest from the first donor, then two chunk requests to each donor of its root.
  auto reqs = d.take_requests();
  ASSERT_EQ(reqs.size(), 1u);
  d.on_response(reqs[0].id, *ds.servers.at(reqs[0].to).answer(reqs[0].body), dht::Time(0));
  EXPECT_EQ(d.donors_active(), 3u);
  std::map<int, int> asked;
  reqs = d.take_requests();
  for (const auto& r : reqs) ++asked[r.to[0] - 1];
  EXPECT_EQ(asked, (std::map<int, int>{{0, 2}, {1, 2}, {2, 2}}));
  for (const auto& r : reqs) d.on_response(r.id, *ds.servers.at(r.to).answer(r.body), dht::Time(0));
  ds.run(d);
  ASSERT_EQ(d.status(), OpStatus::done) << d.failure();
  EXPECT_TRUE(bytes_of(d) == blob);
  EXPECT_EQ(d.chunks_fetched(), 32u);
  EXPECT_EQ(ds.answered.count(3), 0u);
  for (int i : {0, 1, 2}) EXPECT_GE(ds.answered[i], 8u) << "donor " << i;
}

// A donor that fails or sends a bad chunk while others serve the same state is dropped alone:
// its chunks go to the others and the download finishes without starting over.
TEST(StateSync, ADonorDroppedMidDownloadLeavesItsChunksToTheOthers) {
  const auto blob = random_blob(1u << 20, 14);
  auto snap = std::make_shared<StateSnapshot>("run-s", 5, blob, 32768);  // 32 chunks
  for (bool tamper : {false, true}) {
    Donors ds;
    for (int i : {0, 1, 2}) ds.servers[donor_id(i)].add(snap);
    std::size_t served1 = 0;
    ds.hook = [&](int donor, std::optional<std::uint32_t> idx, std::vector<std::uint8_t>& b) {
      if (donor != 1 || !idx || ++served1 <= 3) return true;
      if (!tamper) return false;
      b[0] ^= 1;
      return true;
    };
    StateDownload d("run-s", {offer_of(*snap, 0), offer_of(*snap, 1), offer_of(*snap, 2)}, {},
                    dht::Time(0));
    ds.run(d);
    ASSERT_EQ(d.status(), OpStatus::done) << d.failure();
    EXPECT_TRUE(bytes_of(d) == blob);
    EXPECT_EQ(d.donors_tried(), 3u);
    EXPECT_EQ(d.donors_active(), 2u);
    EXPECT_EQ(d.chunks_fetched(), 32u);  // nothing fetched twice
  }
}

TEST(StateSync, TamperedChunkOrManifestIsDetected) {
  const auto blob = random_blob(300'000, 3);
  auto snap = std::make_shared<StateSnapshot>("run-s", 9, blob, 65536);
  for (bool manifest : {false, true}) {
    Donors ds;
    ds.servers[donor_id(0)].add(snap);
    ds.servers[donor_id(1)].add(snap);
    ds.hook = [&](int donor, std::optional<std::uint32_t> idx, std::vector<std::uint8_t>& b) {
      if (donor == 0 && idx.has_value() != manifest && !b.empty()) b[b.size() / 2] ^= 0x40;
      return true;
    };
    StateDownload d("run-s", {offer_of(*snap, 0), offer_of(*snap, 1)}, {}, dht::Time(0));
    ds.run(d);
    ASSERT_EQ(d.status(), OpStatus::done) << d.failure();
    EXPECT_TRUE(bytes_of(d) == blob) << "tampered " << (manifest ? "manifest" : "chunk");
    EXPECT_EQ(d.donors_tried(), 2u);
  }
}

TEST(StateSync, FailsWhenEveryDonorFailsOrTimesOut) {
  auto snap = std::make_shared<StateSnapshot>("run-s", 1, random_blob(200'000, 4), 65536);
  Donors ds;
  ds.servers[donor_id(0)].add(snap);
  ds.hook = [](int, std::optional<std::uint32_t>, std::vector<std::uint8_t>&) { return false; };
  StateDownload d("run-s", {offer_of(*snap, 0)}, {}, dht::Time(0));
  ds.run(d);
  EXPECT_EQ(d.status(), OpStatus::failed);

  // A donor that never answers: the manifest request passes its deadline, the floor plus 64 kB
  // (a manifest's nominal size) at min_rate with the margin: 1000 + 2 * 64 * 1024 / 65536 s.
  StateSyncOptions o;
  o.request_floor = dht::Time(1000);
  o.min_rate = 65536;
  StateDownload t("run-s", {offer_of(*snap, 0)}, o, dht::Time(0));
  ASSERT_EQ(t.take_requests().size(), 1u);
  ASSERT_EQ(t.next_deadline(), dht::Time(3000));
  t.on_timer(dht::Time(2999));
  EXPECT_EQ(t.status(), OpStatus::running);
  t.on_timer(dht::Time(3000));
  EXPECT_EQ(t.status(), OpStatus::failed);
  EXPECT_NE(t.failure().find("the manifest not answered by its deadline"), std::string::npos)
      << t.failure();
  // No offers at all.
  EXPECT_EQ(StateDownload("run-s", {}, {}, dht::Time(0)).status(), OpStatus::failed);
}

// A chunk request's deadline follows its size and the donor's measured rate, not a constant: a
// state of large chunks over a slow donor gets the time it needs; the same chunks from a fast
// donor are given less once its rate is measured.
TEST(StateSync, ARequestsDeadlineScalesWithItsBytesAndTheMeasuredRate) {
  const auto blob = random_blob(8u << 20, 6);
  auto snap = std::make_shared<StateSnapshot>("run-s", 2, blob, 1u << 20);  // 8 chunks of 1 MiB
  StateServer srv;
  srv.add(snap);
  StateSyncOptions o;
  o.parallel = 2;
  o.request_floor = dht::Time(1000);
  o.min_rate = 1 << 20;  // 1 MiB/s assumed
  StateDownload d("run-s", {offer_of(*snap, 0)}, o, dht::Time(0));
  auto reqs = d.take_requests();  // the manifest
  ASSERT_EQ(reqs.size(), 1u);
  d.on_response(reqs[0].id, *srv.answer(reqs[0].body), dht::Time(100));
  reqs = d.take_requests();
  ASSERT_EQ(reqs.size(), 2u);
  // 1 and then 2 MiB in flight at 1 MiB/s, twice: 2 s and 4 s past the floor.
  EXPECT_EQ(reqs[0].deadline, dht::Time(100 + 1000 + 2000));
  EXPECT_EQ(reqs[1].deadline, dht::Time(100 + 1000 + 4000));
  // The transport is told to wait for the answer through the two more deadlines a late donor
  // may be given.
  EXPECT_EQ(reqs[1].give_up, dht::Time(100 + 3 * (1000 + 4000)));
  // With chunks of 4 MiB the same requests get four times the time (the size, not a constant).
  auto big = std::make_shared<StateSnapshot>("run-s", 2, blob, 4u << 20);
  StateServer srv4;
  srv4.add(big);
  StateDownload d4("run-s", {offer_of(*big, 0)}, o, dht::Time(0));
  auto r4 = d4.take_requests();
  d4.on_response(r4[0].id, *srv4.answer(r4[0].body), dht::Time(100));
  r4 = d4.take_requests();
  ASSERT_EQ(r4.size(), 2u);
  EXPECT_EQ(r4[1].deadline, dht::Time(100 + 1000 + 16'000));
  // The donor delivers 2 MiB in 200 ms (10 MiB/s measured): the next request, with 2 MiB in
  // flight again, is given 2 * 2 MiB at 10 MiB/s = 0.4 s past the floor.
  d.on_response(reqs[0].id, *srv.answer(reqs[0].body), dht::Time(150));
  d.on_response(reqs[1].id, *srv.answer(reqs[1].body), dht::Time(200));
  const auto p = d.progress(dht::Time(200));
  EXPECT_EQ(p.bytes, 2u << 20);
  EXPECT_EQ(p.total, 8u << 20);
  EXPECT_NEAR(p.rate, 10.0 * (1 << 20), 1.0);
  reqs = d.take_requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].deadline, dht::Time(200 + 1000 + 400));
  // It stops answering. It has delivered, so a missed deadline gives its late requests another
  // (from its rate measured so far, which falls while nothing comes), twice; the third drops it,
  // and the failure says which request and why.
  dht::Time t = reqs[0].deadline;
  for (int late = 1; late <= 2; ++late) {
    d.on_timer(t);
    ASSERT_EQ(d.status(), OpStatus::running) << "missed deadline " << late;
    // Both requests in flight wait for the new deadline: the second, due a little later, does
    // not spend a missed deadline of its own.
    ASSERT_GT(d.next_deadline(), reqs[1].deadline);
    ASSERT_GT(d.next_deadline(), t + dht::Time(1000));
    t = *d.next_deadline();
  }
  d.on_timer(t - dht::Time(1));
  EXPECT_EQ(d.status(), OpStatus::running);
  d.on_timer(t);
  EXPECT_EQ(d.status(), OpStatus::failed);
  EXPECT_NE(d.failure().find("not answered by its deadline (2 requests in flight at the measured"),
            std::string::npos)
      << d.failure();
}

// One request in flight, a 1 s floor and 1 MiB/s assumed: deadlines easy to name in a test.
StateSyncOptions one_request_at_a_time() {
  StateSyncOptions o;
  o.parallel = 1;
  o.request_floor = dht::Time(1000);
  o.min_rate = 1 << 20;
  return o;
}

// A donor late once (a stall of its machine or ours) that then delivers again starts its count of
// missed deadlines afresh: the download finishes from it.
TEST(StateSync, ALateDonorThatDeliversAgainIsKept) {
  auto snap = std::make_shared<StateSnapshot>("run-s", 2, random_blob(8u << 20, 7), 1u << 20);
  StateServer srv;
  srv.add(snap);
  const StateSyncOptions o = one_request_at_a_time();
  StateDownload d("run-s", {offer_of(*snap, 0)}, o, dht::Time(0));
  dht::Time now(0);
  const auto answer = [&](dht::Time at) {
    auto rs = d.take_requests();
    ASSERT_EQ(rs.size(), 1u);
    d.on_response(rs[0].id, *srv.answer(rs[0].body), at);
  };
  ASSERT_NO_FATAL_FAILURE(answer(now));                    // the manifest
  ASSERT_NO_FATAL_FAILURE(answer(now += dht::Time(100)));  // chunk 0: the donor has delivered
  // Every other chunk comes only after two missed deadlines: never three in a row.
  for (int c = 1; c < 8; ++c) {
    auto rs = d.take_requests();
    ASSERT_EQ(rs.size(), 1u);
    for (int late = 0; late < 2; ++late) {
      now = *d.next_deadline();
      d.on_timer(now);
      ASSERT_EQ(d.status(), OpStatus::running) << "chunk " << c << ", missed deadline " << late;
    }
    d.on_response(rs[0].id, *srv.answer(rs[0].body), now += dht::Time(10));
  }
  EXPECT_EQ(d.status(), OpStatus::done) << d.failure();
}

// The transport's timeout of a request is set when it leaves; a late donor's deadline here moves
// on past it. A request the transport gives up on meanwhile is asked again (a lateness, as a
// missed deadline is), not a reason to drop the only donor of a 97%-done download (a 500M join
// lost a minute to this while its donor's disk stalled).
TEST(StateSync, ARequestTheTransportGaveUpOnWhileItsDonorIsLateIsAskedAgain) {
  auto snap = std::make_shared<StateSnapshot>("run-s", 2, random_blob(8u << 20, 9), 1u << 20);
  StateServer srv;
  srv.add(snap);
  StateSyncOptions o = one_request_at_a_time();
  StateDownload d("run-s", {offer_of(*snap, 0)}, o, dht::Time(0));
  auto rs = d.take_requests();
  d.on_response(rs[0].id, *srv.answer(rs[0].body), dht::Time(0));  // the manifest
  rs = d.take_requests();
  d.on_response(rs[0].id, *srv.answer(rs[0].body), dht::Time(100));  // chunk 0 delivered
  rs = d.take_requests();
  ASSERT_EQ(rs.size(), 1u);
  const auto chunk1 = rs[0];
  // Its deadline passes: the donor is late, and chunk 1's deadline here moves on.
  d.on_timer(chunk1.deadline);
  ASSERT_EQ(d.status(), OpStatus::running);
  ASSERT_TRUE(d.next_deadline());
  const auto extended = *d.next_deadline();
  ASSERT_GT(extended, chunk1.deadline);
  // The transport gives up before that: the chunk is asked for again, from the same donor (the
  // request was in flight through the lateness already counted: no more of it).
  d.on_failure(chunk1.id, extended - dht::Time(1), "deadline exceeded");
  ASSERT_EQ(d.status(), OpStatus::running) << d.failure();
  rs = d.take_requests();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].to, chunk1.to);
  EXPECT_EQ(rs[0].body, chunk1.body);
  // The request asked again fails too: the second lateness of the two allowed; the next failure
  // drops the donor (the only one: the download fails).
  d.on_failure(rs[0].id, extended, "deadline exceeded");
  ASSERT_EQ(d.status(), OpStatus::running) << d.failure();
  rs = d.take_requests();
  ASSERT_EQ(rs.size(), 1u);
  d.on_failure(rs[0].id, extended, "deadline exceeded");
  EXPECT_EQ(d.status(), OpStatus::failed);
  EXPECT_NE(d.failure().find("the request for chunk 1 failed: deadline exceeded"),
            std::string::npos)
      << d.failure();
  // A donor that delivers again starts afresh: the download finishes from it.
  StateDownload e("run-s", {offer_of(*snap, 0)}, o, dht::Time(0));
  rs = e.take_requests();
  e.on_response(rs[0].id, *srv.answer(rs[0].body), dht::Time(0));
  dht::Time now(0);
  for (int c = 0; c < 8; ++c) {
    rs = e.take_requests();
    ASSERT_EQ(rs.size(), 1u);
    if (c > 0) {  // every chunk's first request is given up on by the transport
      e.on_failure(rs[0].id, now, "deadline exceeded");
      ASSERT_EQ(e.status(), OpStatus::running) << "chunk " << c << ": " << e.failure();
      rs = e.take_requests();
      ASSERT_EQ(rs.size(), 1u);
    }
    e.on_response(rs[0].id, *srv.answer(rs[0].body), now += dht::Time(10));
  }
  EXPECT_EQ(e.status(), OpStatus::done) << e.failure();

  // One stall fails every request in flight at once (the session to the donor closes): one
  // lateness, not one per request; the requests go out again and the download finishes.
  o.parallel = 4;
  StateDownload f("run-s", {offer_of(*snap, 0)}, o, dht::Time(0));
  rs = f.take_requests();
  f.on_response(rs[0].id, *srv.answer(rs[0].body), dht::Time(0));
  std::vector<StateDownload::Request> pending = f.take_requests();
  ASSERT_EQ(pending.size(), 4u);
  f.on_response(pending[0].id, *srv.answer(pending[0].body), dht::Time(10));  // it delivers
  pending.erase(pending.begin());
  for (int broke = 0; broke < 2; ++broke) {  // two breaks: the two latenesses allowed
    for (auto r : f.take_requests()) pending.push_back(r);
    ASSERT_EQ(pending.size(), 4u);
    for (const auto& r : pending) f.on_failure(r.id, dht::Time(20 + broke), "connection closed");
    pending.clear();
    ASSERT_EQ(f.status(), OpStatus::running) << "break " << broke << ": " << f.failure();
  }
  for (dht::Time now(30); f.status() == OpStatus::running; now += dht::Time(1)) {
    for (auto r : f.take_requests()) pending.push_back(r);
    ASSERT_FALSE(pending.empty());
    f.on_response(pending.front().id, *srv.answer(pending.front().body), now);
    pending.erase(pending.begin());
  }
  EXPECT_EQ(f.status(), OpStatus::done) << f.failure();
}

// A download that failed hands its verified chunks to the next one (a join's next attempt),
// which fetches only the rest of the same snapshot.
TEST(StateSync, ANewDownloadResumesFromTheVerifiedChunksOfAFailedOne) {
  const auto blob = random_blob(1u << 20, 7);
  auto snap = std::make_shared<StateSnapshot>("run-s", 5, blob, 65536);  // 16 chunks
  Donors ds;
  ds.servers[donor_id(0)].add(snap);
  std::size_t served = 0;
  bool dead = true;
  ds.hook = [&](int, std::optional<std::uint32_t> idx, std::vector<std::uint8_t>&) {
    return !(idx && dead && ++served > 9);  // the only donor fails after 9 chunks
  };
  StateDownload first("run-s", {offer_of(*snap, 0)}, {}, dht::Time(0));
  ds.run(first);
  ASSERT_EQ(first.status(), OpStatus::failed);
  auto partial = first.take_partial();
  ASSERT_TRUE(partial);
  EXPECT_EQ(partial->verified, 9u);
  EXPECT_EQ(partial->root, snap->root());
  dead = false;
  ds.answered.clear();
  StateDownload second("run-s", {offer_of(*snap, 0)}, {}, dht::Time(0), std::move(partial));
  EXPECT_EQ(second.progress(dht::Time(0)).bytes, 9u * 65536);
  ds.run(second);
  ASSERT_EQ(second.status(), OpStatus::done) << second.failure();
  EXPECT_TRUE(bytes_of(second) == blob);
  EXPECT_EQ(ds.answered[0], 16u - 9u);  // neither the manifest nor a verified chunk again
  // A partial of another snapshot is dropped: the download starts over.
  auto other = std::make_shared<StateSnapshot>("run-s", 6, random_blob(1u << 20, 8), 65536);
  StateServer srv;
  srv.add(other);
  SyncPartial stale;
  stale.root = snap->root();
  stale.manifest.size = 65536;
  stale.manifest.chunk_bytes = 65536;
  stale.manifest.chunks.resize(1);
  stale.have = {true};
  stale.verified = 1;
  stale.blob = std::move(memory_blob_store()->create(65536).value());
  StateDownload third("run-s", {offer_of(*other, 0)}, {}, dht::Time(0), std::move(stale));
  auto reqs = third.take_requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_FALSE(decode_state_request(reqs[0].body)->index) << "asks for the manifest first";
}

TEST(StateSync, RefusesOffersOfAnotherRunOrOverTheSizeBound) {
  auto snap = std::make_shared<StateSnapshot>("run-s", 1, random_blob(100'000, 5), 65536);
  Donors ds;
  ds.servers[donor_id(0)].add(snap);
  auto other = offer_of(*snap, 0);
  other.run_id = "run-other";
  StateDownload d("run-s", {other}, {}, dht::Time(0));
  EXPECT_EQ(d.status(), OpStatus::failed);
  StateSyncOptions small;
  small.max_size = 1000;
  StateDownload e("run-s", {offer_of(*snap, 0)}, small, dht::Time(0));
  EXPECT_EQ(e.status(), OpStatus::failed);
}

TEST(StateSync, ServerKeepsTheLatestSnapshotsAndCodecsAreBounded) {
  StateServer srv(2);
  std::vector<std::shared_ptr<StateSnapshot>> s;
  for (int r = 0; r < 3; ++r) {
    s.push_back(std::make_shared<StateSnapshot>("run-s", r, random_blob(1000, r), 256));
    srv.add(s.back());
  }
  EXPECT_EQ(srv.latest()->round(), 2u);
  EXPECT_FALSE(srv.answer(encode_state_request({s[0]->root(), std::nullopt})));  // dropped
  EXPECT_TRUE(srv.answer(encode_state_request({s[1]->root(), 3})));
  EXPECT_FALSE(srv.answer(encode_state_request({s[1]->root(), 99})));  // no such chunk
  EXPECT_TRUE(srv.answer(encode_state_request({s[2]->root(), 0})));
  const auto bytes = s[2]->manifest_bytes();
  EXPECT_TRUE(decode_manifest(bytes, 16));
  EXPECT_FALSE(decode_manifest(bytes, 2));  // more chunks than the bound
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_manifest(std::span(bytes).first(n), 16));
  StateOffer o{donor_id(0), "a:1", "run-s", 4, 1000, s[2]->root(), {}};
  auto back = decode_offer(encode_offer(o));
  ASSERT_TRUE(back);
  back->donor = o.donor;  // the owner is not encoded (the record's signature proves it)
  EXPECT_EQ(*back, o);
}

// Past its byte budget a server holds the latest snapshot and, of the older ones, only those a
// joiner is fetching (asked for since the last add): a large model's node holds one state's bytes.
TEST(StateSync, PastItsBudgetTheServerHoldsOnlySnapshotsBeingFetched) {
  StateServer srv(2, 1500);  // room for one 1000-byte snapshot
  std::vector<std::shared_ptr<StateSnapshot>> s;
  const auto add = [&] {
    const auto r = static_cast<std::uint64_t>(s.size());
    s.push_back(std::make_shared<StateSnapshot>("run-s", r, random_blob(1000, r), 256));
    srv.add(s.back());
  };
  const auto held = [&](std::size_t i) {
    return srv.answer(encode_state_request({s[i]->root(), std::nullopt})).has_value();
  };
  add();
  add();
  EXPECT_FALSE(held(0));  // superseded, nobody asked for it, over the budget
  EXPECT_TRUE(held(1));   // a joiner starts fetching s1 (a probe is a fetch)
  add();
  EXPECT_TRUE(held(1));  // held while it is fetched
  add();
  EXPECT_FALSE(held(2));  // superseded by s3 before anyone asked for it
  EXPECT_TRUE(held(1));   // still fetched
  EXPECT_TRUE(held(3));   // another joiner fetches s3
  add();
  EXPECT_FALSE(
      held(1));  // two fetched older snapshots and the latest: over `keep`, the oldest goes
  add();
  EXPECT_FALSE(held(3));  // not asked for since the last add
  EXPECT_FALSE(held(4));
  EXPECT_TRUE(held(5));
  EXPECT_EQ(srv.latest()->round(), 5u);
}

}  // namespace
}  // namespace grove::gossip
