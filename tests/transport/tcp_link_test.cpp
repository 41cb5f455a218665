// The secure channel under attack: a raw TCP client (our own sans-IO handshake over a blocking
// socket) sends garbage, tampered, replayed, reordered, truncated and oversized records, or
// dawdles; the host must close that connection, log it, and keep serving everyone else.
#include "transport/tcp_link.hpp"

#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "test_util.hpp"

namespace grove::transport {
namespace {
using namespace test;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class RawClient {
 public:
  explicit RawClient(const std::string& address) {
    std::string host;
    std::uint16_t port;
    EXPECT_TRUE(split_host_port(address, host, port));
    sock_.connect(tcp::endpoint(asio::ip::make_address(host), port));
  }

  void write(std::span<const std::uint8_t> b) {
    boost::system::error_code ec;
    asio::write(sock_, asio::buffer(b.data(), b.size()), ec);
  }

  /// Runs the real handshake as initiator; afterwards seal()/open_next() work.
  bool handshake(const Identity& me, std::optional<SwarmKey> key) {
    Handshake hs(Handshake::Role::initiator, {&me, key, std::nullopt, 0});
    send_hs(hs.start());
    auto m2 = recv_hs();
    if (!m2) return false;
    auto step = hs.on_message(*m2);
    if (!step) return false;
    send_hs(step->reply);
    tx_ = CipherState(hs.keys().suite, hs.keys().tx);
    rx_ = CipherState(hs.keys().suite, hs.keys().rx);
    return true;
  }

  void shutdown_send() {
    boost::system::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
  }

  /// A sealed record for a frame (advances the send counter).
  std::vector<std::uint8_t> seal(Frame f) {
    auto all = f.buf.span();
    const std::size_t len = all.size() - kRecordHeader;
    all[0] = std::uint8_t(len >> 24), all[1] = std::uint8_t(len >> 16);
    all[2] = std::uint8_t(len >> 8), all[3] = std::uint8_t(len);
    tx_.seal(all.subspan(kRecordHeader, all.size() - kRecordOverhead), all.first(kRecordHeader),
             all.data() + all.size() - kTagSize);
    return {all.begin(), all.end()};
  }

  std::vector<std::uint8_t> request_record(std::uint64_t id) {
    return seal(encode_frame({FrameType::request, id, 5000, "echo"}, as_bytes("ping")));
  }

  /// Reads one record and decrypts it; nullopt on EOF/error/timeout.
  std::optional<DecodedFrame> read_frame(Duration limit = Duration(5000)) {
    std::array<std::uint8_t, 4> h{};
    if (!read_exact(h.data(), 4, limit)) return std::nullopt;
    const std::size_t len = (std::size_t(h[0]) << 24) | (h[1] << 16) | (h[2] << 8) | h[3];
    Frame f{Bytes(4 + len)};
    std::memcpy(f.buf.data(), h.data(), 4);
    if (!read_exact(f.buf.data() + 4, len, limit)) return std::nullopt;
    auto all = f.buf.span();
    if (!rx_.open(all.subspan(4, all.size() - kRecordOverhead), all.first(4),
                  all.data() + all.size() - kTagSize))
      return std::nullopt;
    auto d = decode_frame(f);
    if (!d) return std::nullopt;
    return *d;
  }

  /// True if the server closes the connection within `limit` (reads and discards meanwhile).
  bool closed_within(Duration limit) {
    std::array<std::uint8_t, 4096> junk;
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      auto left = std::chrono::duration_cast<Duration>(end - Clock::now());
      bool eof = false;
      if (peer_closed_) return true;
      if (!read_some(junk.data(), junk.size(), left, &eof)) return eof;
    }
    return false;
  }

 private:
  void send_hs(const std::vector<std::uint8_t>& m) {
    std::vector<std::uint8_t> b{std::uint8_t(m.size() >> 8), std::uint8_t(m.size())};
    b.insert(b.end(), m.begin(), m.end());
    write(b);
  }
  std::optional<std::vector<std::uint8_t>> recv_hs() {
    std::uint8_t l[2];
    if (!read_exact(l, 2, Duration(5000))) return std::nullopt;
    std::vector<std::uint8_t> m((l[0] << 8) | l[1]);
    if (!read_exact(m.data(), m.size(), Duration(5000))) return std::nullopt;
    return m;
  }
  bool read_exact(std::uint8_t* p, std::size_t n, Duration limit) {
    bool ok = false, done = false;
    asio::async_read(sock_, asio::buffer(p, n), [&](boost::system::error_code ec, std::size_t) {
      ok = !ec;
      // Any error but our own cancellation means the server closed (EOF or reset).
      peer_closed_ = peer_closed_ || (ec && ec != asio::error::operation_aborted);
      done = true;
    });
    return drive(limit, done) && ok;
  }
  bool read_some(std::uint8_t* p, std::size_t n, Duration limit, bool* eof) {
    bool ok = false, done = false;
    sock_.async_read_some(asio::buffer(p, n), [&](boost::system::error_code ec, std::size_t) {
      ok = !ec;
      *eof = ec && ec != asio::error::operation_aborted;
      peer_closed_ = peer_closed_ || *eof;
      done = true;
    });
    return drive(limit, done) && ok;
  }
  bool drive(Duration limit, bool& done) {
    io_.restart();
    io_.run_for(limit);
    if (!done) {
      sock_.cancel();
      io_.restart();
      io_.run();
      return false;
    }
    return true;
  }

  asio::io_context io_;
  tcp::socket sock_{io_};
  CipherState tx_, rx_;
  bool peer_closed_ = false;
};

class TcpAttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = SwarmKey::generate();
    HostOptions o;
    o.swarm_key = key_;
    o.handshake_timeout = Duration(1500);
    o.max_half_open = 3;
    server_ = world_.host(o);
    add_echo(server_);
    world_.start(server_);
  }
  /// The server still serves a well-behaved client.
  void expect_healthy() {
    HostOptions o;
    o.swarm_key = key_;
    o.listen = "";
    auto c = world_.host(o);
    auto r = call(c, PeerRef::at(server_->address()), "echo", "still here");
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, "still here");
  }
  World world_;
  SwarmKey key_;
  std::shared_ptr<Host> server_;
  Identity me_ = Identity::generate();
};

TEST_F(TcpAttackTest, ValidRawClientGetsAnswers) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  c.write(c.request_record(1));
  auto f = c.read_frame();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->header.type, FrameType::response);
  EXPECT_EQ(f->header.id, 1u);
}

TEST_F(TcpAttackTest, WrongSwarmKeyCannotConnect) {
  RawClient c(server_->address());
  EXPECT_FALSE(c.handshake(me_, SwarmKey::generate()));
  EXPECT_TRUE(c.closed_within(Duration(3000)));
  // Nor can a host without the key, nor one with another key.
  for (auto k : {std::optional<SwarmKey>(), std::optional<SwarmKey>(SwarmKey::generate())}) {
    HostOptions o;
    o.swarm_key = k;
    o.listen = "";
    auto h = world_.host(o);
    EXPECT_FALSE(call(h, PeerRef::at(server_->address()), "echo", "x"));
  }
  expect_healthy();
}

TEST_F(TcpAttackTest, RandomGarbageIsDropped) {
  RawClient c(server_->address());
  std::vector<std::uint8_t> junk(2000);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = std::uint8_t(i * 131 + 7);
  c.write(junk);
  EXPECT_TRUE(c.closed_within(Duration(3000)));
  expect_healthy();
}

TEST_F(TcpAttackTest, TamperedFrameClosesConnection) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  auto rec = c.request_record(1);
  rec[rec.size() / 2] ^= 0x40;
  c.write(rec);
  EXPECT_TRUE(c.closed_within(Duration(3000)));
  expect_healthy();
}

TEST_F(TcpAttackTest, TamperedLengthPrefixClosesConnection) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  auto rec = c.request_record(1);
  rec[3] -= 1;  // one byte shorter: tag and AD mismatch
  c.write(rec);
  EXPECT_TRUE(c.closed_within(Duration(3000)));
}

TEST_F(TcpAttackTest, ReplayedFrameClosesConnection) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  auto rec = c.request_record(1);
  c.write(rec);
  auto f = c.read_frame();
  ASSERT_TRUE(f);  // the original is answered
  c.write(rec);    // the replay is not
  EXPECT_TRUE(c.closed_within(Duration(3000)));
}

TEST_F(TcpAttackTest, ReorderedFramesCloseConnection) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  auto r1 = c.request_record(1);
  auto r2 = c.request_record(2);
  c.write(r2);
  c.write(r1);
  EXPECT_FALSE(c.read_frame(Duration(2000)));  // no answer to either
  EXPECT_TRUE(c.closed_within(Duration(3000)));
}

TEST_F(TcpAttackTest, TruncatedFrameClosesConnection) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  auto rec = c.request_record(1);
  c.write(std::span<const std::uint8_t>(rec).first(rec.size() - 5));  // 5 bytes short
  EXPECT_FALSE(c.read_frame(Duration(300)));  // incomplete: nothing is answered
  ASSERT_TRUE(eventually(server_->executor(), [&] { return server_->stats().sessions == 1; }));
  c.shutdown_send();  // EOF in the middle of the record
  EXPECT_TRUE(c.closed_within(Duration(3000)));
  EXPECT_TRUE(eventually(server_->executor(), [&] { return server_->stats().sessions == 0; }));
  expect_healthy();
}

TEST_F(TcpAttackTest, OversizeFrameIsRejectedBeforeAllocation) {
  RawClient c(server_->address());
  ASSERT_TRUE(c.handshake(me_, key_));
  std::vector<std::uint8_t> hdr = {0x40, 0x00, 0x00, 0x00};  // 1 GiB announced
  c.write(hdr);
  EXPECT_TRUE(c.closed_within(Duration(3000)));
  expect_healthy();
}

TEST_F(TcpAttackTest, OneBytePerIntervalPeerIsCutAtHandshakeDeadline) {
  RawClient c(server_->address());
  // Dribble a valid-looking M1 one byte at a time; the whole handshake has 1.5 s.
  Handshake hs(Handshake::Role::initiator, {&me_, key_, std::nullopt, 0});
  auto m1 = hs.start();
  std::vector<std::uint8_t> framed{0, std::uint8_t(m1.size())};
  framed.insert(framed.end(), m1.begin(), m1.end());
  const auto t0 = Clock::now();
  bool closed = false;
  for (std::size_t i = 0; i < framed.size() && !closed; ++i) {
    c.write({&framed[i], 1});
    closed = c.closed_within(Duration(250));  // also paces the bytes: one per 250 ms
  }
  EXPECT_TRUE(closed);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, Duration(1400));
  EXPECT_LT(took, Duration(4000));
  expect_healthy();
}

TEST(TcpSlowFrame, FrameBodyDribbledAfterHandshakeIsCut) {
  World w;
  HostOptions o;
  o.link.min_frame_time = Duration(800);  // a frame must complete within 0.8 s + size / rate
  auto server = w.host(o);
  add_echo(server);
  w.start(server);
  auto me = Identity::generate();
  RawClient c(server->address());
  ASSERT_TRUE(c.handshake(me, std::nullopt));
  auto rec = c.request_record(1);
  const auto t0 = Clock::now();
  bool closed = false;
  for (std::size_t i = 0; i < rec.size() && !closed; ++i) {
    c.write({&rec[i], 1});
    closed = c.closed_within(Duration(200));  // paces the bytes: one per 200 ms
  }
  EXPECT_TRUE(closed);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, Duration(700));
  EXPECT_LT(took, Duration(3000));
}

TEST_F(TcpAttackTest, HalfOpenLimitRefusesExtraHandshakes) {
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<RawClient>(server_->address()));
  ASSERT_TRUE(eventually(server_->executor(), [&] { return server_->stats().half_open == 3; }));
  RawClient extra(server_->address());
  // Refused at once, long before the 1.5 s handshake deadline.
  const auto t0 = Clock::now();
  EXPECT_TRUE(extra.closed_within(Duration(1000)));
  EXPECT_LT(Clock::now() - t0, Duration(1000));
  // The idle ones are cut at the handshake deadline, after which service resumes.
  for (auto& c : idle) EXPECT_TRUE(c->closed_within(Duration(4000)));
  expect_healthy();
}

}  // namespace
}  // namespace grove::transport
