#include "node/node.hpp"

#include <cstdio>
#include <random>

#include <spdlog/spdlog.h>

#include "node/checkpoint.hpp"
#include "node/checkpoint_writer.hpp"
#include "node/collectives.hpp"
#include "node/console.hpp"
#include "node/contacts.hpp"
#include "node/external_workload.hpp"
#include "node/metrics.hpp"
#include "node/network.hpp"
#include "node/servers.hpp"
#include "node/state_files.hpp"
#include "node/swarm_key.hpp"
#include "node/training_loop.hpp"
#include "node/workload.hpp"
#include "transport/crypto.hpp"
#include "transport/identity.hpp"

namespace grove::node {

using transport::ConfigError;

namespace {

std::string random_nonce() {
  std::random_device rd;
  char b[17];
  std::snprintf(b, sizeof b, "%08x%08x", rd(), rd());
  return b;
}

gossip::RoundOptions round_options(const RunConfig& c, const CliOptions& cli, std::size_t params,
                                   const std::filesystem::path& state_dir,
                                   optim::FloatAllocator floats) {
  gossip::RoundOptions o;
  // A large state is snapshotted at the checkpoints' cadence (the training loop asks for the
  // checkpoints' own), not every round: a snapshot writes and hashes 8 bytes a parameter. The
  // snapshot served to joiners is then at most that old (and a round).
  if (large_state(params))
    o.snapshot_every = dht::Time(std::uint64_t{cli.checkpoint_minutes.value_or(10)} * 60'000);
  // The snapshots served to joiners, the state being downloaded, φ and the momentum: files, not
  // memory.
  o.blobs = state_files(state_dir / "blobs");
  o.floats = std::move(floats);
  o.mode = c.outer;
  o.noloco.alpha = c.noloco_alpha;
  o.noloco.beta = c.noloco_beta;
  o.noloco.gamma = c.noloco_gamma;
  o.noloco.lookahead = c.noloco_lookahead;
  o.noloco.nesterov = c.noloco_nesterov != 0;
  o.noloco.warmup = c.noloco_warmup;
  o.noloco_group = c.noloco_group;
  o.diloco.lr = c.outer_lr;
  o.diloco.momentum = c.outer_momentum;
  o.diloco.warmup = c.outer_warmup;
  o.fragments = c.fragments;
  const auto codec = c.codec;
  o.exchange.codec = codec;
  // The all-reduce sums partial results: a 4-bit code cannot carry them (compressed rounds
  // all-gather each member's message instead; the all-reduce is left for rounds that average φ).
  o.allreduce.codec = codec == gossip::WireCodec::e3m0 ? gossip::WireCodec::fp16 : codec;
  if (c.compressed_rounds())
    o.compressed = c.sparseloco ? gossip::CompressedRounds::sparseloco(
                                      c.topk_chunk, c.topk, c.topk_bits == 2, c.error_decay)
                                : gossip::CompressedRounds::e3m0();
  o.threads = cli.threads;
  // The window and its margins scale together: a record must be out a quarter window before the
  // close, and the read waits a little for records to spread.
  o.match.window = dht::Time(c.window_ms);
  o.match.min_lead = dht::Time(std::min<std::uint32_t>(2000, c.window_ms / 4));
  o.match.settle = dht::Time(std::clamp<std::uint32_t>(c.window_ms * 3 / 20, 300, 1500));
  o.match.patience = dht::Time(0);  // the controller sets it from the measured inner phase
  o.mode_poll = dht::Time(std::min<std::uint32_t>(5000, c.window_ms));
  return o;
}

}  // namespace

// Fields are set by the constructor (main thread) before any other thread could read them; later
// on, `stopping` is the only field two threads share (the signal handler writes it), `reports` is
// thread-safe, and the rest belongs to the training thread (run()).
struct Node::Impl {
  CliOptions o;
  std::filesystem::path state_dir;
  optim::FloatAllocator floats;  ///< φ, the momentum: pages of files in state_dir/blobs
  std::optional<transport::SwarmKey> swarm_key;
  std::optional<Checkpoint> resume;
  RunConfig config;
  std::string run_name;
  StartKind start_kind = StartKind::join;
  bool rejoined = false;  ///< resumed without --peer: a saved contact or a LAN node answered
  std::atomic<bool> stopping{false};
  ReportQueue reports;
  std::shared_ptr<StatusBoard> board;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<CheckpointWriter> checkpoints;
  Console console;
  std::unique_ptr<Network> net;
  std::unique_ptr<Servers> servers;
  std::unique_ptr<ExternalWorkload> external_owner;  // until the run is fixed, then `workload`
  ExternalWorkload* external = nullptr;
  std::unique_ptr<Workload> workload;
  std::shared_ptr<dht::Membership> members;
  std::shared_ptr<gossip::RoundRuntime> round;
  std::unique_ptr<Collectives> collectives;  // the trainer's per-step calls (external workloads)

  explicit Impl(CliOptions opts) : o(std::move(opts)), console(o.progress) {}
  ~Impl() {
    if (checkpoints) checkpoints->stop();
    if (net) net->shutdown();
  }
  void start();
  void open_trainer_socket();
};

Node::Node(CliOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {
  impl_->start();
}

Node::~Node() = default;

void Node::stop() {
  impl_->stopping = true;
  impl_->reports.wake();
}

int Node::run() {
  auto& m = *impl_;
  std::string join_command;
  if (m.start_kind == StartKind::bootstrap) {
    join_command = "grove-node --peer " + m.net->advertise();
    if (m.swarm_key) join_command += " --swarm-key " + m.swarm_key->hex();
    if (!m.o.data.empty()) join_command += " --data YOUR_TEXT_FILES";
  }
  TrainingSetup s{m.o,          m.config,       m.run_name,
                  m.start_kind, join_command,   *m.workload,
                  m.external,   m.resume,       *m.net,
                  m.members,    m.round,        *m.board,
                  *m.metrics,   *m.checkpoints, m.console,
                  m.reports,    m.stopping,     m.floats,
                  m.state_dir,  m.rejoined,     m.collectives.get()};
  return run_training(s);
}

void Node::Impl::start() {
  state_dir = o.state_dir.empty() ? default_state_dir() : o.state_dir;
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) throw ConfigError("state dir '" + state_dir.string() + "': " + ec.message());
  const auto identity = transport::Identity::load_or_create(state_dir);
  floats = float_pages(state_dir / "blobs");

  {
    auto k = choose_swarm_key(o, state_dir);
    swarm_key = std::move(k.key);
    if (swarm_key)
      spdlog::info("swarm key: {}", k.how);
    else if (o.bootstrap)
      spdlog::warn(
          "an open swarm (--open): anyone who can reach a member can join it and average into "
          "its model");
    else
      spdlog::info(
          "no swarm key: this node can join an open swarm only (a closed one needs "
          "--swarm-key from its bootstrap's join command)");
  }

  auto loaded = load_latest(state_dir, std::uint64_t{64} << 30, floats);
  if (!loaded.skipped.empty()) spdlog::warn("checkpoint: {}", loaded.skipped);
  resume = std::move(loaded.checkpoint);
  if (resume) {
    auto c = parse_run_config(resume->config_text);
    if (!c)
      throw ConfigError("checkpoint in '" + state_dir.string() +
                        "' names a bad run config: " + c.why());
    config = *c;
    run_name = config.run_name();
    if (o.run && *o.run != run_name)
      throw ConfigError("the checkpoint in '" + state_dir.string() + "' belongs to run " +
                        run_name + ", not " + *o.run + " (use another --state-dir)");
  }
  metrics = std::make_unique<Metrics>(o.metrics);
  board = std::make_shared<StatusBoard>(transport::to_hex(identity.id()).substr(0, 16));
  checkpoints = std::make_unique<CheckpointWriter>(
      state_dir, [b = board](bool busy) { b->set_checkpointing(busy); });

  // Port 0 ("any"): the port of our last run when it is free, so that the contacts and DHT
  // tables of the swarm that name us still reach us after a restart.
  o.listen = sticky_listen(o.listen, state_dir);
  net = std::make_unique<Network>(o, identity, swarm_key, [&](const auto& host) {
    servers = std::make_unique<Servers>(host, board);
  });
  {
    // `grove-node status` on this machine finds the node here.
    const std::string a = net->advertise() + "\n";
    if (auto e = write_file_atomically(state_dir / "node.addr",
                                       {reinterpret_cast<const std::uint8_t*>(a.data()), a.size()}))
      spdlog::warn("could not write {}: {}", (state_dir / "node.addr").string(), e.message());
  }
  remember_port(state_dir, net->host()->address());
  net->bootstrap(o.peers);

  if (resume) {
    start_kind = StartKind::resume;
    if (o.peers.empty()) {
      // Restarted without --peer: back into the swarm through the members it knew (or the LAN),
      // catching up before it trains; alone only when nobody answers.
      const auto contacts = load_contacts(state_dir);
      rejoined = net->rejoin(contacts, std::chrono::seconds(10), stopping);
      if (!rejoined)
        spdlog::warn(
            "resumed without --peer and no member of the swarm answered ({} saved contacts, "
            "{}): training alone from the checkpoint, a swarm of one until others join",
            contacts.size(), net->lan_discovery() ? "nobody on the LAN" : "LAN discovery off");
    }
  } else if (o.bootstrap) {
    start_kind = StartKind::bootstrap;
    config = o.config;
    config.nonce = random_nonce();
    if (config.workload == WorkloadKind::external) {
      // The first trainer fixes the model (and chooses the algorithm) of the new run.
      open_trainer_socket();
      auto hello = external_owner->wait_for_first_trainer();
      if (!hello) throw ConfigError("stopped while waiting for a trainer");
      apply_hello(*hello, config);
    }
    if (auto e = config.check(); !e.empty()) throw ConfigError("run config: " + e);
    run_name = config.run_name();
  } else {
    std::tie(run_name, config) = net->find_run(o.run, stopping);
  }
  // Every member publishes the run's config (its own signed copy), so it outlives the bootstrap,
  // and refreshes it while it runs.
  net->publish_run(config);
  // Can other nodes connect to us? Asked before we advertise anything to the run.
  if (!o.bootstrap) net->check_reach_now();

  WorkloadSpec spec;
  spec.config = config;
  spec.data_files = o.data;
  spec.node_seed = seed_of(identity.id());
  spec.threads = o.threads;
  if (config.workload == WorkloadKind::external) {
    if (!external_owner) open_trainer_socket();
    external_owner->bind(config, run_name);
    external = external_owner.get();
    workload = std::move(external_owner);
  } else {
    workload = make_workload(spec);
  }

  dht::MemberInfo self;
  std::tie(self.addresses, self.reach) = net->advertised();
  self.run_id = run_name;
  self.status = "joining";
  members = net->dht()->join(run_name, dht::MembershipOptions{}, self);
  round = gossip::RoundRuntime::create(
      net->host(), net->dht(), net->gossip(), members, net->state_server(), run_name,
      self.addresses, round_options(config, o, workload->num_params(), state_dir, floats),
      [this](gossip::RoundReport&& r) { reports.push(std::move(r)); });
  net->attach(members, round, *servers);
  if (external || config.demo)
    collectives = std::make_unique<Collectives>(
        net->gossip(), net->dht(), members, net->host()->id(), run_name, Collectives::Options{});
  net->on_signal([this](int sig) {
    spdlog::info("signal {}: finishing the round in flight, then leaving", sig);
    stopping = true;
    reports.wake();
  });
}

// The socket a training script attaches to (an external workload), announced on stdout.
void Node::Impl::open_trainer_socket() {
  const std::string path =
      o.trainer_socket.empty() ? (state_dir / "trainer.sock").string() : o.trainer_socket;
  ExternalWorkload::Options eo;
  eo.socket_path = path;
  eo.shm_name = "/grove-" + transport::to_hex(net->host()->id()).substr(0, 16);
  eo.stopping = [this] { return stopping.load(); };
  eo.state_file = (state_dir / "trainer.state").string();
  eo.on_state = [this](const std::string& s) {
    board->update([&](MemberStatus& me) { me.status = s; });
    // Without a trainer this member trains nothing: its record says so (the others do not wait
    // for it to form a group).
    if (round)
      round->with_engine([idle = s != "training"](gossip::RoundEngine& e) { e.set_idle(idle); });
  };
  eo.collective = [this](const TrainerCollective& c, optim::Floats input,
                         optim::FloatAllocator out) {
    if (!collectives) {
      CollectiveOutcome r;
      r.why = "the node has not joined its run yet";
      return r;
    }
    const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(c.timeout_s * 1000));
    const auto halt = [this] { return stopping.load(); };
    if (c.kind == CollectiveKind::send || c.kind == CollectiveKind::recv)
      return collectives->transfer(c.kind == CollectiveKind::send, c.peer, std::move(input),
                                   timeout, halt);
    gossip::CallSpec spec;
    switch (c.kind) {
      case CollectiveKind::all_reduce:
        spec.kind = gossip::CallSpec::Kind::all_reduce;
        break;
      case CollectiveKind::all_gather:
        spec.kind = gossip::CallSpec::Kind::all_gather;
        break;
      default:
        spec.kind = gossip::CallSpec::Kind::barrier;
        break;
    }
    spec.mean = c.mean;
    spec.wire = c.wire;
    spec.min_size = c.min_size;
    return collectives->run(spec, std::move(input), std::move(out), timeout, halt);
  };
  external_owner = std::make_unique<ExternalWorkload>(eo);
  console.trainer_socket(path);
}

}  // namespace grove::node
