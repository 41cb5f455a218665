// tensor_exchange: the node's main job in miniature, until the real node exists. Two processes
// (A = this one, B = a forked child) each load or create their identity in their own state
// directory, share a freshly generated swarm key, and swap a large float32 tensor over the
// secure transport in both directions at once. Each stream carries its metadata (shape, dtype,
// BLAKE2b-256 of the bytes, msgpack-encoded); the receiver checks size, hash and that every
// value is finite. Each process prints its node id, the peer's id, the suite, bytes, seconds
// and GB/s. Exit status 0 only if both directions arrived intact.
//
//   tensor_exchange [--floats N] [--seed S] [--state-dir DIR] [--chunk BYTES] [--window BYTES]
//                   [--workers N] [--timeout SECONDS]
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <msgpack.hpp>

#include "bench/bench_common.hpp"
#include "optim/splitmix.hpp"

namespace {

using namespace grove::transport;
namespace asio = boost::asio;
using grove::bench::Duration;
using grove::bench::HostThread;
using grove::bench::Pipe;
using grove::bench::seconds_between;
namespace fs = std::filesystem;

constexpr const char* kKind = "tensor";
constexpr const char* kStartMethod = "tensor.start";

struct Options {
  std::uint64_t floats = 64ull << 20;  // 256 MiB of float32
  std::uint64_t seed = 1;              // A uses seed, B uses seed + 1
  std::string state_dir;               // default: a fresh temporary directory, removed at exit
  std::size_t chunk = SessionOptions{}.stream_chunk;
  std::size_t window = SessionOptions{}.stream_window;
  std::size_t workers = 2;
  std::uint64_t timeout_s = 0;  // 0: 60 s + 10 s per GiB
  bool bad_hash = false;        // self-test: A announces a wrong hash, B must fail the run
};

Options parse_args(int argc, char** argv) {
  grove::bench::Args args(
      argc, argv,
      "[--floats N] [--seed S] [--state-dir DIR] [--chunk BYTES] [--window BYTES] [--workers N] "
      "[--timeout SECONDS]",
      "  --floats     float32 values per tensor (default 64M = 256 MiB; K/M/G allowed)\n"
      "  --seed       content seed of process A; B uses seed+1 (default 1)\n"
      "  --state-dir  parent of the two nodes' state dirs a/ and b/ (kept); default: a\n"
      "               temporary directory that is removed at exit\n"
      "  --chunk, --window  stream chunk and flow-control window (default 1M, 8M)\n"
      "  --workers    transport worker threads per process (default 2)\n"
      "  --timeout    give up after this many seconds (default 60 + 10 per GiB)\n"
      "  --self-test-bad-hash  A announces a wrong hash: the run must fail (checks the checks)\n");
  Options o;
  while (args.next()) {
    if (args.is("--self-test-bad-hash")) {
      o.bad_hash = true;
    } else if (args.is("--floats")) {
      o.floats = args.size(1, (1ull << 40) / 4);
    } else if (args.is("--seed")) {
      o.seed = args.size();
    } else if (args.is("--state-dir")) {
      o.state_dir = args.value();
    } else if (args.is("--timeout")) {
      o.timeout_s = args.size(1);
    } else if (!grove::bench::read_stream_option(args, o.chunk, o.window, o.workers)) {
      args.unknown();
    }
  }
  if (o.window < o.chunk) args.fail("--window must be at least --chunk");
  if (o.timeout_s == 0) o.timeout_s = 60 + 10 * ((o.floats * 4 + (1ull << 30) - 1) >> 30);
  return o;
}

// --- tensor content, hashing, checks ------------------------------------------------------------

using grove::optim::splitmix64;

/// Deterministic values in [-1, 1) from (seed, index).
void fill_tensor(float* p, std::uint64_t n, std::uint64_t seed) {
  const std::uint64_t base = splitmix64(seed ^ 0x6772'6f76'6574'656eull);  // "grovetén"
  auto to_float = [](std::uint32_t u) {
    return static_cast<float>(u >> 8) * (1.0f / 8388608.0f) - 1.0f;
  };
  for (std::uint64_t i = 0; i + 1 < n; i += 2) {
    const std::uint64_t r = splitmix64(base + i);
    p[i] = to_float(static_cast<std::uint32_t>(r));
    p[i + 1] = to_float(static_cast<std::uint32_t>(r >> 32));
  }
  if (n % 2) p[n - 1] = to_float(static_cast<std::uint32_t>(splitmix64(base + n - 1)));
}

/// Number of values that are NaN or infinite (exponent bits all ones).
std::uint64_t count_non_finite(const std::uint8_t* bytes, std::uint64_t n) {
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, bytes + 4 * i, 4);
    bad += (u & 0x7f800000u) == 0x7f800000u;
  }
  return bad;
}

std::vector<std::uint64_t> shape_for(std::uint64_t n) {
  if (n >= 1024 && n % 1024 == 0) return {n / 1024, 1024};
  return {n};
}

std::string shape_str(const std::vector<std::uint64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// --- metadata: msgpack map {"shape": [u64...], "dtype": "float32", "blake2b": bin(32)} ----------

struct TensorMeta {
  std::vector<std::uint64_t> shape;
  std::string dtype;
  Hash256 hash{};
};

Bytes encode_meta(const TensorMeta& m) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_map(3);
  pk.pack(std::string("shape"));
  pk.pack_array(static_cast<std::uint32_t>(m.shape.size()));
  for (auto d : m.shape) pk.pack_uint64(d);
  pk.pack(std::string("dtype"));
  pk.pack(m.dtype);
  pk.pack(std::string("blake2b"));
  pk.pack_bin(static_cast<std::uint32_t>(m.hash.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(m.hash.data()),
                   static_cast<std::uint32_t>(m.hash.size()));
  return Bytes::copy_of(
      {reinterpret_cast<const std::uint8_t*>(sb.data()), static_cast<std::size_t>(sb.size())});
}

/// Decodes untrusted metadata within explicit limits; an error string on anything unexpected.
std::optional<TensorMeta> decode_meta(std::span<const std::uint8_t> bytes, std::string& err) {
  UnpackLimits lim;
  lim.array = 8;
  lim.map = 8;
  lim.str = 64;
  lim.bin = 64;
  auto oh = unpack_bounded(bytes, lim);
  if (!oh) {
    err = "metadata is not valid msgpack: " + oh.error().message();
    return std::nullopt;
  }
  const msgpack::object& o = oh->get();
  if (o.type != msgpack::type::MAP) {
    err = "metadata is not a map";
    return std::nullopt;
  }
  TensorMeta m;
  bool have_shape = false, have_dtype = false, have_hash = false;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const auto& k = o.via.map.ptr[i].key;
    const auto& v = o.via.map.ptr[i].val;
    if (k.type != msgpack::type::STR) continue;
    const std::string key(k.via.str.ptr, k.via.str.size);
    if (key == "shape" && v.type == msgpack::type::ARRAY) {
      for (std::uint32_t j = 0; j < v.via.array.size; ++j) {
        const auto& d = v.via.array.ptr[j];
        if (d.type != msgpack::type::POSITIVE_INTEGER) {
          err = "shape has a non-positive-integer dimension";
          return std::nullopt;
        }
        m.shape.push_back(d.via.u64);
      }
      have_shape = true;
    } else if (key == "dtype" && v.type == msgpack::type::STR) {
      m.dtype.assign(v.via.str.ptr, v.via.str.size);
      have_dtype = true;
    } else if (key == "blake2b" && v.type == msgpack::type::BIN && v.via.bin.size == 32) {
      std::memcpy(m.hash.data(), v.via.bin.ptr, 32);
      have_hash = true;
    }
  }
  if (!have_shape || !have_dtype || !have_hash) {
    err = "metadata lacks shape, dtype or a 32-byte blake2b hash";
    return std::nullopt;
  }
  return m;
}

// --- one node
// -------------------------------------------------------------------------------------

/// State shared by the host strand (stream callbacks) and the main thread (waits, verifies).
struct Exchange {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t expected_bytes = 0;

  // receiving (the buffer is written on the strand until recv_done is set under mu)
  bool recv_started = false, recv_done = false;
  std::string recv_error;
  Clock::time_point recv_t0{}, recv_t1{};
  PeerInfo from;
  TensorMeta meta;
  Bytes buf;
  std::atomic<std::uint64_t> received{0};

  // sending
  bool send_started = false, send_done = false;
  std::error_code send_ec;
  Clock::time_point send_t0{}, send_t1{};
  PeerInfo send_peer;

  void finish_recv(std::string error) {
    std::lock_guard lk(mu);
    if (recv_done) return;
    recv_done = true;
    recv_error = std::move(error);
    recv_t1 = Clock::now();
    cv.notify_all();
  }
};

class TensorSink final : public StreamSink {
 public:
  explicit TensorSink(std::shared_ptr<Exchange> ex) : ex_(std::move(ex)) {}
  void on_data(Chunk c) override {
    const auto b = c.bytes();
    if (c.offset() > ex_->buf.size() || b.size() > ex_->buf.size() - c.offset()) {
      ex_->finish_recv("chunk beyond the announced size");
      return;
    }
    std::memcpy(ex_->buf.data() + c.offset(), b.data(), b.size());
    ex_->received += b.size();
  }
  void on_end(std::error_code ec) override {
    ex_->finish_recv(ec ? "stream ended: " + ec.message() : std::string());
  }

 private:
  std::shared_ptr<Exchange> ex_;
};

/// A pre-filled tensor served by memcpy.
class TensorSource final : public StreamSource {
 public:
  explicit TensorSource(std::shared_ptr<const Bytes> t) : t_(std::move(t)) {}
  std::uint64_t size() const override { return t_->size(); }
  Result<void> read(std::uint64_t offset, std::span<std::uint8_t> out) override {
    if (offset > t_->size() || out.size() > t_->size() - offset) return errc::source_failed;
    std::memcpy(out.data(), t_->data() + offset, out.size());
    return {};
  }

 private:
  std::shared_ptr<const Bytes> t_;
};

struct NodeConfig {
  std::string name;  // "A" or "B"
  fs::path state_dir, swarm_key_file;
  std::uint64_t seed = 0;
  bool dialer = false;  // A dials B and starts the exchange
  int up = -1;          // B writes, A reads
  int down = -1;        // A writes, B reads
};

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

double gbps(std::uint64_t bytes, double s) {
  return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0;
}

/// Runs one side; returns the process exit status.
int run_node(const Options& o, const NodeConfig& c) {
  const Duration timeout(static_cast<std::int64_t>(o.timeout_s) * 1000);
  const auto deadline = Clock::now() + timeout;
  auto left = [&] {
    return std::max(Duration(1), std::chrono::duration_cast<Duration>(deadline - Clock::now()));
  };
  auto err = [&](const std::string& what) {
    std::fprintf(stderr, "[%s] error: %s\n", c.name.c_str(), what.c_str());
    return 1;
  };

  const Identity id = Identity::load_or_create(c.state_dir);
  const SwarmKey key = SwarmKey::load(c.swarm_key_file);

  // The tensor to send.
  const std::uint64_t bytes = o.floats * 4;
  auto tensor = std::make_shared<Bytes>(bytes);
  const auto g0 = Clock::now();
  fill_tensor(reinterpret_cast<float*>(tensor->data()), o.floats, c.seed);
  const auto g1 = Clock::now();
  TensorMeta meta{shape_for(o.floats), "float32", blake2b_256(tensor->span())};
  const auto g2 = Clock::now();
  TensorMeta announced = meta;
  if (o.bad_hash && c.dialer) announced.hash[0] ^= 1;
  const auto meta_bytes = std::make_shared<const Bytes>(encode_meta(announced));

  auto ex = std::make_shared<Exchange>();
  ex->expected_bytes = bytes;

  HostOptions ho;
  ho.listen = c.dialer ? "" : "127.0.0.1:0";
  ho.swarm_key = key;
  ho.session.stream_chunk = o.chunk;
  ho.session.stream_window = o.window;
  ho.link.max_frame = std::max<std::size_t>(ho.link.max_frame, o.chunk + 4096);
  HostThread h;
  Host& host = h.create(id, ho);

  host.accept_streams(
      kKind, [ex](const PeerInfo& from, IncomingStream& in) -> std::shared_ptr<StreamSink> {
        std::string why;
        auto m = decode_meta(in.meta.bytes(), why);
        {
          std::lock_guard lk(ex->mu);
          if (ex->recv_started) return nullptr;  // one tensor per run
          ex->recv_started = true;
          ex->recv_t0 = Clock::now();
          ex->from = from;
        }
        if (m) {
          std::uint64_t n = 1;
          for (auto d : m->shape) n = d && n > ~std::uint64_t{0} / d ? 0 : n * d;
          if (m->dtype != "float32") {
            why = "dtype '" + m->dtype + "' is not float32";
          } else if (n == 0 || n > ~std::uint64_t{0} / 4 || n * 4 != in.size) {
            why = "shape " + shape_str(m->shape) + " does not match the stream size " +
                  std::to_string(in.size);
          } else if (in.size != ex->expected_bytes) {
            why = "stream of " + std::to_string(in.size) + " bytes, expected " +
                  std::to_string(ex->expected_bytes);
          }
        }
        if (!m || !why.empty()) {
          ex->finish_recv("refused the incoming tensor: " + why);
          return nullptr;
        }
        ex->meta = std::move(*m);
        ex->buf = Bytes(in.size);
        return std::make_shared<TensorSink>(ex);
      });

  auto src = std::make_shared<TensorSource>(tensor);
  std::weak_ptr<Host> wh = h.host_ptr();
  // Starts this side's stream (host strand).
  auto start_send = [ex, src, wh, meta_bytes](const PeerInfo& to) {
    auto host = wh.lock();
    if (!host) return;
    {
      std::lock_guard lk(ex->mu);
      if (ex->send_started) return;
      ex->send_started = true;
      ex->send_peer = to;
      ex->send_t0 = Clock::now();
    }
    host->send_stream(PeerRef::node(to.id), kKind, Bytes::copy_of(meta_bytes->span()), src,
                      [ex](std::error_code ec) {
                        std::lock_guard lk(ex->mu);
                        ex->send_done = true;
                        ex->send_ec = ec;
                        ex->send_t1 = Clock::now();
                        ex->cv.notify_all();
                      });
  };
  if (!c.dialer) {
    // B starts sending when A says so (A sends this message right before its own stream).
    host.handle_message(kStartMethod,
                        [start_send](const PeerInfo& from, Payload) { start_send(from); });
  }
  host.start();
  h.run();

  PeerInfo peer;
  if (!c.dialer) {
    if (!grove::bench::write_all(c.up, "addr " + host.address() + "\n"))
      return err("cannot report the address to the parent");
  } else {
    auto line = grove::bench::read_line(c.up, left());
    if (!line || line->rfind("addr ", 0) != 0)
      return err("process B did not report its address (it failed or timed out)");
    const std::string addr = line->substr(5);
    auto p = std::make_shared<std::promise<Result<PeerInfo>>>();
    auto f = p->get_future();
    host.connect(PeerRef::at(addr), [p](Result<PeerInfo> r) { p->set_value(std::move(r)); });
    auto r = grove::bench::wait_value(f, left());
    if (!r) return err("connecting to " + addr + " timed out (hang)");
    if (!*r) return err("connecting to " + addr + " failed: " + r->error().message());
    peer = r->value();
    // Start both directions: B sends when the message arrives, A right after queueing it.
    host.send(PeerRef::node(peer.id, addr), kStartMethod, Bytes{});
    asio::post(host.executor(), [start_send, peer] { start_send(peer); });
  }

  // Wait until our stream was confirmed and the peer's stream arrived (or failed).
  {
    std::unique_lock lk(ex->mu);
    const bool ok = ex->cv.wait_until(lk, deadline, [&] { return ex->send_done && ex->recv_done; });
    if (!ok) {
      return err(fmt("timed out after %llu s (sent: %s, received %llu of %llu bytes%s) -- hang",
                     static_cast<unsigned long long>(o.timeout_s),
                     ex->send_done ? "confirmed" : (ex->send_started ? "in flight" : "not started"),
                     static_cast<unsigned long long>(ex->received.load()),
                     static_cast<unsigned long long>(bytes),
                     ex->recv_started ? "" : ", stream never opened"));
    }
  }
  if (!c.dialer) peer = ex->from;  // A keeps the identity B proved to connect()

  // Verify what arrived (off the host strand; the stream is over).
  std::vector<std::string> problems;
  if (ex->send_ec) problems.push_back("our stream failed: " + ex->send_ec.message());
  if (!ex->recv_error.empty()) problems.push_back(ex->recv_error);
  if ((ex->recv_started && ex->from.id != peer.id) ||
      (ex->send_started && ex->send_peer.id != peer.id))
    problems.push_back("the streams went to/came from an unexpected peer");
  const auto v0 = Clock::now();
  bool hash_ok = false;
  std::uint64_t non_finite = 0;
  Hash256 got{};
  if (ex->recv_error.empty()) {
    if (ex->received != bytes || ex->buf.size() != bytes) {
      problems.push_back(fmt("received %llu bytes, expected %llu",
                             static_cast<unsigned long long>(ex->received.load()),
                             static_cast<unsigned long long>(bytes)));
    } else {
      got = blake2b_256(ex->buf.span());
      hash_ok = got == ex->meta.hash;
      if (!hash_ok)
        problems.push_back("hash MISMATCH: got " + to_hex(got) + ", metadata says " +
                           to_hex(ex->meta.hash));
      non_finite = count_non_finite(ex->buf.data(), o.floats);
      if (non_finite)
        problems.push_back(
            fmt("%llu non-finite values", static_cast<unsigned long long>(non_finite)));
    }
  }
  const auto v1 = Clock::now();
  const bool ok = problems.empty();

  // Report in order: A prints first, then tells B to print.
  auto report = [&] {
    const double send_s = seconds_between(ex->send_t0, ex->send_t1);
    const double recv_s = seconds_between(ex->recv_t0, ex->recv_t1);
    const auto t_end = std::max(ex->send_t1, ex->recv_t1);
    const double xs = seconds_between(std::min(ex->send_t0, ex->recv_t0), t_end);
    std::string out;
    out += fmt("node %s (state %s)  peer %s  suite %s\n", short_id(id.id()).c_str(),
               c.state_dir.c_str(), short_id(peer.id).c_str(), peer.suite.c_str());
    out +=
        fmt("  tensor %s float32, seed %llu: %llu bytes, blake2b %.16s...  (generated in "
            "%.3f s, hashed in %.3f s)\n",
            shape_str(meta.shape).c_str(), static_cast<unsigned long long>(c.seed),
            static_cast<unsigned long long>(bytes), to_hex(meta.hash).c_str(),
            seconds_between(g0, g1), seconds_between(g1, g2));
    if (!ex->send_ec)
      out += fmt("  sent     %llu bytes in %.3f s = %.3f GB/s (send_stream -> peer confirmed)\n",
                 static_cast<unsigned long long>(bytes), send_s, gbps(bytes, send_s));
    if (ex->recv_error.empty())
      out += fmt("  received %llu bytes in %.3f s = %.3f GB/s (stream open -> last byte), %s %s\n",
                 static_cast<unsigned long long>(ex->received.load()), recv_s,
                 gbps(ex->received.load(), recv_s), shape_str(ex->meta.shape).c_str(),
                 ex->meta.dtype.c_str());
    if (ok)
      out += fmt("  both directions at once: %llu bytes in %.3f s = %.3f GB/s aggregate\n",
                 static_cast<unsigned long long>(2 * bytes), xs, gbps(2 * bytes, xs));
    if (hash_ok)
      out += fmt(
          "  hash OK (blake2b-256 %.16s... matches the metadata), size OK (%llu bytes)%s "
          "(checked in %.3f s)\n",
          to_hex(got).c_str(), static_cast<unsigned long long>(ex->received.load()),
          non_finite
              ? ""
              : fmt(", all %llu values finite", static_cast<unsigned long long>(o.floats)).c_str(),
          seconds_between(v0, v1));
    for (auto& p : problems) out += "  FAILED: " + p + "\n";
    out += ok ? "  result: OK" : "  result: FAILED";
    std::string prefixed;
    std::size_t pos = 0;
    while (pos < out.size()) {
      const auto nl = out.find('\n', pos);
      const auto end = nl == std::string::npos ? out.size() : nl;
      prefixed += "[" + c.name + "] " + out.substr(pos, end - pos) + "\n";
      pos = end + 1;
    }
    grove::bench::write_all(STDOUT_FILENO, prefixed);
  };

  int rc = ok ? 0 : 1;
  if (c.dialer) {
    auto done = grove::bench::read_line(c.up, left());
    report();
    if (!done) {
      rc = err("process B did not finish (it failed or timed out)");
    } else {
      grove::bench::write_all(c.down, "report\n");
      auto printed = grove::bench::read_line(c.up, left());
      if (!printed || *printed != "printed") rc = err("process B did not report");
      if (*done != "done ok") rc = 1;
    }
  } else {
    grove::bench::write_all(c.up, ok ? "done ok\n" : "done failed\n");
    auto cmd = grove::bench::read_line(c.down, left());
    if (cmd && *cmd == "report") {
      report();
      grove::bench::write_all(c.up, "printed\n");
    }
    grove::bench::wait_for_eof(c.down);  // A closes it once it is done with us
  }
  if (!h.stop(Duration(5000)))
    std::fprintf(stderr, "[%s] warning: sessions still open after shutdown\n", c.name.c_str());
  return rc;
}

int guarded_node(const Options& o, const NodeConfig& c) {
  try {
    return run_node(o, c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[%s] error: %s\n", c.name.c_str(), e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  configure_worker_pool(o.workers);

  // State directories and the swarm key file (the key is generated fresh for every run).
  fs::path base;
  bool remove_base = false;
  try {
    ensure_sodium();
    if (o.state_dir.empty()) {
      std::string tmpl = (fs::temp_directory_path() / "grove-tensor-XXXXXX").string();
      if (!::mkdtemp(tmpl.data())) {
        std::perror("mkdtemp");
        return 2;
      }
      base = tmpl;
      remove_base = true;
    } else {
      base = o.state_dir;
      fs::create_directories(base);
    }
    const fs::path key_file = base / "swarm.key";
    {
      const std::string tmp = (base / "swarm.key.tmp").string();
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || !grove::bench::write_all(fd, SwarmKey::generate().hex() + "\n") ||
          ::close(fd) != 0) {
        std::perror("writing the swarm key");
        return 2;
      }
      fs::rename(tmp, key_file);
    }
    std::printf("tensor_exchange: %llu float32 per tensor (%s) each way, state under %s%s\n",
                static_cast<unsigned long long>(o.floats),
                grove::bench::human_bytes(o.floats * 4).c_str(), base.c_str(),
                remove_base ? " (temporary)" : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_exchange: %s\n", e.what());
    return 2;
  }

  NodeConfig a{"A", base / "a", base / "swarm.key", o.seed, true};
  NodeConfig b{"B", base / "b", base / "swarm.key", o.seed + 1, false};
  Pipe up = Pipe::make(), down = Pipe::make();
  std::fflush(nullptr);
  const pid_t pid = grove::bench::fork_bound_child();  // before any thread exists
  if (pid < 0) {
    std::perror("fork");
    return 2;
  }
  if (pid == 0) {
    Pipe::close_fd(up.r);
    Pipe::close_fd(down.w);
    b.up = up.w;
    b.down = down.r;
    const int rc = guarded_node(o, b);
    std::fflush(nullptr);
    ::_exit(rc);
  }
  Pipe::close_fd(up.w);
  Pipe::close_fd(down.r);
  a.up = up.r;
  a.down = down.w;
  const int rc_a = guarded_node(o, a);
  Pipe::close_fd(down.w);  // lets B finish
  // B exits on its own once `down` is closed; kill it if it does not (it may be stuck).
  const int rc_b = grove::bench::reap_child_within(pid, Duration(rc_a == 0 ? 15000 : 7000));
  if (remove_base) {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
  const bool ok = rc_a == 0 && rc_b == 0;
  std::printf("tensor_exchange: %s (A exit %d, B exit %d)\n", ok ? "OK" : "FAILED", rc_a, rc_b);
  return ok ? 0 : 1;
}
