// Experiment 1: how long one averaging step takes as the swarm grows.
//
// N nodes on a uniform WAN (every pair at --rtt-ms, --gbit up and down, --loss felt as TCP feels
// it: the Mathis bound on each flow's rate). The model has --params values sent in fp16. Two
// steps run with the real cores over sim::GossipNetwork:
//   noloco  every node in one of N/2 pairs, all pairs at once (GroupExchange of θ)
//   ring    one RingAllReduce of Δ over all N members (DiLoCo)
//   sparse  one RingAllGather of each member's top-64 of every 4096 values (SparseLoCo, fp32
//           values and u16 indices: 0.094 bytes a parameter a message), up to --gather-max
//   e3m0    the ring all-reduce with E3M0 4-bit partial sums and error feedback (E3M0 DiLoCo:
//           0.52 bytes a parameter an encoding, 2 (N − 1)/N encodings a member)
// An all-gather sends (N − 1) messages a member: it beats the fp16 ring while (N − 1) × its
// message is below 2 × the fp16 tensor, and loses to it past that.
// The nodes carry small tensors that stand for the model: each message's time on the wire is
// computed for its header plus its payload times params ÷ (values carried), so a 200 MB model
// costs what it would while the simulation holds a few kB per node. A third step, the binary
// tree all-reduce (reduce to a root, broadcast back), is not part of grove-node; it comes from
// the α–β cost model with the same α (one-way latency) and β (rate), in two forms:
//   tree-pipelined      chunks stream through the levels: 2·(log₂N·(α + c/B) + 2S/B)
//   tree-store-forward  each level receives the whole model before sending on:
//                       2·log₂N·(α + 2S/B)
// (the factor 2 in 2S/B: a parent receives from, or sends to, two children over one line).
// The α–β figures for the pair and the ring are printed beside the simulated ones as a check.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "gossip/allgather.hpp"
#include "gossip/allreduce.hpp"
#include "gossip/exchange.hpp"
#include "sim/experiments.hpp"
#include "sim/gossip_network.hpp"
#include "sim/net_model.hpp"

namespace grove::sim {

namespace {

using dht::Time;
using gossip::NodeId;

struct Setup {
  double rtt_ms, gbit, loss, params;
  std::uint64_t seed;
};

struct Outcome {
  double max_s = NAN, mean_s = NAN, wire_mb_per_node = NAN;
  std::size_t done = 0, failed = 0;
  std::uint64_t events = 0;
  double wall_s = 0;
};

gossip::OpId op_id(std::uint64_t a, std::uint64_t b) {
  gossip::OpId op{};
  for (int i = 0; i < 8; ++i) {
    op[i] = static_cast<std::uint8_t>(a >> (8 * i));
    op[8 + i] = static_cast<std::uint8_t>(b >> (8 * i));
  }
  return op;
}

// The effective rate of one flow: the line rate, capped by the Mathis bound under loss.
double flow_bytes_per_ms(const Setup& s) {
  return tcp_flow_rate(NetModel::bytes_per_ms(s.gbit * 1000), s.rtt_ms, s.loss);
}

enum class Step { pair, ring, sparse, e3m0 };

Outcome simulate(const Setup& s, std::size_t n, Step step) {
  const bool ring = step == Step::ring || step == Step::e3m0;
  const bool gather = step == Step::sparse;
  const auto wall0 = std::chrono::steady_clock::now();
  GossipLinkModel link;
  link.latency = Time(static_cast<std::int64_t>(std::llround(s.rtt_ms / 2)));
  link.bytes_per_ms = NetModel::bytes_per_ms(s.gbit * 1000);
  link.loss = s.loss;
  GossipNetwork net(s.seed + n * 4 + static_cast<std::size_t>(step), link);
  // Values each node carries: the ring needs a segment per member; a few per member are enough
  // (an all-gather: one top-k chunk, one piece; E3M0: a 256-value block a segment, so that its
  // per-block scales weigh what they do in a large model).
  const std::size_t carried = step == Step::e3m0 ? 256 * n
                              : ring             ? std::max<std::size_t>(256, n * 8)
                                                 : 4096;
  const double scale = s.params / static_cast<double>(carried);
  net.set_payload_scale(scale);
  std::vector<NodeId> ids;
  for (std::size_t i = 0; i < n; ++i) ids.push_back(net.add_node());
  std::map<NodeId, double> finished;  // node → seconds
  std::size_t failed = 0;
  const Time t0 = net.now();
  net.set_on_finished([&](const NodeId& id, std::unique_ptr<gossip::Protocol> p) {
    finished[id] = std::chrono::duration<double>(net.now() - t0).count();
    if (auto* ar = dynamic_cast<gossip::RingOp*>(p.get()))
      failed += ar->status() != gossip::OpStatus::done;
    if (auto* ex = dynamic_cast<gossip::GroupExchange*>(p.get())) failed += ex->completed().empty();
  });
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto tensor = [&] {
    std::vector<float> v(carried);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  const Time patient = Time(std::int64_t{1} << 40);  // the step's own length is what we measure
  if (gather) {
    gossip::AllGatherOptions o;
    o.codec.kind = gossip::WireCodec::topk;
    o.codec.topk = {4096, 64, false};
    o.piece_values = 4096;
    o.timers.chunk_timeout = patient;
    o.timers.total_timeout = patient;
    o.timers.linger = patient;
    o.timers.heartbeat = Time(5000);
    for (std::size_t i = 0; i < n; ++i)
      net.attach(ids[i],
                 gossip::RingAllGather::create(op_id(3, n), ids[i], ids, tensor(), o, t0).value());
  } else if (ring) {
    gossip::AllReduceOptions o;
    o.chunk_values = 256;
    if (step == Step::e3m0) {
      o.codec = gossip::WireCodec::e3m0;
      o.residual = true;
    }
    o.chunk_timeout = patient;
    o.total_timeout = patient;
    o.linger = patient;
    o.heartbeat = Time(5000);
    for (std::size_t i = 0; i < n; ++i)
      net.attach(ids[i],
                 gossip::RingAllReduce::create(op_id(1, n), ids[i], ids, tensor(), o, t0).value());
  } else {
    gossip::ExchangeOptions o;
    o.chunk_values = 256;
    o.chunk_timeout = patient;
    o.total_timeout = patient;
    o.heartbeat = Time(5000);
    o.max_norm_ratio = 1e9;
    for (std::size_t i = 0; i + 1 < n; i += 2) {
      const std::vector<NodeId> pair{ids[i], ids[i + 1]};
      for (std::size_t k = 0; k < 2; ++k)
        net.attach(pair[k],
                   gossip::GroupExchange::create(op_id(2, i), pair[k], pair,
                                                 std::vector<std::vector<float>>{tensor()}, o, t0)
                       .value());
    }
  }
  const std::size_t expect = ring || gather ? n : n - n % 2;
  net.run_until([&] { return finished.size() >= expect; }, Time(std::int64_t{1} << 40));
  Outcome out;
  out.done = finished.size();
  out.failed = failed;
  out.events = net.events();
  double sum = 0, mx = 0, wire = 0;
  for (const auto& [id, t] : finished) {
    sum += t;
    mx = std::max(mx, t);
    wire += net.wire_bytes_sent(id);
  }
  if (!finished.empty()) {
    out.max_s = mx;
    out.mean_s = sum / static_cast<double>(finished.size());
    out.wire_mb_per_node = wire / static_cast<double>(finished.size()) / 1e6;
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

}  // namespace

int run_sync_time(const Args& a, const std::string& out) {
  Setup s;
  s.rtt_ms = a.num("rtt-ms", 50);
  s.gbit = a.num("gbit", 1);
  s.loss = a.num("loss", 0.01);
  s.params = a.num("params", 100e6);
  s.seed = a.count("seed", 1);
  const auto ns = a.list("nodes", {16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
  const double ring_max = a.num("ring-max", 4096);     // larger rings: α–β figure only
  const double gather_max = a.num("gather-max", 256);  // (N² messages: simulated up to here)
  if (s.rtt_ms <= 0 || s.gbit <= 0 || s.loss < 0 || s.loss >= 1 || s.params < 1)
    throw std::invalid_argument("sync-time: need rtt-ms > 0, gbit > 0, 0 <= loss < 1, params >= 1");
  for (double n : ns)
    if (n < 2 || n != std::floor(n) || n > 65536)
      throw std::invalid_argument("--nodes: each N must be a whole number in 2..65536");

  const double S = s.params * 2;                 // fp16 bytes
  const double B = flow_bytes_per_ms(s) * 1000;  // bytes per second
  const double alpha = s.rtt_ms / 2 / 1000;      // seconds
  const double c = (1u << 18) * 2;               // a chunk of 2^18 fp16 values
  std::printf(
      "sync-time: %.0fM parameters in fp16 (%.0f MB), RTT %.0f ms, %.2f Gbit/s lines, loss %.3g "
      "→ %.1f Mbit/s per TCP flow\n",
      s.params / 1e6, S / 1e6, s.rtt_ms, s.gbit, s.loss, B * 8 / 1e6);
  Csv csv(out + "/sync_time.csv",
          {"nodes", "noloco_s", "noloco_mean_s", "ring_s", "ring_mean_s", "noloco_model_s",
           "ring_model_s", "tree_pipelined_s", "tree_store_forward_s", "noloco_mb_per_node",
           "ring_mb_per_node", "ring_failed", "noloco_failed", "sparseloco_s",
           "sparseloco_mb_per_node", "e3m0_s", "e3m0_mb_per_node", "gather_failed", "sim_wall_s"});
  std::printf("%6s %12s %12s %12s %12s %14s %10s %14s %10s %10s\n", "N", "noloco (s)", "ring (s)",
              "ring/noloco", "tree-pipe (s)", "tree-s&f (s)", "tree/nolo", "sparseloco (s)",
              "e3m0 (s)", "wall (s)");
  for (double nd : ns) {
    const auto n = static_cast<std::size_t>(nd);
    const double logn = std::ceil(std::log2(nd));
    const double pair_model = alpha + S / B;
    const double ring_model = 2 * (nd - 1) * (alpha + S / (nd * B));
    const double tree_pipe = 2 * (logn * (alpha + c / B) + 2 * S / B);
    const double tree_sf = 2 * logn * (alpha + 2 * S / B);
    const Outcome pair = simulate(s, n, Step::pair);
    Outcome ring, sparse, e3m0;
    if (nd <= ring_max) ring = simulate(s, n, Step::ring);
    if (nd <= gather_max) {  // (E3M0: 256 × N values a node)
      sparse = simulate(s, n, Step::sparse);
      e3m0 = simulate(s, n, Step::e3m0);
    }
    const double wall = pair.wall_s + ring.wall_s + sparse.wall_s + e3m0.wall_s;
    std::printf("%6zu %12.1f %12.1f %12.2f %12.1f %14.1f %10.1f %14.1f %10.1f %10.1f\n", n,
                pair.max_s, ring.max_s, ring.max_s / pair.max_s, tree_pipe, tree_sf,
                tree_sf / pair.max_s, sparse.max_s, e3m0.max_s, wall);
    std::fflush(stdout);
    csv.row({std::to_string(n), fmt(pair.max_s), fmt(pair.mean_s), fmt(ring.max_s),
             fmt(ring.mean_s), fmt(pair_model), fmt(ring_model), fmt(tree_pipe), fmt(tree_sf),
             fmt(pair.wire_mb_per_node), fmt(ring.wire_mb_per_node),
             std::to_string(ring.failed + e3m0.failed), std::to_string(pair.failed),
             fmt(sparse.max_s), fmt(sparse.wire_mb_per_node), fmt(e3m0.max_s),
             fmt(e3m0.wire_mb_per_node), std::to_string(sparse.failed), fmt(wall, 3)});
  }
  std::printf("csv: %s\n", csv.path().c_str());
  plot("sync-time", csv.path(), out + "/sync_time.png");
  return 0;
}

}  // namespace grove::sim
