// The round engine on the real stack: three nodes on loopback over the encrypted transport, each
// with its DHT runtime, gossip runtime and round runtime. Two join by state sync over "state"
// requests, the swarm averages in NoLoCo pairs, then switches to DiLoCo at run time and every
// member ends each DiLoCo round with the same slow weights.
#include "gossip/round_runtime.hpp"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "tests/transport/test_util.hpp"

namespace grove::gossip {
namespace {

using namespace std::chrono_literals;
using transport::test::World;

struct Node {
  std::shared_ptr<transport::Host> host;
  std::shared_ptr<dht::DhtRuntime> dht;
  std::shared_ptr<GossipRuntime> gossip;
  std::shared_ptr<StateServer> server = std::make_shared<StateServer>();
  std::shared_ptr<dht::Membership> members;
  std::shared_ptr<RoundRuntime> round;
  std::vector<float> target;
};

struct Swarm {
  World w;
  std::vector<Node> nodes;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::size_t, std::vector<RoundReport>> reports;

  RoundOptions options() {
    RoundOptions o;
    o.match.window = dht::Time(1000);
    o.match.min_lead = dht::Time(300);
    o.match.settle = dht::Time(300);
    o.match.read_timeout = dht::Time(3000);
    o.match.patience = dht::Time(3000);
    o.mode_poll = dht::Time(500);
    o.threads = 1;
    return o;
  }

  void add(std::size_t i, std::size_t params) {
    Node n;
    n.host = w.host();
    n.dht = dht::DhtRuntime::create(n.host, dht::DhtOptions{}, 1000 + i);
    n.gossip = GossipRuntime::create(n.host);
    serve_state(*n.host, n.server);
    w.start(n.host);
    n.dht->start();
    if (i > 0) n.dht->bootstrap({nodes[0].host->address()});
    dht::MembershipOptions mo;
    mo.ttl = dht::Time(4000);
    mo.publish_every = dht::Time(1000);
    mo.poll_every = dht::Time(500);
    dht::MemberInfo self;
    self.addresses = {n.host->address()};
    n.members = n.dht->join("rt-run", mo, self);
    n.target.resize(params);
    for (std::size_t k = 0; k < params; ++k) n.target[k] = float((i + 1) * (k % 7)) / 7.0f;
    n.round = RoundRuntime::create(n.host, n.dht, n.gossip, n.members, n.server, "rt-run",
                                   {n.host->address()}, options(),
                                   [this, i](RoundReport&& r) { on_report(i, r); });
    nodes.push_back(std::move(n));
  }

  // Every report: record it and start the next "inner phase" at once (θ moves half-way from φ
  // to the node's target).
  void on_report(std::size_t i, const RoundReport& r) {
    if (r.kind == RoundReport::Kind::sync_progress) return;  // outcomes only
    {
      std::lock_guard lock(mu);
      reports[i].push_back(r);
    }
    cv.notify_all();
    if (r.kind == RoundReport::Kind::sync_failed) return;
    auto& n = nodes[i];
    n.round->with_engine([&n](RoundEngine& e) {
      if (!e.idle()) return;
      const auto& phi = e.state().phi;
      std::vector<float> theta(phi.size());
      for (std::size_t k = 0; k < phi.size(); ++k)
        theta[k] = phi[k] + 0.5f * (n.target[k] - phi[k]);
      n.round->submit(std::move(theta));
    });
  }

  template <class P>
  bool wait(P pred, std::chrono::seconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return pred(reports); });
  }

  // The engines call back into this object on the strands: stop the DHT runtimes there first,
  // then the hosts and the io thread, before the nodes go.
  ~Swarm() {
    for (auto& n : nodes) n.dht->stop();  // posted: runs before the hosts' shutdown below
    w.stop();
  }
};

std::size_t count(const std::vector<RoundReport>& rs, OuterMode mode) {
  std::size_t c = 0;
  for (const auto& r : rs)
    c += r.kind == RoundReport::Kind::round && r.mode == mode && !r.local_only;
  return c;
}

TEST(RoundRuntime, JoinBySyncAverageThenSwitchToDiLoCoOverEncryptedTcp) {
  const std::size_t params = 50'000;
  Swarm s;
  s.nodes.reserve(3);
  for (std::size_t i = 0; i < 3; ++i) s.add(i, params);
  optim::OuterState st;
  st.phi.assign(params, 0.25f);
  s.nodes[0].round->start(std::move(st));
  for (std::size_t i = 1; i < 3; ++i) s.nodes[i].round->join();
  // The bootstrap node produces its first report only after a round: kick off its inner phase.
  RoundReport kick;
  kick.kind = RoundReport::Kind::synced;
  s.on_report(0, kick);

  ASSERT_TRUE(s.wait(
      [](auto& reps) {
        for (std::size_t i = 0; i < 3; ++i)
          if (count(reps[i], OuterMode::noloco) < 3) return false;
        return true;
      },
      60s));
  {
    std::lock_guard lock(s.mu);
    for (std::size_t i = 1; i < 3; ++i) {
      ASSERT_FALSE(s.reports[i].empty());
      EXPECT_EQ(s.reports[i].front().kind, RoundReport::Kind::synced) << s.reports[i].front().note;
      EXPECT_GT(s.reports[i].front().bytes_received, params * 4);
    }
  }

  std::promise<transport::Result<std::uint64_t>> asked;
  auto fut = asked.get_future();
  s.nodes[1].round->request_mode(OuterMode::diloco, std::nullopt,
                                 [&](transport::Result<std::uint64_t> r) { asked.set_value(r); });
  auto from = transport::test::await(fut, 20s);
  ASSERT_TRUE(from && *from);
  ASSERT_TRUE(s.wait(
      [](auto& reps) {
        for (std::size_t i = 0; i < 3; ++i)
          if (count(reps[i], OuterMode::diloco) < 3) return false;
        return true;
      },
      90s));
  std::lock_guard lock(s.mu);
  std::map<std::uint64_t, std::set<Digest>> by_round;
  for (auto& [i, reps] : s.reports)
    for (const auto& r : reps)
      if (r.kind == RoundReport::Kind::round && r.mode == OuterMode::diloco && !r.local_only) {
        EXPECT_GE(r.round, **from);
        by_round[r.round].insert(r.weights_hash);
      }
  for (const auto& [round, hashes] : by_round)
    EXPECT_EQ(hashes.size(), 1u) << "DiLoCo round " << round << " left different slow weights";
}

// A blob whose reads wait until it is opened: a disk that stalls.
struct StallingBlob final : StateBlob {
  std::vector<std::uint8_t> bytes;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable bool open = true;
  mutable int waiting = 0;
  std::uint64_t size() const override { return bytes.size(); }
  transport::Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    std::unique_lock lock(mu);
    ++waiting;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
    --waiting;
    std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(offset), out.size(), out.begin());
    return {};
  }
  void set_open(bool o) {
    std::lock_guard lock(mu);
    open = o;
    cv.notify_all();
  }
  bool wait_for_reader(std::chrono::milliseconds d) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, d, [&] { return waiting > 0; });
  }
};

// A joiner's chunk request whose read stalls (a busy disk) does not hold the donor's host: its
// other requests (here the manifest; in a node, every session's keepalives and records) are
// answered meanwhile. (The World runs every host on one thread: a read on the host's strand would
// stall them all.)
TEST(ServeState, AStalledChunkReadDoesNotHoldTheHost) {
  World w;
  auto donor = w.host();
  auto joiner = w.host();
  auto server = std::make_shared<StateServer>();
  serve_state(*donor, server);
  w.start(donor);
  w.start(joiner);
  auto blob = std::make_shared<StallingBlob>();
  blob->bytes.resize(256 << 10);
  for (std::size_t i = 0; i < blob->bytes.size(); ++i) blob->bytes[i] = std::uint8_t(i * 7);
  auto snap = StateSnapshot::of("run", 1, blob, 64 << 10);  // hashes the chunks: reads, open
  ASSERT_TRUE(snap);
  server->add(*snap);
  blob->set_open(false);

  std::mutex mu;
  std::condition_variable cv;
  std::optional<transport::Result<transport::Payload>> chunk, manifest;
  const auto ask = [&](std::optional<std::uint32_t> index, auto& slot) {
    const auto body = encode_state_request({(*snap)->root(), index});
    joiner->request(transport::PeerRef::node(donor->id(), donor->address()), "state",
                    transport::Bytes::copy_of(body), 30s, [&](transport::Result<transport::Payload> r) {
                      std::lock_guard lock(mu);
                      slot = std::move(r);
                      cv.notify_all();
                    });
  };
  ask(0, chunk);
  ASSERT_TRUE(blob->wait_for_reader(10s)) << "the chunk's read never started";
  ask(std::nullopt, manifest);
  {
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, 5s, [&] { return manifest.has_value(); }))
        << "the manifest waited for the stalled chunk read";
    EXPECT_FALSE(chunk.has_value());
  }
  blob->set_open(true);
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return chunk.has_value(); }));
  ASSERT_TRUE(*chunk) << chunk->text();
  ASSERT_TRUE(manifest.has_value() && *manifest);
  EXPECT_EQ((*chunk)->size(), std::size_t{64} << 10);
}

}  // namespace
}  // namespace grove::gossip
