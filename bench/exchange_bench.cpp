// exchange_bench: NoLoCo's pair exchange (gossip::GroupExchange on GossipRuntime, encrypted
// transport) between two hosts whose links the transport limits to a given rate (FaultyLink
// bandwidth on every frame each side sends), as a ratio to the wire bytes ÷ link rate bound.
// Target: <= 1.1x at 100 Mbit/s.
//
//   exchange_bench [--mbit 100] [--rtt-ms 0] [--sizes 16M,64M] [--codec fp16|bf16|fp32|e3m0]
//                  [--reps 3] [--chunk VALUES]
#include <spdlog/spdlog.h>

#include <cstring>
#include <future>

#include "bench/bench_common.hpp"
#include "gossip/exchange.hpp"
#include "gossip/runtime.hpp"

namespace {

using namespace grove;
using transport::Duration;

std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t x = seed;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.02f;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  double mbit = 100, rtt_ms = 0;
  std::vector<std::uint64_t> sizes{16u << 20, 64u << 20};
  gossip::WireCodec codec = gossip::WireCodec::fp16;
  int reps = 3;
  std::size_t chunk_values = gossip::ExchangeOptions{}.chunk_values;
  bench::Args args(argc, argv,
                   "[--mbit 100] [--rtt-ms 0] [--sizes 16M,64M] [--codec fp16|bf16|fp32|e3m0] "
                   "[--reps 3] "
                   "[--chunk VALUES]");
  while (args.next()) {
    if (args.is("--mbit")) {
      mbit = args.number<double>();
      if (!(mbit > 0)) args.fail("--mbit must be > 0");
    } else if (args.is("--rtt-ms")) {
      rtt_ms = args.number<double>();
      if (!(rtt_ms >= 0 && rtt_ms <= 10000)) args.fail("--rtt-ms must be in 0..10000");
    } else if (args.is("--sizes")) {
      sizes = args.sizes(1024, bench::Args::kMaxSize, 1024);
    } else if (args.is("--codec")) {
      const std::string v = args.value();
      auto c = gossip::parse_codec(v);
      if (!c) args.bad_value(v, "fp16, bf16, fp32 or e3m0");
      codec = *c;
    } else if (args.is("--chunk")) {
      chunk_values = args.size(256, 4u << 20, 256);  // values per message
    } else if (args.is("--reps")) {
      reps = args.number(1);
    } else {
      args.unknown();
    }
  }
  spdlog::set_level(spdlog::level::warn);
  const double rate = mbit * 1e6 / 8;  // bytes per second, each direction
  auto plan = std::make_shared<transport::FaultPlan>();
  transport::FaultConfig fc;
  fc.bandwidth_bytes_per_sec = rate;
  fc.latency = transport::Duration(static_cast<std::int64_t>(rtt_ms / 2));
  plan->set_default(fc);
  bench::HostThread ta, tb;
  transport::HostOptions ho;
  ho.faults = plan;
  auto& a = ta.create(transport::Identity::generate(), ho);
  auto& b = tb.create(transport::Identity::generate(), ho);
  auto ra = gossip::GossipRuntime::create(ta.host_ptr());
  auto rb = gossip::GossipRuntime::create(tb.host_ptr());
  a.start();
  b.start();
  ta.run();
  tb.run();
  const std::map<gossip::NodeId, std::string> addrs{{a.id(), a.address()}, {b.id(), b.address()}};
  // One connection, made before timing: the sides start at once, and two simultaneous dials
  // would give them two sessions, each with its own rate limit.
  std::promise<transport::Result<transport::PeerInfo>> connected;
  a.connect(transport::PeerRef::node(b.id(), b.address()),
            [&](transport::Result<transport::PeerInfo> r) { connected.set_value(std::move(r)); });
  if (!connected.get_future().get()) {
    std::fprintf(stderr, "exchange_bench: the hosts could not connect\n");
    return 1;
  }
  std::printf(
      "pair exchange, %s on the wire, links limited to %.0f Mbit/s each way, median of %d\n",
      gossip::to_string(codec), mbit, reps);
  std::printf(
      "  took: from both sides building their cores (encoding, hashing) to both done;\n"
      "  sent: from the later side's core being ready to both done\n");
  std::printf("  %10s %12s %10s %10s %8s %10s %8s\n", "tensor", "wire bytes", "bound s", "took s",
              "ratio", "sent s", "ratio");
  int rc = 0;
  int op_n = 0;
  for (auto bytes : sizes) {
    const std::size_t n = bytes / 4;
    std::vector<double> times, wire_times;
    std::uint64_t wire = 0;
    for (int r = 0; r < reps; ++r) {
      gossip::OpId op{};
      op[0] = static_cast<std::uint8_t>(++op_n);
      gossip::ExchangeOptions o;
      o.codec = codec;
      o.chunk_values = chunk_values;
      // Inputs are made before the clock starts; each side then builds its core (encoding
      // and hashing its tensor is part of the exchange) on its own thread, as two nodes would.
      std::vector<std::vector<float>> in_a{values(n, 1)}, in_b{values(n, 2)};
      std::promise<std::unique_ptr<gossip::Protocol>> pa, pb;
      auto fa = pa.get_future(), fb = pb.get_future();
      auto launch = [&](gossip::GossipRuntime& rt, const transport::Host& self,
                        std::vector<std::vector<float>>& in,
                        std::promise<std::unique_ptr<gossip::Protocol>>& done) {
        return std::async(std::launch::async, [&] {
          auto core = gossip::GroupExchange::create(
              op, self.id(), std::vector{a.id(), b.id()}, std::move(in), o,
              gossip::GossipRuntime::now()).value();
          const auto built = transport::Clock::now();
          rt.start(std::move(core), addrs,
                   [&](std::unique_ptr<gossip::Protocol> p) { done.set_value(std::move(p)); });
          return built;
        });
      };
      const auto t0 = transport::Clock::now();
      auto la = launch(*ra, a, in_a, pa), lb = launch(*rb, b, in_b, pb);
      const auto both_built = std::max(la.get(), lb.get());
      auto xa = fa.get(), xb = fb.get();
      const auto t1 = transport::Clock::now();
      times.push_back(bench::seconds_between(t0, t1));
      wire_times.push_back(bench::seconds_between(both_built, t1));
      auto& ea = static_cast<gossip::GroupExchange&>(*xa);
      auto& eb = static_cast<gossip::GroupExchange&>(*xb);
      if (ea.completed().size() != 1 || eb.completed().size() != 1) {
        std::fprintf(stderr, "exchange_bench: an exchange did not complete\n");
        rc = 1;
      }
      wire = std::max(ea.bytes_sent(), eb.bytes_sent());
    }
    const double bound = static_cast<double>(wire) / rate, took = bench::median(times),
                 sent = bench::median(wire_times);
    std::printf("  %10s %12llu %10.3f %10.3f %7.3fx %10.3f %7.3fx\n",
                bench::human_bytes(bytes).c_str(), static_cast<unsigned long long>(wire), bound,
                took, took / bound, sent, sent / bound);
  }
  ta.stop(Duration(5000));
  tb.stop(Duration(5000));
  return rc;
}
