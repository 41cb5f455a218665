// relay_bench: one stream, direct or through a relay (transport/relay.hpp), between processes
// that bench/netns_relay.sh puts in separate network namespaces on a shaped network. Roles:
//
//   relay_bench relay --listen IP:PORT              a relay; prints "id HEX"
//   relay_bench sink --listen IP:PORT               a receiver others dial; prints "id HEX" and
//                                                   "address IP:PORT"
//   relay_bench sink --relay IP:PORT --relay-id HEX  a receiver that accepts no connections:
//                                                   reserves at the relay, prints its relay address
//   relay_bench send --to ADDRESS --to-id HEX [--bytes N]
//                                                   streams N bytes (default 256M) and prints
//                                                   "sent N bytes in S s: X MB/s"
//
// Servers run until stdin closes. The sink checks every byte against the pattern.
#include <cstdio>
#include <future>
#include <iostream>

#include "bench/bench_common.hpp"

namespace {

using namespace grove::transport;
using grove::bench::HostThread;

std::uint8_t pattern(std::uint64_t i) {
  return static_cast<std::uint8_t>((i * 2654435761ull) >> 13);
}

class PatternSource : public StreamSource {
 public:
  explicit PatternSource(std::uint64_t n) : n_(n) {}
  std::uint64_t size() const override { return n_; }
  Result<void> read(std::uint64_t off, std::span<std::uint8_t> out) override {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = pattern(off + i);
    return {};
  }

 private:
  std::uint64_t n_;
};

class CheckingSink : public StreamSink {
 public:
  void on_data(Chunk c) override {
    const auto b = c.bytes();
    for (std::size_t i = 0; i < b.size(); ++i)
      if (b[i] != pattern(c.offset() + i)) bad_ = true;
  }
  void on_end(std::error_code ec) override {
    std::printf("received: %s%s\n", ec ? ec.message().c_str() : "ok",
                bad_ ? " (CORRUPTED BYTES)" : "");
    std::fflush(stdout);
  }

 private:
  bool bad_ = false;
};

NodeId parse_id(const std::string& hex) {
  NodeId id{};
  std::string addr;
  // A relay address names the id in hex: let its parser check this one.
  if (hex.size() != 64 || !parse_relay_address("relay:" + hex + "@x", id, addr)) {
    std::fprintf(stderr, "relay_bench: bad id '%s'\n", hex.c_str());
    std::exit(2);
  }
  return id;
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& def = "") {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: relay_bench relay|sink|send [options] (see the source)\n");
    return 2;
  }
  const std::string role = argv[1];
  HostThread ht;
  HostOptions o;
  o.listen = arg(argc, argv, "--listen");
  o.relay.bytes_per_sec = 0;  // the network is the limit here
  Host& h = ht.create(Identity::generate(), o);
  if (role == "sink")
    h.accept_streams(
        "bench", [](const PeerInfo&, IncomingStream&) { return std::make_shared<CheckingSink>(); });
  h.start();
  ht.run();
  std::printf("id %s\n", to_hex(h.id()).c_str());
  if (role == "relay" || role == "sink") {
    std::string me = h.address();
    if (role == "sink" && o.listen.empty()) {
      const std::string relay = arg(argc, argv, "--relay");
      const NodeId rid = parse_id(arg(argc, argv, "--relay-id"));
      std::promise<std::error_code> p;
      h.reserve_relay(PeerRef::node(rid, relay), [&](std::error_code ec) { p.set_value(ec); });
      if (auto ec = p.get_future().get()) {
        std::fprintf(stderr, "relay_bench: reservation failed: %s\n", ec.message().c_str());
        return 1;
      }
      me = relay_address(rid, relay);
    }
    std::printf("address %s\n", me.c_str());
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    return 0;
  }
  if (role != "send") return 2;
  const std::string to = arg(argc, argv, "--to");
  const NodeId to_id = parse_id(arg(argc, argv, "--to-id"));
  const auto bytes = grove::bench::parse_size(arg(argc, argv, "--bytes", "256M")).value_or(0);
  // Connect first (dial, and for a relay the circuit), then time the stream alone.
  std::promise<Result<PeerInfo>> c;
  h.connect(PeerRef::node(to_id, to), [&](Result<PeerInfo> r) { c.set_value(std::move(r)); });
  auto peer = c.get_future().get();
  if (!peer) {
    std::fprintf(stderr, "relay_bench: connect failed: %s\n", peer.error().message().c_str());
    return 1;
  }
  std::promise<std::error_code> done;
  const auto t0 = std::chrono::steady_clock::now();
  h.send_stream(PeerRef::node(to_id, to), "bench", Bytes(), std::make_shared<PatternSource>(bytes),
                [&](std::error_code ec) { done.set_value(ec); });
  const auto ec = done.get_future().get();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (ec) {
    std::fprintf(stderr, "relay_bench: stream failed: %s\n", ec.message().c_str());
    return 1;
  }
  std::printf("sent %llu bytes in %.3f s: %.2f MB/s (%s)\n", static_cast<unsigned long long>(bytes),
              s, double(bytes) / s / 1e6, peer->relayed ? "relayed" : "direct");
  return 0;
}
