// Session behaviour (RPC, deadlines, cancellation, streams, flow control, keepalive), run on
// every link kind: in-memory, and real TCP with the secure channel, its crypto done inline on
// the host strand or on the worker pool.
#include "transport/session.hpp"

#include <gtest/gtest.h>
#include <sodium.h>

#include <deque>
#include <thread>

#include <boost/asio/steady_timer.hpp>

#include "test_util.hpp"

namespace grove::transport {
namespace {
using namespace test;

enum class Kind { memory, tcp_inline, tcp_workers };

class SessionTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::memory) world_.use_memory_network();
  }
  std::shared_ptr<Host> make(HostOptions o = {}) {
    o.link.inline_crypto = GetParam() == Kind::tcp_inline;
    auto h = world_.host(std::move(o));
    return h;
  }
  // Starts a and b; a's request "hold" reaches b, which keeps its responder in `held`; `done`
  // gets the request's outcome.
  void hold_a_request(const std::shared_ptr<Host>& a, const std::shared_ptr<Host>& b,
                      std::optional<Responder>& held, std::promise<std::error_code>& done) {
    b->handle("hold", [&](const PeerInfo&, Payload, Responder r) { held.emplace(std::move(r)); });
    world_.start(a);
    world_.start(b);
    a->request(PeerRef::at(b->address()), "hold", Bytes(), 60s,
               [&](Result<Payload> r) { done.set_value(r.error()); });
    ASSERT_TRUE(eventually(b->executor(), [&] { return held.has_value(); }));
  }
  World world_;
};

/// Collects a stream: hashes it, records the most bytes held at once, optionally holds chunks
/// and releases them one per `release_every` (a slow consumer).
class HashSink : public StreamSink, public std::enable_shared_from_this<HashSink> {
 public:
  HashSink(boost::asio::any_io_executor ex, Duration release_every = Duration(0))
      : timer_(ex), release_every_(release_every) {
    crypto_generichash_init(&st_, nullptr, 0, 32);
  }
  void on_data(Chunk c) override {
    if (c.offset() != next_) order_ok_ = false;
    next_ += c.bytes().size();
    crypto_generichash_update(&st_, c.bytes().data(), c.bytes().size());
    if (release_every_.count() == 0) return;
    held_bytes_ += c.bytes().size();
    max_held_ = std::max(max_held_, held_bytes_);
    held_.push_back(std::move(c));
    arm();
  }
  void on_end(std::error_code ec) override {
    Hash256 h;
    crypto_generichash_final(&st_, h.data(), h.size());
    result.set_value({ec, to_hex(h)});
  }
  void arm() {
    if (armed_ || held_.empty()) return;
    armed_ = true;
    timer_.expires_after(release_every_);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code) {
      self->armed_ = false;
      if (self->held_.empty()) return;
      self->held_bytes_ -= self->held_.front().bytes().size();
      self->released_ += self->held_.front().bytes().size();
      self->held_.pop_front();
      self->arm();
    });
  }
  std::promise<std::pair<std::error_code, std::string>> result;
  std::size_t max_held_ = 0;
  std::atomic<std::uint64_t> released_{0};
  bool order_ok_ = true;

 private:
  crypto_generichash_state st_;
  boost::asio::steady_timer timer_;
  Duration release_every_;
  std::deque<Chunk> held_;
  std::size_t held_bytes_ = 0;
  std::uint64_t next_ = 0;
  bool armed_ = false;
};

std::string pattern_hash(std::uint64_t size, std::uint64_t seed) {
  PatternSource src(size, seed);
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  std::vector<std::uint8_t> buf(1 << 20);
  for (std::uint64_t off = 0; off < size; off += buf.size()) {
    auto n = std::min<std::uint64_t>(buf.size(), size - off);
    (void)src.read(off, {buf.data(), n});
    crypto_generichash_update(&st, buf.data(), n);
  }
  Hash256 h;
  crypto_generichash_final(&st, h.data(), h.size());
  return to_hex(h);
}

TEST_P(SessionTest, RequestResponseReusesOneSession) {
  auto a = make(), b = make();
  add_echo(b);
  world_.start(a);
  world_.start(b);
  for (int i = 0; i < 20; ++i) {
    auto r = call(a, PeerRef::at(b->address()), "echo", "hello " + std::to_string(i));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, "hello " + std::to_string(i));
  }
  // By id only, now that a session exists.
  auto r = call(a, PeerRef::node(b->id()), "echo", "by id");
  ASSERT_TRUE(r);
  EXPECT_EQ(run_on(a->executor(), [&] { return a->stats().sessions; }), 1u);
  auto peers = run_on(b->executor(), [&] { return b->peers(); });
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0].id, a->id());  // the identity the peer proved
  EXPECT_TRUE(peers[0].inbound);
}

TEST_P(SessionTest, UnknownMethodAndUnknownPeer) {
  auto a = make(), b = make();
  world_.start(a);
  world_.start(b);
  EXPECT_EQ(call(a, PeerRef::at(b->address()), "nope", "").error(),
            make_error_code(errc::no_handler));
  EXPECT_EQ(call(a, PeerRef::node(Identity::generate().id()), "echo", "").error(),
            make_error_code(errc::unreachable));
}

TEST_P(SessionTest, DeadlineExpiresAndServerSeesIt) {
  auto a = make(), b = make();
  std::promise<void> got;
  std::optional<Responder> held;
  b->handle("slow", [&](const PeerInfo&, Payload, Responder r) {
    held.emplace(std::move(r));
    got.set_value();
  });
  world_.start(a);
  world_.start(b);
  ASSERT_TRUE(call(a, PeerRef::at(b->address()), "echo-none", "").error());  // warm the session
  const auto t0 = Clock::now();
  auto r = call(a, PeerRef::at(b->address()), "slow", "", 300ms);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(r.error(), make_error_code(errc::timed_out));
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(eventually(b->executor(), [&] { return held && held->cancelled(); }));
  run_on(b->executor(), [&] {
    held->reply(as_bytes("late"));
    held.reset();
  });  // ignored
}

TEST_P(SessionTest, CancellationReachesBothSides) {
  auto a = make(), b = make();
  std::optional<Responder> held;
  b->handle("hold", [&](const PeerInfo&, Payload, Responder r) { held.emplace(std::move(r)); });
  world_.start(a);
  world_.start(b);
  std::promise<std::error_code> p;
  auto f = p.get_future();
  auto h = a->request(PeerRef::at(b->address()), "hold", Bytes(), 30s,
                      [&](Result<Payload> r) { p.set_value(r.error()); });
  ASSERT_TRUE(eventually(b->executor(), [&] { return held.has_value(); }));
  h.cancel();
  EXPECT_EQ(await(f, 5s), make_error_code(errc::cancelled));
  EXPECT_TRUE(eventually(b->executor(), [&] { return held->cancelled(); }));
  run_on(b->executor(), [&] { held.reset(); });
}

TEST_P(SessionTest, DroppedResponderAnswersWithError) {
  auto a = make(), b = make();
  b->handle("drop", [](const PeerInfo&, Payload, Responder) {});
  b->handle("fail", [](const PeerInfo&, Payload, Responder r) { r.fail(errc::rejected, "no"); });
  world_.start(a);
  world_.start(b);
  EXPECT_EQ(call(a, PeerRef::at(b->address()), "drop", "").error(),
            make_error_code(errc::remote_error));
  EXPECT_EQ(call(a, PeerRef::at(b->address()), "fail", "").error(),
            make_error_code(errc::rejected));
}

TEST_P(SessionTest, OneWayMessagesArriveInOrder) {
  auto a = make(), b = make();
  std::vector<std::string> got;
  std::promise<void> all;
  b->handle_message("note", [&](const PeerInfo&, Payload p) {
    got.emplace_back(p.bytes().begin(), p.bytes().end());
    if (got.size() == 50) all.set_value();
  });
  world_.start(a);
  world_.start(b);
  for (int i = 0; i < 50; ++i) {
    std::string s = std::to_string(i);
    a->send(PeerRef::at(b->address()), "note", Bytes::copy_of(as_bytes(s)));
  }
  auto f = all.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(got[i], std::to_string(i));
}

TEST_P(SessionTest, StreamArrivesIntactAndInOrder) {
  HostOptions o;
  o.session.stream_chunk = 64 << 10;
  o.session.stream_window = 256 << 10;
  auto a = make(o), b = make(o);
  std::shared_ptr<HashSink> sink;
  std::string meta_seen;
  b->accept_streams("blob", [&](const PeerInfo&, IncomingStream& in) {
    meta_seen.assign(in.meta.bytes().begin(), in.meta.bytes().end());
    sink = std::make_shared<HashSink>(b->executor());
    return sink;
  });
  world_.start(a);
  world_.start(b);
  const std::uint64_t size = (5 << 20) + 12345;  // not a multiple of the chunk
  std::promise<std::error_code> sent;
  a->send_stream(PeerRef::at(b->address()), "blob", Bytes::copy_of(as_bytes("meta!")),
                 std::make_shared<PatternSource>(size, 7),
                 [&](std::error_code ec) { sent.set_value(ec); });
  auto fs = sent.get_future();
  ASSERT_EQ(await(fs, 60s), std::error_code());
  ASSERT_TRUE(sink);
  auto fr = sink->result.get_future();
  auto r = await(fr, 10s);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->first);
  EXPECT_EQ(r->second, pattern_hash(size, 7));
  EXPECT_TRUE(sink->order_ok_);
  EXPECT_EQ(meta_seen, "meta!");
}

TEST_P(SessionTest, RefusedUnknownAndEmptyStreams) {
  auto a = make(), b = make();
  b->accept_streams("never", [](const PeerInfo&, IncomingStream&) { return nullptr; });
  std::shared_ptr<HashSink> empty_sink;
  b->accept_streams("empty", [&](const PeerInfo&, IncomingStream&) {
    return empty_sink = std::make_shared<HashSink>(b->executor());
  });
  world_.start(a);
  world_.start(b);
  auto send = [&](const std::string& kind, std::uint64_t size) {
    std::promise<std::error_code> p;
    auto f = p.get_future();
    a->send_stream(PeerRef::at(b->address()), kind, Bytes(),
                   std::make_shared<PatternSource>(size, 1),
                   [&](std::error_code ec) { p.set_value(ec); });
    return *await(f, 10s);
  };
  EXPECT_EQ(send("never", 100), make_error_code(errc::rejected));
  EXPECT_EQ(send("unknown-kind", 100), make_error_code(errc::rejected));
  EXPECT_EQ(send("empty", 0), std::error_code());
}

TEST_P(SessionTest, SlowReceiverBoundsMemory) {
  HostOptions o;
  o.session.stream_chunk = 64 << 10;
  o.session.stream_window = 256 << 10;
  auto a = make(o), b = make(o);
  std::shared_ptr<HashSink> sink;
  b->accept_streams("slow", [&](const PeerInfo&, IncomingStream&) {
    return sink = std::make_shared<HashSink>(b->executor(), Duration(2));  // ~32 MB/s
  });
  world_.start(a);
  world_.start(b);
  const std::uint64_t size = 8 << 20;
  std::promise<std::error_code> sent;
  // A source that records how far ahead of the consumer it is ever asked to read.
  struct Tracking : PatternSource {
    Tracking(std::uint64_t n, std::shared_ptr<HashSink>* s) : PatternSource(n, 3), sink(s) {}
    Result<void> read(std::uint64_t off, std::span<std::uint8_t> out) override {
      if (*sink) {
        const std::uint64_t released = (*sink)->released_.load();
        const std::uint64_t ahead = off + out.size() - released;
        max_ahead = std::max<std::uint64_t>(max_ahead, ahead);
      }
      return PatternSource::read(off, out);
    }
    std::shared_ptr<HashSink>* sink;
    std::uint64_t max_ahead = 0;
  };
  auto src = std::make_shared<Tracking>(size, &sink);
  a->send_stream(PeerRef::at(b->address()), "slow", Bytes(), src,
                 [&](std::error_code ec) { sent.set_value(ec); });
  auto fs = sent.get_future();
  ASSERT_TRUE(fs.wait_for(60s) == std::future_status::ready);
  ASSERT_EQ(fs.get(), std::error_code());
  auto fr = sink->result.get_future();
  auto r = await(fr, 10s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->second, pattern_hash(size, 3));
  // The consumer never held more than the window, however fast the sender was.
  EXPECT_GT(sink->max_held_, 0u);
  EXPECT_LE(sink->max_held_, o.session.stream_window);
  // ... and the sender never produced more than a window ahead of what was consumed.
  EXPECT_LE(src->max_ahead, o.session.stream_window);
}

TEST_P(SessionTest, FailingSourceAbortsBothEnds) {
  struct Broken : PatternSource {
    Broken() : PatternSource(4 << 20, 1) {}
    Result<void> read(std::uint64_t off, std::span<std::uint8_t> out) override {
      if (off >= (1 << 20)) return errc::source_failed;
      return PatternSource::read(off, out);
    }
  };
  HostOptions o;
  o.session.stream_chunk = 256 << 10;
  auto a = make(o), b = make(o);
  std::shared_ptr<HashSink> sink;
  b->accept_streams("x", [&](const PeerInfo&, IncomingStream&) {
    return sink = std::make_shared<HashSink>(b->executor());
  });
  world_.start(a);
  world_.start(b);
  std::promise<std::error_code> sent;
  a->send_stream(PeerRef::at(b->address()), "x", Bytes(), std::make_shared<Broken>(),
                 [&](std::error_code ec) { sent.set_value(ec); });
  auto fs = sent.get_future();
  EXPECT_EQ(await(fs, 10s), make_error_code(errc::source_failed));
  ASSERT_TRUE(sink);
  auto fr = sink->result.get_future();
  auto r = await(fr, 10s);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->first);  // the receiver never sees a "complete" partial stream
}

TEST_P(SessionTest, PeerThatHangsMidStreamIsAbandoned) {
  auto plan = std::make_shared<FaultPlan>(5);
  HostOptions o;
  o.session.stream_chunk = 64 << 10;
  o.session.stream_window = 128 << 10;
  o.session.stream_timeout = Duration(400);
  HostOptions ob = o;
  ob.faults = plan;  // the receiver's links: it can be made to hang
  auto a = make(o), b = make(ob);
  std::shared_ptr<HashSink> sink;
  b->accept_streams("x", [&](const PeerInfo&, IncomingStream&) {
    // Hang as soon as the stream starts: nothing more goes in or out of b on this link.
    FaultConfig hang;
    hang.hang = true;
    plan->set(a->id(), hang);
    return sink = std::make_shared<HashSink>(b->executor());
  });
  world_.start(a);
  world_.start(b);
  std::promise<std::error_code> sent;
  const auto t0 = Clock::now();
  a->send_stream(PeerRef::at(b->address()), "x", Bytes(),
                 std::make_shared<PatternSource>(8 << 20, 1),
                 [&](std::error_code ec) { sent.set_value(ec); });
  auto fs = sent.get_future();
  EXPECT_EQ(await(fs, 10s), make_error_code(errc::timed_out));
  // Abandoned within the stream timeout plus one tick (timeout/4) and scheduling slack.
  EXPECT_LT(Clock::now() - t0, Duration(400 + 1000));
  auto fr = sink->result.get_future();
  auto r = await(fr, 10s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->first, make_error_code(errc::timed_out));
}

TEST_P(SessionTest, DisconnectFailsPendingRequestPromptly) {
  auto plan = std::make_shared<FaultPlan>(1);
  HostOptions oa;
  oa.faults = plan;
  auto a = make(oa), b = make();
  std::optional<Responder> held;
  std::promise<std::error_code> p;
  auto f = p.get_future();
  ASSERT_NO_FATAL_FAILURE(hold_a_request(a, b, held, p));
  run_on(a->executor(), [&] { plan->disconnect(b->id()); });
  auto ec = await(f, 5s);
  ASSERT_TRUE(ec);
  EXPECT_TRUE(*ec == errc::connection_truncated || *ec == errc::connection_closed) << ec->message();
  EXPECT_TRUE(eventually(b->executor(), [&] { return b->stats().sessions == 0; }));
  run_on(b->executor(), [&] { held.reset(); });
}

TEST_P(SessionTest, SilentPeerDetectedAndIdleSessionClosed) {
  auto plan = std::make_shared<FaultPlan>(1);
  HostOptions o;
  o.session.keepalive = Duration(100);
  o.session.dead_after = Duration(500);
  o.session.idle_timeout = Duration(300);
  HostOptions oa = o;
  oa.faults = plan;
  // b is patient, so that it is a (the side that sees the silence) that detects it.
  HostOptions ob;
  auto a = make(oa), b = make(ob);
  add_echo(b);
  world_.start(a);
  world_.start(b);
  // Idle: closes by itself after idle_timeout.
  ASSERT_TRUE(call(a, PeerRef::at(b->address()), "echo", "x"));
  EXPECT_TRUE(eventually(
      a->executor(), [&] { return a->stats().sessions == 0; }, 5s));
  // Silent (hung) peer: detected by the keepalive within dead_after, even while a request waits.
  ASSERT_TRUE(call(a, PeerRef::at(b->address()), "echo", "x"));
  run_on(a->executor(), [&] {
    FaultConfig hang;
    hang.hang = true;
    plan->set(b->id(), hang);
  });
  const auto t0 = Clock::now();
  auto r = call(a, PeerRef::node(b->id()), "echo", "y", 30s);
  EXPECT_TRUE(r.error() == errc::timed_out) << r.error().message();
  EXPECT_LT(Clock::now() - t0, 5s);
}

// Our own process not running for longer than dead_after (a stall of the machine, or a handler
// that held the host strand) is not the peer's silence: what it sent meanwhile waits in the
// socket, and the session stays up.
TEST_P(SessionTest, AStallOfOursIsNotThePeersSilence) {
  HostOptions oa;
  oa.session.keepalive = Duration(100);
  oa.session.dead_after = Duration(500);
  auto a = make(oa), b = make();  // (b is patient: a stalled peer is not its question here)
  std::optional<Responder> held;
  std::promise<std::error_code> p;
  auto f = p.get_future();
  ASSERT_NO_FATAL_FAILURE(hold_a_request(a, b, held, p));
  run_on(a->executor(), [] { std::this_thread::sleep_for(1500ms); });  // a stalls: 3 x dead_after
  run_on(b->executor(), [&] {
    held->reply(as_bytes("ok"));
    held.reset();
  });
  EXPECT_EQ(await(f, 5s), std::error_code());
  EXPECT_EQ(run_on(a->executor(), [&] { return a->stats().sessions; }), 1u);
}

TEST_P(SessionTest, IncomingRequestLimit) {
  HostOptions ob;
  ob.session.max_incoming_requests = 3;
  auto a = make(), b = make(ob);
  std::vector<Responder> held;
  b->handle("hold", [&](const PeerInfo&, Payload, Responder r) { held.push_back(std::move(r)); });
  world_.start(a);
  world_.start(b);
  std::vector<std::promise<std::error_code>> ps(5);
  for (auto& p : ps)
    a->request(PeerRef::at(b->address()), "hold", Bytes(), 30s,
               [&p](Result<Payload> r) { p.set_value(r.error()); });
  int limited = 0;
  for (int i = 3; i < 5; ++i) {
    auto f = ps[i].get_future();
    if (await(f, 10s) == errc::limit_reached) ++limited;
  }
  EXPECT_EQ(limited, 2);
  run_on(b->executor(), [&] {
    for (auto& r : held) r.reply(as_bytes("ok"));
    held.clear();
  });
  for (int i = 0; i < 3; ++i) {
    auto f = ps[i].get_future();
    EXPECT_EQ(await(f, 10s), std::error_code());
  }
}

TEST_P(SessionTest, SendQueueToASlowPeerIsBounded) {
  auto plan = std::make_shared<FaultPlan>(1);
  FaultConfig slow;
  slow.bandwidth_bytes_per_sec = 10e3;  // 10 kB/s: the queue backs up
  plan->set_default(slow);
  HostOptions oa;
  oa.faults = plan;
  oa.session.max_send_queue = 1 << 20;
  auto a = make(oa), b = make();
  b->handle_message("m", [](const PeerInfo&, Payload) {});
  world_.start(a);
  world_.start(b);
  std::vector<std::uint8_t> body(64 << 10, 1);
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    std::promise<std::error_code> p;
    auto f = p.get_future();
    a->send(PeerRef::at(b->address()), "m", Bytes::copy_of(body),
            [&](std::error_code ec) { p.set_value(ec); });
    if (await(f, 10s) == errc::limit_reached) ++refused;
  }
  // ~1 MiB fits (16 messages + the one that crosses the mark); the rest is refused, not queued.
  EXPECT_GE(refused, 20);
  EXPECT_LE(refused, 24);
  EXPECT_EQ(call(a, PeerRef::at(b->address()), "any", "", 1s).error(),
            make_error_code(errc::limit_reached));
}

// Counts what arrives of a stream (on any thread) and reports its end.
class CountingSink : public StreamSink {
 public:
  void on_data(Chunk c) override { received += c.bytes().size(); }
  void on_end(std::error_code ec) override { end.set_value(ec); }
  std::atomic<std::uint64_t> received{0};
  std::promise<std::error_code> end;
};

TEST_P(SessionTest, ControlFramesDoNotWaitBehindBulkData) {
  // Both peers stream bulk data to each other over links limited to 20 MB/s each way. A request
  // and its response must not queue behind the stream data each side has ready: with the data
  // queue sized in bytes (8 MiB), they waited ~0.4 s each way here, ~0.8 s for the round trip.
  auto plan = std::make_shared<FaultPlan>(1);
  FaultConfig slow;
  slow.bandwidth_bytes_per_sec = 20e6;
  plan->set_default(slow);
  HostOptions o;
  o.faults = plan;
  auto a = make(o), b = make(o);
  add_echo(b);
  auto to_b = std::make_shared<CountingSink>(), to_a = std::make_shared<CountingSink>();
  a->accept_streams("bulk", [&](const PeerInfo&, IncomingStream&) { return to_a; });
  b->accept_streams("bulk", [&](const PeerInfo&, IncomingStream&) { return to_b; });
  world_.start(a);
  world_.start(b);
  ASSERT_TRUE(call(a, PeerRef::at(b->address()), "echo", "connect"));
  const std::uint64_t size = 16 << 20;  // 0.8 s each way
  std::promise<std::error_code> sent_a, sent_b;
  a->send_stream(PeerRef::node(b->id()), "bulk", Bytes(), std::make_shared<PatternSource>(size, 1),
                 [&](std::error_code ec) { sent_a.set_value(ec); });
  b->send_stream(PeerRef::node(a->id()), "bulk", Bytes(), std::make_shared<PatternSource>(size, 2),
                 [&](std::error_code ec) { sent_b.set_value(ec); });
  // Both directions busy (past the first megabytes, so both send queues are at their limit).
  ASSERT_TRUE(eventually(
      a->executor(), [&] { return to_a->received >= (2u << 20) && to_b->received >= (2u << 20); }));
  const auto t0 = Clock::now();
  auto r = call(a, PeerRef::node(b->id()), "echo", "through the bulk", 10s);
  const auto rtt = Clock::now() - t0;
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(*r, "through the bulk");
  // The streams were still going: the request really competed with them.
  EXPECT_LT(to_a->received.load(), size);
  EXPECT_LT(to_b->received.load(), size);
  // Behind the data queue it took ~800 ms. Sanitized builds run several times slower and share
  // the 2 cores with the other tests (ctest -j2; measured 298 ms under ASan with a 512 MB
  // stream test beside it): a looser bound there still tells the two apart.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr auto kBound = 450ms;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  constexpr auto kBound = 450ms;
#else
  constexpr auto kBound = 250ms;
#endif
#else
  constexpr auto kBound = 250ms;
#endif
  EXPECT_LT(rtt, kBound) << std::chrono::duration_cast<Duration>(rtt).count() << " ms";
  auto fa = sent_a.get_future(), fb = sent_b.get_future();
  EXPECT_EQ(await(fa, 30s), std::error_code());
  EXPECT_EQ(await(fb, 30s), std::error_code());
  EXPECT_EQ(to_a->received.load(), size);
  EXPECT_EQ(to_b->received.load(), size);
}

INSTANTIATE_TEST_SUITE_P(Links, SessionTest,
                         ::testing::Values(Kind::memory, Kind::tcp_inline, Kind::tcp_workers),
                         [](const auto& i) {
                           return i.param == Kind::memory       ? "memory"
                                  : i.param == Kind::tcp_inline ? "tcp_inline"
                                                                : "tcp_workers";
                         });

}  // namespace
}  // namespace grove::transport

namespace grove::transport {
namespace {

// DrainMeter against a simulated link that drains `rate` bytes per second while it holds data;
// every `step` the session tops the queue up to its limit (rate estimate x 10 ms) and marks
// whether it held data back.
double simulate(double rate, double min_rate, Duration step, int steps, bool held_back = true) {
  detail::DrainMeter m(min_rate, 1e12);
  Clock::time_point t{};
  std::uint64_t handed = 0;
  double gone = 0;  // bytes the link has sent
  auto queued = [&] { return handed - static_cast<std::uint64_t>(gone); };
  for (int i = 0; i < steps; ++i) {
    t += step;
    gone = std::min<double>(static_cast<double>(handed),
                            gone + rate * std::chrono::duration<double>(step).count());
    m.measure(t, handed, queued());
    const auto limit = static_cast<std::uint64_t>(std::max(16e3, m.rate() * 0.01));
    while (held_back && queued() < limit) handed += 16 << 10;
    m.mark(t, handed, queued(), held_back);
  }
  return m.rate();
}

TEST(DrainMeter, MeasuresABackloggedLink) {
  EXPECT_NEAR(simulate(10e6, 1e6, Duration(1), 200), 10e6, 0.05 * 10e6);
  EXPECT_NEAR(simulate(120e6, 1e6, Duration(3), 200), 120e6, 0.05 * 120e6);
  // A link slower than the minimum (or stalled) reads as the minimum.
  EXPECT_EQ(simulate(1e6, 25e6, Duration(1), 200), 25e6);
}

TEST(DrainMeter, DoublesWhileTheQueueRunsDry) {
  // Starting far too low: the queue empties between looks, so the estimate doubles until the
  // queue stays backlogged, and then measures the real rate.
  EXPECT_NEAR(simulate(500e6, 1e6, Duration(2), 200), 500e6, 0.05 * 500e6);
  detail::DrainMeter m(1e6, 4e6);  // ... but never beyond the maximum
  Clock::time_point t{};
  for (int i = 0; i < 10; ++i) {
    m.mark(t, 100'000 * i, 100'000, true);
    t += Duration(1);
    m.measure(t, 100'000 * i, 0);  // 100 kB gone in 1 ms: at least 100 MB/s
  }
  EXPECT_EQ(m.rate(), 4e6);
}

TEST(DrainMeter, ALateLookDoesNotGrowTheEstimate) {
  // A 10 MB/s link, measured; then the session looks again only after 50 ms (its strand was
  // busy) and finds the 100 kB it had queued gone: the link drains at least 2 MB/s, which says
  // nothing new. Doubling on it (as the meter once did, each time) let a 12.5 MB/s link's queue
  // grow to 4 MB, the credit and confirmations of the streams coming the other way waited
  // 0.3 s behind it, and a 400 MB exchange took 1.2-1.5 x its bound instead of 1.05 x.
  detail::DrainMeter m(1e6, 1e12);
  Clock::time_point t{};
  std::uint64_t handed = 0;
  for (int i = 0; i < 100; ++i) {  // backlogged: 100 kB queued, 10 kB leave a millisecond
    m.mark(t, handed += 10'000, 100'000, true);
    t += Duration(1);
    m.measure(t, handed, 90'000);
  }
  ASSERT_NEAR(m.rate(), 10e6, 0.05 * 10e6);
  for (int i = 0; i < 20; ++i) {
    m.mark(t, handed, 100'000, true);
    t += Duration(50);
    m.measure(t, handed, 0);
    handed += 100'000;
  }
  EXPECT_NEAR(m.rate(), 10e6, 0.05 * 10e6);
}

TEST(DrainMeter, AQueueThatGrowsWithoutASendIsNotReadAsDrained) {
  // FaultyLink hands a delayed frame to the link below it, whose queue counts too: the count
  // grows between two looks without a send. Read as bytes drained, it wrapped around to 2^64
  // and the estimate doubled at every look.
  detail::DrainMeter m(1e6, 1e12);
  Clock::time_point t{};
  for (int i = 0; i < 50; ++i) {
    m.mark(t, 1'000'000, 100'000, true);
    t += Duration(1);
    m.measure(t, 1'000'000, 164'000);
  }
  EXPECT_EQ(m.rate(), 1e6);
}

TEST(DrainMeter, MeasuresALinkThatStaysBusyWhileTheSessionHasNothingMore) {
  // The estimate once came only from intervals in which the session held data back: a queue
  // grown too long (the session's streams then wait for credit behind it, and hold nothing
  // back) was never measured again. A queue that holds data at both looks was drained at
  // the link's rate, whatever the session had left to give.
  detail::DrainMeter m(1e6, 1e12);
  Clock::time_point t{};
  for (int i = 0; i < 40; ++i) {  // a backlogged 100 MB/s link
    m.mark(t, 100'000 * (i + 1), 1'000'000, true);
    t += Duration(1);
    m.measure(t, 100'000 * (i + 1), 900'000);
  }
  m.mark(t, 0, 0, false);  // (an interval with nothing queued: ignored)
  t += Duration(5);
  m.measure(t, 0, 0);
  ASSERT_NEAR(m.rate(), 100e6, 0.05 * 100e6);
  // Then it drains at 10 MB/s: 10 kB a millisecond from an 8 MB queue the session no longer
  // adds to.
  std::uint64_t queued = 8'000'000;
  for (int i = 0; i < 40; ++i) {
    m.mark(t, 8'000'000, queued, false);
    t += Duration(1);
    queued -= 10'000;
    m.measure(t, 8'000'000, queued);
  }
  EXPECT_NEAR(m.rate(), 10e6, 0.05 * 10e6);
}

TEST(DrainMeter, IgnoresIntervalsWhenNothingWasHeldBack) {
  // A link that is given little drains little: no conclusion is drawn.
  EXPECT_EQ(simulate(100e6, 2e6, Duration(1), 100, /*held_back=*/false), 2e6);
}

}  // namespace
}  // namespace grove::transport
