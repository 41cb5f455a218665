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

// The roles and their options, as in the comment at the top of this file.
constexpr const char* kRoles =
    "  relay --listen IP:PORT                a relay; prints \"id HEX\"\n"
    "  sink --listen IP:PORT                 a receiver others dial; prints \"id HEX\" and\n"
    "                                        \"address IP:PORT\"\n"
    "  sink --relay IP:PORT --relay-id HEX   a receiver that accepts no connections: reserves\n"
    "                                        at the relay, prints its relay address\n"
    "  send --to ADDRESS --to-id HEX [--bytes N]\n"
    "                                        streams N bytes (default 256M)\n"
    "servers run until stdin closes";

// A node id in hex (64 digits); fails the arguments if it is not one.
NodeId parse_id(grove::bench::Args& args) {
  const std::string hex = args.value();
  NodeId id{};
  std::string addr;
  // A relay address names the id in hex: let its parser check this one.
  if (hex.size() != 64 || !parse_relay_address("relay:" + hex + "@x", id, addr))
    args.bad_value(hex, "a node id, 64 hex digits");
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  grove::bench::Args args(argc, argv, "relay|sink|send [options]", kRoles);
  const std::string role = args.positional("the role (relay, sink or send)");
  if (role != "relay" && role != "sink" && role != "send") args.fail("unknown role " + role);
  HostOptions o;
  o.listen = "";  // dial-only unless --listen names an address
  std::string relay, to;
  std::optional<NodeId> relay_id, to_id;
  std::uint64_t bytes = 256u << 20;
  while (args.next()) {
    if (args.is("--listen"))
      o.listen = args.value();
    else if (args.is("--relay"))
      relay = args.value();
    else if (args.is("--relay-id"))
      relay_id = parse_id(args);
    else if (args.is("--to"))
      to = args.value();
    else if (args.is("--to-id"))
      to_id = parse_id(args);
    else if (args.is("--bytes"))
      bytes = args.size();
    else
      args.unknown();
  }
  if (role == "sink" && o.listen.empty() && !relay_id)
    args.fail("sink needs --listen or --relay-id");
  if (role == "send" && !to_id) args.fail("send needs --to-id");
  HostThread ht;
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
      const NodeId rid = *relay_id;
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
  // Connect first (dial, and for a relay the circuit), then time the stream alone.
  std::promise<Result<PeerInfo>> c;
  h.connect(PeerRef::node(*to_id, to), [&](Result<PeerInfo> r) { c.set_value(std::move(r)); });
  auto peer = c.get_future().get();
  if (!peer) {
    std::fprintf(stderr, "relay_bench: connect failed: %s\n", peer.error().message().c_str());
    return 1;
  }
  std::promise<std::error_code> done;
  const auto t0 = std::chrono::steady_clock::now();
  h.send_stream(PeerRef::node(*to_id, to), "bench", Bytes(), std::make_shared<PatternSource>(bytes),
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
