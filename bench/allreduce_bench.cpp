// allreduce_bench: grove-node's ring all-reduce (gossip::RingAllReduce on GossipRuntime over the
// encrypted transport) between N processes on this machine, side by side with Gloo's ring
// all-reduce (torch.distributed, gloo backend, bench/gloo_allreduce.py) on the same sizes in the
// same run; prints each median time and the ratio grove / gloo.
//
//   allreduce_bench [--procs 2,4] [--sizes 4M,64M,256M] [--reps 3] [--codec fp16|bf16|fp32]
//                   [--chunk VALUES] [--no-gloo] [--streams N]
//                   [--netns NS0,NS1,.. --hosts IP0,IP1,..] [--raw]
// --streams: GossipRuntime's streams in flight per peer (RuntimeOptions::streams_per_peer).
// Each child process runs one Host + GossipRuntime; the parent hands out the member list and
// starts every rep at once over pipes. A rep's time is the slowest member's (start to result),
// and every member must end with the same result (its BLAKE2b is compared).
// --netns: member i first enters the network namespace /var/run/netns/NSi (setns, so it needs
// root) and listens on IPi instead of 127.0.0.1 (bench/netns_allreduce.sh builds such a
// network; Gloo is then run by that script, so this implies --no-gloo). --raw adds one line per
// size, "grove PROCS BYTES MEDIAN_SECONDS WIRE_BYTES CPU_SECONDS BUILD_SECONDS" (wire bytes: the
// most one member sent; CPU: all members' user + system time during the op; build: the slowest
// member's time to construct its core, before which it sends nothing; medians over the reps).
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>

#include <cstring>
#include <map>

#include <spdlog/spdlog.h>

#include "bench/bench_common.hpp"
#include "gossip/allreduce.hpp"
#include "gossip/runtime.hpp"

namespace {

using namespace grove;
using bench::Pipe;
using transport::Duration;

struct Options {
  std::vector<std::size_t> procs{2, 4};
  std::vector<std::uint64_t> sizes{4u << 20, 64u << 20, 256u << 20};
  int reps = 3;
  gossip::WireCodec codec = gossip::WireCodec::fp16;
  bool gloo = true;
  bool raw = false;
  std::size_t chunk_values = gossip::AllReduceOptions{}.chunk_values;
  std::size_t streams = gossip::RuntimeOptions{}.streams_per_peer;
  std::vector<std::string> netns, hosts;  // per member, when given
};

constexpr const char* kSynopsis =
    "[--procs 2,4] [--sizes 4M,64M,256M] [--reps 3] [--codec fp16|bf16|fp32] [--chunk VALUES] "
    "[--no-gloo]\n"
    "       [--streams N] [--netns NS0,NS1,.. --hosts IP0,IP1,..] [--raw]";

// A run that cannot go on (a member failed): says why and exits with status 2.
[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "allreduce_bench: %s\n", why.c_str());
  std::exit(2);
}

using bench::split;

// ---- child: one member -------------------------------------------------------------------------

// User + system CPU time of this process (all its threads) so far.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

// Moves this (single-threaded, just forked) process into a named network namespace.
bool enter_netns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "allreduce_bench: cannot enter %s: %s\n", path.c_str(),
                 std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return false;
  }
  ::close(fd);
  return true;
}

int child(int in_fd, int out_fd, std::size_t rank, const Options& opt) {
  if (!opt.netns.empty() && !enter_netns(opt.netns[rank])) return 4;
  bench::HostThread ht;
  transport::HostOptions ho;
  if (!opt.hosts.empty()) ho.listen = opt.hosts[rank] + ":0";
  auto& host = ht.create(transport::Identity::generate(), ho);
  gossip::RuntimeOptions ro;
  ro.streams_per_peer = opt.streams;
  auto rt = gossip::GossipRuntime::create(ht.host_ptr(), ro);
  host.start();
  ht.run();
  bench::write_all(out_fd, "member " + transport::to_hex(host.id()) + " " + host.address() + "\n");
  std::vector<gossip::NodeId> ring;
  std::map<gossip::NodeId, std::string> addresses;
  for (;;) {
    auto line = bench::read_line(in_fd, Duration(60000));
    if (!line) return 3;
    if (*line == "end") break;
    const auto f = split(*line, ' ');
    if (f.size() != 3) return 3;
    gossip::NodeId id{};
    for (std::size_t i = 0; i < id.size(); ++i)
      id[i] = static_cast<std::uint8_t>(std::stoi(f[1].substr(2 * i, 2), nullptr, 16));
    ring.push_back(id);
    addresses[id] = f[2];
  }
  optim::Floats spare;
  for (;;) {
    auto line = bench::read_line(in_fd, Duration(600000));
    if (!line || *line == "quit") break;
    const auto f = split(*line, ' ');  // prep <bytes> <rep>
    if (f.size() != 3 || f[0] != "prep") return 3;
    const std::uint64_t bytes = std::stoull(f[1]);
    const int rep = std::stoi(f[2]);
    std::vector<float> input(bytes / 4);
    std::uint32_t x = static_cast<std::uint32_t>(rank * 7919 + rep + 1);
    for (auto& v : input) {  // cheap pseudo-random values in [-0.01, 0.01)
      x = x * 1664525u + 1013904223u;
      v = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.02f;
    }
    // Every member builds its input before any starts (as gloo_allreduce.py does before its
    // barrier), so that no member's op competes with another's input generation for the cores.
    bench::write_all(out_fd, "ready\n");
    if (auto go = bench::read_line(in_fd, Duration(600000)); !go || *go != "go") return 3;
    gossip::OpId op{};
    std::memcpy(op.data(), &bytes, 8);
    op[8] = static_cast<std::uint8_t>(rep);
    gossip::AllReduceOptions o;
    o.codec = opt.codec;
    o.chunk_values = opt.chunk_values;
    std::promise<std::unique_ptr<gossip::Protocol>> done;
    auto fut = done.get_future();
    const double cpu0 = cpu_seconds();
    const auto t0 = transport::Clock::now();
    // Building the core (checking the input, encoding the first messages) is part of the op;
    // its time is reported too, as nothing is sent before it ends.
    // The result buffer of the previous rep is reused, as a node reuses it from round to round
    // (Gloo's all-reduce works in place on a tensor that is already mapped, too).
    auto core = gossip::RingAllReduce::create(
        op, host.id(), ring, std::move(input), o, gossip::GossipRuntime::now(), std::move(spare)).value();
    const double built = bench::seconds_between(t0, transport::Clock::now());
    rt->start(std::move(core), addresses,
              [&done](std::unique_ptr<gossip::Protocol> p) { done.set_value(std::move(p)); });
    auto p = fut.get();
    const double secs = bench::seconds_between(t0, transport::Clock::now());
    const double cpu = cpu_seconds() - cpu0;
    auto& r = static_cast<gossip::RingAllReduce&>(*p);
    const auto h = transport::blake2b_256(
        {reinterpret_cast<const std::uint8_t*>(r.result().data()), r.result().size() * 4});
    char buf[256];
    std::snprintf(buf, sizeof buf, "t %.6f %s %s %llu %.6f %.6f\n", secs,
                  gossip::to_string(r.status()), transport::to_hex(h).substr(0, 16).c_str(),
                  static_cast<unsigned long long>(r.stats().bytes_sent), cpu, built);
    bench::write_all(out_fd, buf);
    spare = r.take_result();
  }
  ht.stop(Duration(5000));
  return 0;
}

// ---- parent ------------------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  Pipe to, from;
};

struct GroveResult {
  double seconds = -1;     // median; negative when a run failed
  std::uint64_t wire = 0;  // the most bytes one member sent (last rep)
  double cpu = 0;          // CPU seconds of all members together (median rep)
  double build = 0;        // the slowest member's time to build its core (median rep)
};

// Runs grove's all-reduce over `n` processes for every size.
std::vector<GroveResult> run_grove(std::size_t n, const Options& opt) {
  std::vector<Child> kids(n);
  for (std::size_t i = 0; i < n; ++i) {
    kids[i].to = Pipe::make();
    kids[i].from = Pipe::make();
    std::fflush(nullptr);
    const pid_t pid = bench::fork_bound_child();
    if (pid == 0) {
      Pipe::close_fd(kids[i].to.w);
      Pipe::close_fd(kids[i].from.r);
      ::_exit(child(kids[i].to.r, kids[i].from.w, i, opt));
    }
    kids[i].pid = pid;
    Pipe::close_fd(kids[i].to.r);
    Pipe::close_fd(kids[i].from.w);
  }
  std::string members;
  for (auto& k : kids) {
    auto line = bench::read_line(k.from.r, Duration(30000));
    if (!line) fail("a member did not start");
    members += *line + "\n";
  }
  for (auto& k : kids) bench::write_all(k.to.w, members + "end\n");
  std::vector<GroveResult> medians;
  for (const auto bytes : opt.sizes) {
    std::vector<double> times, cpus, builds;
    std::uint64_t wire = 0;
    bool ok = true;
    for (int rep = 0; rep <= opt.reps && ok; ++rep) {  // rep 0 warms up
      for (auto& k : kids)
        bench::write_all(k.to.w,
                         "prep " + std::to_string(bytes) + " " + std::to_string(rep) + "\n");
      for (auto& k : kids) {
        auto line = bench::read_line(k.from.r, Duration(600000));
        if (!line || *line != "ready") fail("a member failed to prepare");
      }
      for (auto& k : kids) bench::write_all(k.to.w, "go\n");
      double worst = 0, cpu = 0, build = 0;
      std::string hash;
      for (auto& k : kids) {
        auto line = bench::read_line(k.from.r, Duration(600000));
        const auto f = line ? split(*line, ' ') : std::vector<std::string>{};
        if (f.size() != 7 || f[2] != "done") {
          std::fprintf(stderr, "allreduce_bench: a member failed: %s\n",
                       line ? line->c_str() : "(no answer)");
          ok = false;
          break;
        }
        worst = std::max(worst, std::stod(f[1]));
        wire = std::max<std::uint64_t>(wire, std::stoull(f[4]));
        cpu += std::stod(f[5]);
        build = std::max(build, std::stod(f[6]));
        if (!hash.empty() && hash != f[3]) {
          std::fprintf(stderr, "allreduce_bench: members disagree on the result\n");
          ok = false;
        }
        hash = f[3];
      }
      if (rep > 0) {
        times.push_back(worst);
        cpus.push_back(cpu);
        builds.push_back(build);
      }
    }
    medians.push_back({ok ? bench::median(times) : -1.0, wire, ok ? bench::median(cpus) : 0.0,
                       ok ? bench::median(builds) : 0.0});
  }
  for (auto& k : kids) {
    bench::write_all(k.to.w, "quit\n");
    Pipe::close_fd(k.to.w);
  }
  for (auto& k : kids) {
    bench::reap_child_within(k.pid, Duration(10000));
    Pipe::close_fd(k.from.r);
  }
  return medians;
}

std::map<std::uint64_t, double> run_gloo(std::size_t n, const Options& opt) {
  std::map<std::uint64_t, double> out;
  std::string cmd = "/usr/bin/python3 " GROVE_SOURCE_DIR "/bench/gloo_allreduce.py " +
                    std::to_string(n) + " " + std::to_string(opt.reps) + " " +
                    std::to_string(29500 + (::getpid() % 400) + n) + " ";
  for (auto s : opt.sizes) cmd += std::to_string(s) + " ";
  cmd += "2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    unsigned long long size = 0;
    unsigned procs = 0;
    double secs = 0;
    if (std::sscanf(line, "gloo %u %llu %lf", &procs, &size, &secs) == 3) out[size] = secs;
  }
  ::pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  bench::Args args(argc, argv, kSynopsis);
  while (args.next()) {
    if (args.is("--procs")) {
      opt.procs = args.numbers<std::size_t>(1, 64);
    } else if (args.is("--sizes")) {
      opt.sizes = args.sizes(4, bench::Args::kMaxSize, 4);
    } else if (args.is("--reps")) {
      opt.reps = args.number(1);
    } else if (args.is("--codec")) {
      const std::string v = args.value();
      const auto c = gossip::parse_codec(v);
      if (!c || *c == gossip::WireCodec::e3m0) args.bad_value(v, "fp32, fp16 or bf16");
      opt.codec = *c;
    } else if (args.is("--chunk")) {
      opt.chunk_values = args.size(256, 4u << 20, 256);  // values per message
    } else if (args.is("--no-gloo")) {
      opt.gloo = false;
    } else if (args.is("--streams")) {
      opt.streams = args.number<std::size_t>(1, 16);
    } else if (args.is("--raw")) {
      opt.raw = true;
    } else if (args.is("--netns")) {
      opt.netns = args.list();
    } else if (args.is("--hosts")) {
      opt.hosts = args.list();
    } else {
      args.unknown();
    }
  }
  std::size_t most = 0;
  for (auto n : opt.procs) most = std::max(most, n);
  if (!opt.netns.empty() && opt.netns.size() < most) args.fail("--netns: one namespace per member");
  if (!opt.hosts.empty() && opt.hosts.size() < most) args.fail("--hosts: one per member");
  if (!opt.netns.empty()) opt.gloo = false;  // Gloo on the namespaces: netns_allreduce.sh
  spdlog::set_level(spdlog::level::warn);
  std::printf(
      "all-reduce, grove-node (%s on the wire, encrypted) vs Gloo (fp32), median of %d,\n"
      "time of the slowest member; all processes share this machine's %u cores\n",
      gossip::to_string(opt.codec), opt.reps, std::thread::hardware_concurrency());
  std::printf("  %5s %10s %12s %12s %10s\n", "procs", "size", "grove s", "gloo s", "grove/gloo");
  int rc = 0;
  for (auto n : opt.procs) {
    const auto grove = run_grove(n, opt);
    const auto gloo = opt.gloo ? run_gloo(n, opt) : std::map<std::uint64_t, double>{};
    for (std::size_t i = 0; i < opt.sizes.size(); ++i) {
      const auto g = gloo.count(opt.sizes[i]) ? gloo.at(opt.sizes[i]) : -1.0;
      const double t = grove[i].seconds;
      if (t < 0) rc = 1;
      std::printf("  %5zu %10s %12.3f %12.3f %10s\n", n, bench::human_bytes(opt.sizes[i]).c_str(),
                  t, g, g > 0 && t > 0 ? (std::to_string(t / g).substr(0, 5) + "x").c_str() : "-");
      if (opt.raw)
        std::printf("grove %zu %llu %.6f %llu %.3f %.3f\n", n,
                    static_cast<unsigned long long>(opt.sizes[i]), t,
                    static_cast<unsigned long long>(grove[i].wire), grove[i].cpu, grove[i].build);
    }
  }
  return rc;
}
