// transport_bench: encrypted bulk throughput of the secure transport between two processes on
// loopback, printed next to raw (unencrypted) loopback TCP and the AEAD's single-core speed, all
// measured in the same run and reported as ratios. Target: encrypted stream >= 0.75x the
// single-core AES-256-GCM encryption speed.
//
//   transport_bench [--bytes N] [--reps N] [--chunk BYTES] [--window BYTES] [--workers N]
//                   [--csv FILE]
//
// Sizes accept K/M/G suffixes (binary). The measurements of one repetition run back to back
// (AEAD, raw TCP, encrypted stream) so that a noisy machine affects them alike; each row
// reports the median over --reps. Exits 0 whether or not the target is met (it is a
// measurement); exits non-zero only if something failed (a stream did not complete).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "bench/bench_common.hpp"

namespace {

using namespace grove::transport;
using grove::bench::Duration;
using grove::bench::HostThread;
using grove::bench::median;
using grove::bench::Pipe;
using grove::bench::seconds_between;

constexpr std::size_t kMiB = 1u << 20;
constexpr double kTarget = 0.75;

/// CPU time (user + system, all threads) of this process.
double self_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// CPU time (user + system) of another live process from /proc/<pid>/stat (clock-tick resolution).
double proc_cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto rp = line.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream is(line.substr(rp + 1));
  std::string skip;
  for (int field = 3; field <= 13; ++field) is >> skip;  // state .. cmajflt
  unsigned long long ut = 0, st = 0;
  is >> ut >> st;
  return static_cast<double>(ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double rusage_seconds(const rusage& ru) {
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

/// One transfer: throughput and the CPU both ends spent on it.
struct Transfer {
  double gbps = 0;
  double seconds = 0;
  double sender_cpu = 0, receiver_cpu = 0;  // CPU seconds
};

struct Options {
  std::uint64_t bytes = 2ull << 30;
  int reps = 3;
  std::size_t chunk = SessionOptions{}.stream_chunk;
  std::size_t window = SessionOptions{}.stream_window;
  std::size_t workers = 2;
  bool inline_crypto = LinkLimits{}.inline_crypto;  // the transport's default for this machine
  std::string csv;
};

Options parse_args(int argc, char** argv) {
  grove::bench::Args args(
      argc, argv,
      "[--bytes N] [--reps N] [--chunk BYTES] [--window BYTES] [--workers N] [--csv FILE]",
      "  --bytes    bytes per encrypted stream and per raw TCP transfer (default 2G)\n"
      "  --reps     repetitions; each row reports the median (default 3)\n"
      "  --chunk    stream chunk (payload bytes per frame, default 1M)\n"
      "  --window   stream flow-control window (default 8M)\n"
      "  --workers  transport worker pool threads per process (default 2)\n"
      "  --crypto   inline|workers: where records are sealed/opened (default: the\n"
      "             transport's choice for this machine, inline with <= 2 hw threads)\n"
      "  --csv      also write every measurement to FILE\n"
      "sizes accept K, M, G suffixes (binary)\n");
  Options o;
  while (args.next()) {
    if (args.is("--bytes")) {
      o.bytes = args.size(1);
    } else if (args.is("--reps")) {
      o.reps = static_cast<int>(std::min<std::uint64_t>(args.size(1), 1000));
    } else if (args.is("--crypto")) {
      o.inline_crypto = args.choice({"inline", "workers"}) == "inline";
    } else if (args.is("--csv")) {
      o.csv = args.value();
    } else if (!grove::bench::read_stream_option(args, o.chunk, o.window, o.workers)) {
      args.unknown();
    }
  }
  if (o.window < o.chunk) args.fail("--window must be at least --chunk");
  return o;
}

HostOptions host_options(const Options& o, const SwarmKey& key, std::string listen) {
  HostOptions h;
  h.listen = std::move(listen);
  h.swarm_key = key;
  h.session.stream_chunk = o.chunk;
  h.session.stream_window = o.window;
  h.link.max_frame = std::max<std::size_t>(h.link.max_frame, o.chunk + 4096);
  h.link.inline_crypto = o.inline_crypto;
  return h;
}

// --- AEAD single-core speed ---------------------------------------------------------------------

/// In-place CipherState::seal of a 1 MiB buffer, repeated for ~0.4 s on this thread.
double aead_seal_gbps(Suite suite) {
  Key key;
  randombytes_buf(key.data(), key.size());
  CipherState cs(suite, key);
  std::vector<std::uint8_t> buf(kMiB);
  randombytes_buf(buf.data(), buf.size());
  std::uint8_t ad[4] = {0, 0x10, 0, 0x14};
  std::uint8_t tag[kTagSize];
  for (int i = 0; i < 8; ++i) cs.seal(buf, ad, tag);  // warm up
  const auto t0 = Clock::now();
  std::uint64_t n = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 16; ++i) cs.seal(buf, ad, tag);
    n += 16;
    elapsed = seconds_between(t0, Clock::now());
  } while (elapsed < 0.4);
  return static_cast<double>(n * kMiB) / elapsed / 1e9;
}

/// In-place CipherState::open of 1 MiB records sealed just before (only the opens are timed).
double aead_open_gbps(Suite suite) {
  Key key;
  randombytes_buf(key.data(), key.size());
  CipherState tx(suite, key), rx(suite, key);
  std::vector<std::uint8_t> buf(kMiB);
  randombytes_buf(buf.data(), buf.size());
  std::uint8_t ad[4] = {0, 0x10, 0, 0x14};
  std::uint8_t tag[kTagSize];
  double opened = 0, wall = 0;
  std::uint64_t n = 0;
  const auto start = Clock::now();
  while (wall < 0.8) {
    tx.seal(buf, ad, tag);
    const auto t0 = Clock::now();
    if (!rx.open(buf, ad, tag)) {
      std::fprintf(stderr, "CipherState::open failed in the AEAD benchmark\n");
      std::exit(2);
    }
    const auto t1 = Clock::now();
    if (n++ >= 8) opened += seconds_between(t0, t1);  // the first few are warm-up
    wall = seconds_between(start, t1);
  }
  return static_cast<double>((n - 8) * kMiB) / opened / 1e9;
}

// --- raw loopback TCP
// -----------------------------------------------------------------------------

bool send_all(int fd, const std::uint8_t* p, std::size_t n) {
  while (n) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool recv_all(int fd, std::uint8_t* p, std::size_t n) {
  while (n) {
    const ssize_t k = ::read(fd, p, n);
    if (k == 0) return false;
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

/// Parent writes `bytes` in 1 MiB writes to a forked child that reads and discards them; the
/// child acknowledges EOF with one byte, so the time covers delivery of every byte.
/// With `naive_aead`, the reference point the issue names: one thread per side, the sender
/// copies each 1 MiB into a record, seals it (AES-256-GCM, counter nonce) and writes it; the
/// receiver reads the record and opens it. No pipelining between crypto and the socket.
std::optional<Transfer> raw_tcp(std::uint64_t bytes, const std::uint8_t* src,
                                std::uint8_t* child_buf, bool naive_aead = false) {
  grove::transport::Key key{};
  key[0] = 42;
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(lfd, 1) != 0 || ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
    std::perror("raw tcp: listen");
    return std::nullopt;
  }
  std::fflush(nullptr);
  const pid_t pid = grove::bench::fork_bound_child();
  if (pid < 0) {
    std::perror("fork");
    return std::nullopt;
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls (the parent may have threads), into a buffer
    // allocated before fork().
    const int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) ::_exit(3);
    if (naive_aead) {
      grove::transport::CipherState rx(Suite::aes256gcm, key);
      for (std::uint64_t got = 0; got < bytes;) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kMiB, bytes - got));
        if (!recv_all(c, child_buf, 4 + n + 16)) ::_exit(4);
        if (!rx.open({child_buf + 4, n}, {child_buf, 4}, child_buf + 4 + n)) ::_exit(6);
        got += n;
      }
      std::uint8_t eof;
      if (::read(c, &eof, 1) != 0) ::_exit(7);
    } else {
      for (;;) {
        const ssize_t k = ::read(c, child_buf, kMiB);
        if (k == 0) break;
        if (k < 0 && errno != EINTR) ::_exit(4);
      }
    }
    const char ack = 'k';
    if (::write(c, &ack, 1) != 1) ::_exit(5);
    ::_exit(0);
  }
  ::close(lfd);
  std::optional<Transfer> result;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as TcpLink does
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const double c0 = self_cpu_seconds();
    const auto t0 = Clock::now();
    bool ok = true;
    grove::transport::CipherState tx(Suite::aes256gcm, key);
    std::vector<std::uint8_t> rec(naive_aead ? 4 + kMiB + 16 : 0);
    for (std::uint64_t sent = 0; ok && sent < bytes;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kMiB, bytes - sent));
      if (naive_aead) {
        const std::uint32_t len = static_cast<std::uint32_t>(n + 16);
        rec[0] = std::uint8_t(len >> 24), rec[1] = std::uint8_t(len >> 16);
        rec[2] = std::uint8_t(len >> 8), rec[3] = std::uint8_t(len);
        std::memcpy(rec.data() + 4, src, n);
        tx.seal({rec.data() + 4, n}, {rec.data(), 4}, rec.data() + 4 + n);
        ok = send_all(fd, rec.data(), 4 + n + 16);
      } else {
        ok = send_all(fd, src, n);
      }
      sent += n;
    }
    char ack = 0;
    ok = ok && ::shutdown(fd, SHUT_WR) == 0 && ::read(fd, &ack, 1) == 1 && ack == 'k';
    const auto t1 = Clock::now();
    const double c1 = self_cpu_seconds();
    if (ok) {
      Transfer t;
      t.seconds = seconds_between(t0, t1);
      t.gbps = static_cast<double>(bytes) / t.seconds / 1e9;
      t.sender_cpu = c1 - c0;  // the other threads of this process are idle meanwhile
      result = t;
    }
  }
  if (fd >= 0) ::close(fd);
  if (!result) ::kill(pid, SIGKILL);
  int st = 0;
  rusage ru{};
  pid_t w;
  while ((w = ::wait4(pid, &st, 0, &ru)) < 0 && errno == EINTR) {
  }
  const int rc = (w == pid && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  if (rc != 0) result.reset();
  if (result) result->receiver_cpu = rusage_seconds(ru);  // the child did nothing else
  if (!result) std::fprintf(stderr, "raw tcp transfer failed (child status %d)\n", rc);
  return result;
}

// --- encrypted stream
// -----------------------------------------------------------------------------

/// Serves `bytes` from a pre-filled buffer (wrapping around), copying with memcpy; or, with
/// touch = false, leaves the frame's payload as it is (measures the transport without the copy).
class BufferSource final : public StreamSource {
 public:
  BufferSource(const std::vector<std::uint8_t>& buf, std::uint64_t total, bool touch)
      : buf_(buf), total_(total), touch_(touch) {}
  std::uint64_t size() const override { return total_; }
  Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) override {
    if (!touch_) return {};
    std::size_t pos = static_cast<std::size_t>(offset % buf_.size());
    std::size_t done = 0;
    while (done < out.size()) {
      const std::size_t n = std::min(out.size() - done, buf_.size() - pos);
      std::memcpy(out.data() + done, buf_.data() + pos, n);
      done += n;
      pos = 0;
    }
    return {};
  }

 private:
  const std::vector<std::uint8_t>& buf_;
  std::uint64_t total_;
  bool touch_;
};

/// Drops every chunk (destroying it returns its credit at once).
class DropSink final : public StreamSink {
 public:
  explicit DropSink(std::shared_ptr<std::atomic<int>> failures) : failures_(std::move(failures)) {}
  void on_data(Chunk c) override { received_ += c.bytes().size(); }
  void on_end(std::error_code ec) override {
    if (ec) {
      ++*failures_;
      std::fprintf(stderr, "[receiver] stream ended with error after %llu bytes: %s\n",
                   static_cast<unsigned long long>(received_), ec.message().c_str());
    }
  }

 private:
  std::shared_ptr<std::atomic<int>> failures_;
  std::uint64_t received_ = 0;
};

/// The receiving process: a Host accepting "bench" streams. Reports its address on addr_w,
/// exits when ctl_r reaches EOF (the parent is done or died).
[[noreturn]] void receiver_main(const Options& o, const SwarmKey& key, int addr_w, int ctl_r) {
  int rc = 0;
  try {
    auto failures = std::make_shared<std::atomic<int>>(0);
    HostThread h;
    auto& host = h.create(Identity::generate(), host_options(o, key, "127.0.0.1:0"));
    host.accept_streams("bench", [failures](const PeerInfo&, IncomingStream& in) {
      return in.kind == "bench" ? std::make_shared<DropSink>(failures) : nullptr;
    });
    host.start();
    h.run();
    grove::bench::write_all(addr_w, host.address() + "\n");
    Pipe::close_fd(addr_w);
    grove::bench::wait_for_eof(ctl_r);
    h.stop(Duration(5000));
    if (*failures) rc = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[receiver] error: %s\n", e.what());
    rc = 2;
  }
  std::fflush(nullptr);
  ::_exit(rc);
}

struct StreamResult {
  std::error_code ec;
  double seconds = 0;
  double sender_cpu = 0, receiver_cpu = 0;
};

/// send_stream -> done(ok); nullopt if it did not finish within the timeout (a hang).
std::optional<StreamResult> stream_once(Host& host, const PeerRef& to,
                                        std::shared_ptr<StreamSource> src, Duration timeout,
                                        pid_t receiver) {
  auto p = std::make_shared<std::promise<StreamResult>>();
  auto f = p->get_future();
  const double s0 = self_cpu_seconds(), r0 = proc_cpu_seconds(receiver);
  const auto t0 = Clock::now();
  host.send_stream(to, "bench", Bytes{}, std::move(src), [p, t0](std::error_code ec) {
    p->set_value({ec, seconds_between(t0, Clock::now())});
  });
  auto r = grove::bench::wait_value(f, timeout);
  if (r) {
    r->sender_cpu = self_cpu_seconds() - s0;
    r->receiver_cpu = proc_cpu_seconds(receiver) - r0;
  }
  return r;
}

// --- report --------------------------------------------------------------------------------------

struct Row {
  Row(std::string k, std::string l) : key(std::move(k)), label(std::move(l)) {}
  std::string key, label;
  std::vector<double> gbps;
  std::vector<double> sender_cores, receiver_cores, ns_per_byte;  // transfers only
  void add(const Transfer& t, std::uint64_t bytes) {
    gbps.push_back(t.gbps);
    sender_cores.push_back(t.sender_cpu / t.seconds);
    receiver_cores.push_back(t.receiver_cpu / t.seconds);
    ns_per_byte.push_back((t.sender_cpu + t.receiver_cpu) * 1e9 / static_cast<double>(bytes));
  }
};

void print_row(const Row& r) {
  std::printf("  %-44s", r.label.c_str());
  for (double v : r.gbps) std::printf(" %7.3f", v);
  std::printf("   %7.3f\n", median(r.gbps));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  configure_worker_pool(o.workers);
  ensure_sodium();
  const bool have_aes = crypto_aead_aes256gcm_is_available() != 0;
  const SwarmKey key = SwarmKey::generate();

  // The receiving process for the encrypted streams, forked before this process has threads.
  Pipe addr_pipe = Pipe::make(), ctl_pipe = Pipe::make();
  std::fflush(nullptr);
  const pid_t rx_pid = grove::bench::fork_bound_child();
  if (rx_pid < 0) {
    std::perror("fork");
    return 2;
  }
  if (rx_pid == 0) {
    Pipe::close_fd(addr_pipe.r);
    Pipe::close_fd(ctl_pipe.w);
    receiver_main(o, key, addr_pipe.w, ctl_pipe.r);
  }
  Pipe::close_fd(addr_pipe.w);
  Pipe::close_fd(ctl_pipe.r);
  auto fail = [&](const char* what) {
    std::fprintf(stderr, "transport_bench: %s\n", what);
    std::fflush(nullptr);
    Pipe::close_fd(ctl_pipe.w);
    grove::bench::reap_child(rx_pid, true);
    ::_exit(3);  // the sending host may be wedged: do not run its destructors
  };

  // Source data: 256 MiB of random bytes, larger than any cache, so the memcpy reads memory.
  std::vector<std::uint8_t> src(std::min<std::uint64_t>(256 * kMiB, std::max(o.bytes, kMiB)));
  randombytes_buf(src.data(), src.size());
  std::vector<std::uint8_t> child_buf(kMiB + 64, 0);  // room for a naive record

  const auto addr = grove::bench::read_line(addr_pipe.r, Duration(30000));
  Pipe::close_fd(addr_pipe.r);
  if (!addr) fail("the receiving process did not report its address");

  HostThread h;
  Host& host = h.create(Identity::generate(), host_options(o, key, ""));
  h.run();
  auto cp = std::make_shared<std::promise<Result<PeerInfo>>>();
  auto cf = cp->get_future();
  host.connect(PeerRef::at(*addr), [cp](Result<PeerInfo> r) { cp->set_value(std::move(r)); });
  const auto conn = grove::bench::wait_value(cf, Duration(30000));
  if (!conn) fail("connecting to the receiving process timed out (hang)");
  if (!*conn) {
    std::fprintf(stderr, "transport_bench: connect failed: %s\n", conn->error().message().c_str());
    fail("cannot connect");
  }
  const PeerInfo peer = conn->value();
  const PeerRef to = PeerRef::node(peer.id, *addr);
  const SessionOptions so = host_options(o, key, "").session;

  std::printf("grove transport_bench: two processes on loopback, %s per transfer, %d rep%s\n",
              grove::bench::human_bytes(o.bytes).c_str(), o.reps, o.reps == 1 ? "" : "s");
  std::printf(
      "  negotiated suite %s (AES-NI %s), swarm key on, chunk %s, window %s, "
      "send high-water %s, crypto %s, workers %zu per process\n",
      peer.suite.c_str(), have_aes ? "available" : "NOT available",
      grove::bench::human_bytes(o.chunk).c_str(), grove::bench::human_bytes(o.window).c_str(),
      grove::bench::human_bytes(so.send_high_water).c_str(),
      o.inline_crypto ? "inline on the network thread" : "on worker threads", o.workers);
  double load_start[3] = {0, 0, 0};
  ::getloadavg(load_start, 3);
  std::printf("  sender %s -> receiver %s at %s\n\n", short_id(host.id()).c_str(),
              short_id(peer.id).c_str(), addr->c_str());
  std::fflush(stdout);

  Row aes{"aead_aes256gcm_seal", "AEAD AES-256-GCM seal, 1 core, 1 MiB"};
  Row aes_open{"aead_aes256gcm_open", "AEAD AES-256-GCM open, 1 core (info)"};
  Row xchacha{"aead_xchacha20poly1305_seal", "AEAD XChaCha20-Poly1305 seal, 1 core (info)"};
  Row raw{"raw_tcp", "raw loopback TCP, 2 processes, 1 MiB writes"};
  Row naive{"naive_seal_then_write", "naive AES-GCM seal-then-write loop, 1 thread/side"};
  Row enc{"encrypted_stream", "encrypted stream, memcpy source"};
  Row enc_nt{"encrypted_stream_notouch", "encrypted stream, no-copy source (info)"};

  const auto stream_timeout =
      Duration(30000) + Duration(static_cast<std::int64_t>(o.bytes / 20'000'000 * 1000));
  auto source = std::make_shared<BufferSource>(src, o.bytes, true);
  auto source_nt = std::make_shared<BufferSource>(src, o.bytes, false);
  auto run_stream = [&](Row& row, std::shared_ptr<StreamSource> s) {
    auto r = stream_once(host, to, std::move(s), stream_timeout, rx_pid);
    if (!r) {
      std::fprintf(stderr,
                   "transport_bench: HANG: %s of %s did not complete within %lld ms "
                   "(send_stream never called done)\n",
                   row.label.c_str(), grove::bench::human_bytes(o.bytes).c_str(),
                   static_cast<long long>(stream_timeout.count()));
      fail("stream hang");
    }
    if (r->ec) {
      std::fprintf(stderr, "transport_bench: %s failed: %s\n", row.label.c_str(),
                   r->ec.message().c_str());
      fail("stream failed");
    }
    row.add({static_cast<double>(o.bytes) / r->seconds / 1e9, r->seconds, r->sender_cpu,
             r->receiver_cpu},
            o.bytes);
  };

  for (int rep = 0; rep < o.reps; ++rep) {
    if (have_aes) {
      aes.gbps.push_back(aead_seal_gbps(Suite::aes256gcm));
      aes_open.gbps.push_back(aead_open_gbps(Suite::aes256gcm));
    }
    xchacha.gbps.push_back(aead_seal_gbps(Suite::xchacha20poly1305));
    auto r = raw_tcp(o.bytes, src.data(), child_buf.data());
    if (!r) fail("raw TCP measurement failed");
    raw.add(*r, o.bytes);
    if (have_aes) {
      auto nv = raw_tcp(o.bytes, src.data(), child_buf.data(), /*naive_aead=*/true);
      if (!nv) fail("naive seal-then-write measurement failed");
      naive.add(*nv, o.bytes);
    }
    run_stream(enc, source);
    run_stream(enc_nt, source_nt);
    std::fprintf(stderr, "  rep %d/%d done\n", rep + 1, o.reps);
  }

  std::printf("  %-44s", "GB/s (1 GB = 1e9 bytes)");
  for (int rep = 0; rep < o.reps; ++rep) std::printf("   rep%-2d", rep + 1);
  std::printf("    median\n");
  std::vector<const Row*> rows;
  if (have_aes) rows.insert(rows.end(), {&aes, &aes_open});
  rows.insert(rows.end(), {&xchacha, &raw});
  if (have_aes) rows.push_back(&naive);
  rows.insert(rows.end(), {&enc, &enc_nt});
  for (const Row* r : rows) print_row(*r);

  const double m_enc = median(enc.gbps), m_raw = median(raw.gbps);
  const double m_aead = have_aes ? median(aes.gbps) : median(xchacha.gbps);
  const double r_aead = m_enc / m_aead, r_raw = m_enc / m_raw;
  const bool pass = r_aead >= kTarget;
  std::printf("\n  ratios (of medians)\n");
  std::printf("  %-44s %7.3f   target >= %.2f  %s\n",
              have_aes ? "encrypted / aead_aes" : "encrypted / aead_xchacha (no AES-NI)", r_aead,
              kTarget, pass ? "PASS" : "BELOW");
  std::printf("  %-44s %7.3f\n", "encrypted / raw_tcp", r_raw);
  std::printf("  %-44s %7.3f\n", "encrypted no-copy / aead (info)", median(enc_nt.gbps) / m_aead);
  if (have_aes) {
    std::printf("  %-44s %7.3f\n", "naive seal-then-write / aead_aes", median(naive.gbps) / m_aead);
    std::printf("  %-44s %7.3f\n", "encrypted / naive seal-then-write", m_enc / median(naive.gbps));
  }

  // Where the CPU goes: both ends run on this machine's cores, so the stream's ceiling is
  // (cores available) / (CPU seconds both ends spend per byte).
  std::printf("\n  %-44s  sender  receiver   ns/byte\n", "CPU per transfer, cores busy (medians)");
  for (const Row* r : {&raw, &naive, &enc, &enc_nt})
    std::printf("  %-44s %7.2f  %7.2f   %7.3f\n", r->label.c_str(), median(r->sender_cores),
                median(r->receiver_cores), median(r->ns_per_byte));
  const double aead_ns =
      have_aes ? 1.0 / median(aes.gbps) + 1.0 / median(aes_open.gbps) : 2.0 / median(xchacha.gbps);
  std::printf("  %-44s %7s  %7s   %7.3f\n",
              have_aes ? "AEAD seal + open alone (1 core each)" : "AEAD seal x2 alone (estimate)",
              "", "", aead_ns);
  const double ncpu = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  double load_end[3] = {0, 0, 0};
  ::getloadavg(load_end, 3);
  std::printf(
      "  %.0f cores online; both processes share them (load average %.2f at start, %.2f "
      "at end).\n  CPU-bound ceiling of the encrypted stream here: %.0f / %.3f ns = "
      "%.3f GB/s (%.2fx aead_aes)\n",
      ncpu, load_start[0], load_end[0], ncpu, median(enc.ns_per_byte),
      ncpu / median(enc.ns_per_byte), ncpu / median(enc.ns_per_byte) / m_aead);
  std::printf(
      "\n  verdict: encrypted stream %.3f GB/s = %.2fx the single-core %s seal speed "
      "(%.3f GB/s): %s the 0.75x target\n",
      m_enc, r_aead, have_aes ? "AES-256-GCM" : "XChaCha20-Poly1305", m_aead,
      pass ? "meets" : "BELOW");
  std::fflush(stdout);

  if (!o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "metric,rep,value,unit\n";
    for (const Row* r : rows) {
      for (std::size_t i = 0; i < r->gbps.size(); ++i)
        csv << r->key << ',' << i + 1 << ',' << r->gbps[i] << ",GB/s\n";
      csv << r->key << ",median," << median(r->gbps) << ",GB/s\n";
      if (!r->ns_per_byte.empty()) {
        csv << r->key << "_sender_cores,median," << median(r->sender_cores) << ",cores\n";
        csv << r->key << "_receiver_cores,median," << median(r->receiver_cores) << ",cores\n";
        csv << r->key << "_cpu,median," << median(r->ns_per_byte) << ",ns/byte\n";
      }
    }
    csv << (have_aes ? "ratio_encrypted_over_aead_aes" : "ratio_encrypted_over_aead_xchacha")
        << ",median," << r_aead << ",x\n";
    csv << "ratio_encrypted_over_raw_tcp,median," << r_raw << ",x\n";
    csv << "target_met,median," << (pass ? 1 : 0) << ",bool\n";
    csv << "# suite=" << peer.suite << " bytes=" << o.bytes << " chunk=" << o.chunk
        << " window=" << o.window << " workers=" << o.workers << " reps=" << o.reps << "\n";
    if (!csv) std::fprintf(stderr, "transport_bench: cannot write %s\n", o.csv.c_str());
  }

  const bool clean = h.stop(Duration(5000));
  Pipe::close_fd(ctl_pipe.w);
  const int rx_rc = grove::bench::reap_child(rx_pid, false);
  if (!clean) std::fprintf(stderr, "transport_bench: sessions still open after shutdown\n");
  if (rx_rc != 0) {
    std::fprintf(stderr, "transport_bench: receiving process exited with status %d\n", rx_rc);
    return 1;
  }
  return 0;
}
