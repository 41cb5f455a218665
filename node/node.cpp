#include "node/node.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "gossip/round_runtime.hpp"
#include "node/checkpoint.hpp"
#include "node/external_workload.hpp"
#include "node/port_mapping.hpp"
#include "node/status.hpp"
#include "node/workload.hpp"
#include "optim/outer.hpp"
#include "transport/crypto.hpp"
#include "transport/identity.hpp"
#include "transport/reach.hpp"
#include "transport/relay.hpp"

namespace grove::node {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using transport::ConfigError;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr const char* kRunsKey = "grove-runs";
constexpr dht::Time kRunRecordTtl{23 * 3600 * 1000};
constexpr auto kRunRecordRefresh = std::chrono::hours(6);  // well inside the TTL

// Runs fn on `ex` and waits for its result (start-up and shutdown only; never on the strand).
template <class F>
auto on_strand(const asio::any_io_executor& ex, F fn) {
  using R = decltype(fn());
  std::promise<R> p;
  auto fut = p.get_future();
  asio::post(ex, [&] {
    try {
      if constexpr (std::is_void_v<R>) {
        fn();
        p.set_value();
      } else {
        p.set_value(fn());
      }
    } catch (...) {
      p.set_exception(std::current_exception());
    }
  });
  return fut.get();
}

// The address peers should dial: the listen address, unless it is a wildcard; then the local
// address that routes to the first peer, or the first non-loopback IPv4 address, or loopback.
std::string advertise_address(const std::string& bound, const std::vector<std::string>& peers) {
  const auto colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon), port = bound.substr(colon + 1);
  if (host != "0.0.0.0" && host != "::" && host != "[::]") return bound;
  std::string ip;
  if (!peers.empty()) {
    const auto pc = peers.front().rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(peers.front().substr(pc + 1))));
    if (::inet_pton(AF_INET, peers.front().substr(0, pc).c_str(), &sa.sin_addr) == 1) {
      const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        sockaddr_in local{};
        socklen_t len = sizeof local;
        if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
          char b[INET_ADDRSTRLEN];
          if (::inet_ntop(AF_INET, &local.sin_addr, b, sizeof b)) ip = b;
        }
        ::close(fd);
      }
    }
  }
  if (ip.empty()) {
    ifaddrs* ifs = nullptr;
    if (::getifaddrs(&ifs) == 0) {
      for (auto* i = ifs; i && ip.empty(); i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
        char b[INET_ADDRSTRLEN];
        const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
        if (::inet_ntop(AF_INET, &a->sin_addr, b, sizeof b)) ip = b;
      }
      ::freeifaddrs(ifs);
    }
  }
  if (ip.empty()) ip = "127.0.0.1";
  return ip + ":" + port;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "(none)" : out;
}

// The addresses a node without --advertise has checked: the one advertise_address() picked and,
// when it listens on the IPv6 wildcard (IPv6 and IPv4), its first address of the other family
// (a global IPv6 one, or a non-loopback IPv4 one) with the same port: a helper checks one
// address of the other family too, and nodes that have only that family can then dial us.
std::vector<std::string> local_candidates(const std::string& bound, const std::string& advertise) {
  std::vector<std::string> out{advertise};
  const auto colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon), port = bound.substr(colon + 1);
  if (host != "::" && host != "[::]") return out;
  const int want = advertise.starts_with("[") ? AF_INET : AF_INET6;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (auto* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != want) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char b[INET6_ADDRSTRLEN];
    if (want == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr) || IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) continue;
      if (!::inet_ntop(AF_INET6, &a->sin6_addr, b, sizeof b)) continue;
      out.push_back("[" + std::string(b) + "]:" + port);
    } else {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (!::inet_ntop(AF_INET, &a->sin_addr, b, sizeof b)) continue;
      out.push_back(std::string(b) + ":" + port);
    }
    break;
  }
  ::freeifaddrs(ifs);
  return out;
}

std::string random_nonce() {
  std::random_device rd;
  char b[17];
  std::snprintf(b, sizeof b, "%08x%08x", rd(), rd());
  return b;
}

std::uint64_t seed_of(const transport::NodeId& id) {
  std::uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s = (s << 8) | id[static_cast<std::size_t>(i)];
  return s;
}

gossip::RoundOptions round_options(const RunConfig& c, unsigned threads) {
  gossip::RoundOptions o;
  o.mode = c.outer == OuterKind::diloco ? gossip::OuterMode::diloco : gossip::OuterMode::noloco;
  o.noloco.alpha = c.noloco_alpha;
  o.noloco.beta = c.noloco_beta;
  o.noloco.gamma = c.noloco_gamma;
  o.diloco.lr = c.outer_lr;
  o.diloco.momentum = c.outer_momentum;
  const auto codec = [&] {
    switch (c.codec) {
      case Codec::fp32:
        return gossip::WireCodec::fp32;
      case Codec::bf16:
        return gossip::WireCodec::bf16;
      case Codec::e3m0:
        return gossip::WireCodec::e3m0;
      case Codec::fp16:
        break;
    }
    return gossip::WireCodec::fp16;
  }();
  o.exchange.codec = codec;
  // The all-reduce sums partial results: a 4-bit code cannot carry them.
  o.allreduce.codec = codec == gossip::WireCodec::e3m0 ? gossip::WireCodec::fp16 : codec;
  o.threads = threads;
  // The window and its margins scale together: a record must be out a quarter window before the
  // close, and the read waits a little for records to spread.
  o.match.window = dht::Time(c.window_ms);
  o.match.min_lead = dht::Time(std::min<std::uint32_t>(2000, c.window_ms / 4));
  o.match.settle = dht::Time(std::clamp<std::uint32_t>(c.window_ms * 3 / 20, 300, 1500));
  o.match.patience = dht::Time(0);  // set from the measured inner phase (see train())
  o.mode_poll = dht::Time(std::min<std::uint32_t>(5000, c.window_ms));
  return o;
}

}  // namespace

struct Node::Impl {
  CliOptions o;
  std::filesystem::path state_dir;
  std::optional<transport::SwarmKey> swarm_key;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread io_thread;
  std::shared_ptr<transport::Host> host;
  std::shared_ptr<dht::DhtRuntime> dht;
  std::shared_ptr<gossip::GossipRuntime> gossip;
  std::shared_ptr<gossip::StateServer> server = std::make_shared<gossip::StateServer>();
  std::shared_ptr<dht::Membership> members;
  std::shared_ptr<gossip::RoundRuntime> round;
  std::unique_ptr<Workload> workload;
  // An external workload (the user's trainer, node/external_workload.hpp): owned here until the
  // run is fixed, then by `workload`; `external` keeps a view for the goodbye.
  std::unique_ptr<ExternalWorkload> external_owner;
  ExternalWorkload* external = nullptr;
  std::optional<asio::signal_set> signals;
  std::optional<asio::steady_timer> run_timer;    // re-publishes the run record
  std::optional<asio::steady_timer> reach_timer;  // re-checks our reachability
  RunConfig config;
  std::string run_name, advertise;
  // Reachability (host strand): the addresses we ask peers to dial back, the ones they reached
  // (what we advertise), and the verdict as the member record carries it (0 not checked,
  // 1 reachable, 2 not: we take part over the connections we open).
  std::vector<std::string> candidates, addresses;
  std::uint8_t reach = 0;
  bool reach_checking = false;
  bool recheck_soon = false;  // a candidate changed while a check was under way
  SteadyClock::time_point last_reach_check{};
  static constexpr std::chrono::seconds kReachRetry{11};  // helpers: one check per 10 s
  // UPnP (node/port_mapping.hpp): the home router's mapping to us, a candidate like the others.
  std::unique_ptr<PortMapper> upnp;
  std::string upnp_address;  // host strand
  // An unreachable node's relays (host strand): reachable members holding a reservation for us,
  // the ones that refused (not asked again for a while), and the timer that renews them.
  std::vector<std::pair<transport::NodeId, std::string>> relays;
  std::map<transport::NodeId, SteadyClock::time_point> relay_refused;
  std::optional<asio::steady_timer> relay_timer;
  bool relays_busy = false;
  std::optional<Checkpoint> resume;
  bool fresh_bootstrap = false;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<gossip::RoundReport> reports;
  std::atomic<bool> stopping{false};
  // Set once members and round exist (the request handlers run before that and must not read
  // them until then).
  std::atomic<bool> stack_ready{false};

  // Progress (training thread), published for status.
  std::uint64_t step = 0, tokens = 0, rounds = 0;
  double loss_ema = NAN, last_eval = NAN;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::ofstream metrics;
  SteadyClock::time_point started = SteadyClock::now();
  // What "status" answers: written by the training thread, read on the host strand.
  std::mutex status_mu;
  MemberStatus me;
  double round_time_sum = 0;
  std::uint64_t round_count = 0;
  // For the live line and the final summary (training thread).
  double compute_s = 0, eval_s = 0, sync_ms_sum = 0, first_eval = NAN;
  std::uint64_t rounds_averaged = 0, rounds_local = 0, syncs = 0;
  std::size_t live_members = 1;
  // Of the last round (every metrics line carries them): partners as JSON strings, its sync
  // time, and the hash of the slow weights since.
  std::string last_partners, param_hash;
  long long last_sync_ms = 0;
  std::string last_sync;  // "with ab12cd34 840 ms 1.2 MB", for the live line
  bool tty = ::isatty(STDOUT_FILENO) != 0;
  SteadyClock::time_point last_live{};

  explicit Impl(CliOptions opts) : o(std::move(opts)) {}
  ~Impl() { shutdown(); }

  void start();
  void evaluate();
  void live_line(std::uint64_t phase_tokens, SteadyClock::time_point phase_start);
  void summary(SteadyClock::time_point training_since);
  void publish_run();
  void find_run();
  void check_reach(std::function<void()> done);
  void apply_reach(const transport::ReachCheck::Verdict& v);
  void schedule_reach_check(std::chrono::seconds after);
  void on_port_mapped(std::string external);
  void maintain_relays();
  std::vector<std::string> relay_addresses() const {
    std::vector<std::string> v;
    for (const auto& [id, addr] : relays) v.push_back(transport::relay_address(id, addr));
    return v;
  }
  void set_addresses(std::vector<std::string> now);
  void open_trainer_socket();
  int train();
  void shutdown();
  void on_report(const gossip::RoundReport& r) {
    {
      std::lock_guard lk(mu);
      reports.push_back(r);
    }
    cv.notify_all();
  }
  // Waits for the next report; nullopt at the deadline, or at a stop request when `stop_wakes`.
  std::optional<gossip::RoundReport> next_report(SteadyClock::duration limit,
                                                 bool stop_wakes = true) {
    std::unique_lock lk(mu);
    const auto deadline = SteadyClock::now() + limit;
    cv.wait_until(lk, deadline,
                  [&] { return !reports.empty() || (stop_wakes && stopping.load()); });
    if (reports.empty()) return std::nullopt;
    auto r = std::move(reports.front());
    reports.pop_front();
    return r;
  }
  void event(const std::string& name, const std::string& extra = {}) {
    if (!metrics.is_open()) return;
    const auto now = std::chrono::system_clock::now();
    const double t = std::chrono::duration<double>(now.time_since_epoch()).count();
    metrics << "{\"time\":" << std::to_string(t)
            << ",\"node\":" << json_string(transport::to_hex(host->id()).substr(0, 16))
            << ",\"event\":" << json_string(name) << ",\"step\":" << step << ",\"round\":" << rounds
            << ",\"loss\":" << json_number(loss_ema) << ",\"eval_loss\":" << json_number(last_eval)
            << ",\"partners\":[" << last_partners << "],\"bytes_sent\":" << bytes_sent
            << ",\"bytes_received\":" << bytes_received << ",\"sync_ms\":" << last_sync_ms
            << ",\"members\":" << live_members << ",\"param_hash\":" << json_string(param_hash)
            << extra << "}\n";
    metrics.flush();
  }
  void publish_status(const std::string& status) {
    std::lock_guard lk(status_mu);
    me.status = status;
    me.run = run_name;
    me.address = addresses.empty() ? std::string() : addresses.front();
    me.step = step;
    me.round = rounds;
    me.loss = loss_ema;
    me.eval_loss = last_eval;
    me.loss_floor = workload ? workload->loss_floor() : NAN;
    me.bytes_sent = bytes_sent;
    me.bytes_received = bytes_received;
    me.round_s = round_count ? round_time_sum / static_cast<double>(round_count) : NAN;
    me.uptime_s = std::chrono::duration<double>(SteadyClock::now() - started).count();
  }
  MemberStatus my_status() {
    std::lock_guard lk(status_mu);
    me.uptime_s = std::chrono::duration<double>(SteadyClock::now() - started).count();
    return me;
  }
  void serve_status();
  void serve_requests();
  // What a checkpoint takes from the round engine: its round and its state as the snapshot it
  // serves to joiners (shared bytes: nothing model-sized is copied; the node's engine always
  // serves, and while a step runs these are still the state of its round).
  struct EngineView {
    std::uint64_t round = 0;
    std::shared_ptr<const std::vector<std::uint8_t>> bytes;
  };
  static EngineView view_of(const gossip::RoundEngine& e) {
    return {e.state().round, e.state_bytes()};
  }
  Checkpoint make_checkpoint(EngineView v) {
    Checkpoint c;
    c.config_text = config.to_text();
    c.step = step;
    c.round = v.round;
    c.tokens = tokens;
    c.outer_bytes = std::move(v.bytes);
    c.workload = workload->save();
    return c;
  }
  void write_checkpoint(const Checkpoint& c) {
    const auto t0 = SteadyClock::now();
    if (auto ec = save_checkpoint(state_dir, c)) {
      spdlog::error("checkpoint not written ({}); the previous one stays", ec.message());
      return;
    }
    const double s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::lock_guard lk(ckpt_mu);
    ++ckpt_written;
    ckpt_s += s;
  }

  // Checkpoints are written by a thread of their own, so that training does not stop for the
  // write and fsync (0.3-0.5 s a round for 3M parameters, seconds for 100M): a node killed at
  // any instant resumes from the last round whose checkpoint was complete, at most two rounds
  // back (one being written, the next waiting). A round that ends while one waits takes its
  // place (the waiting one is skipped). The snapshot bytes are shared with the round engine, so
  // a waiting checkpoint costs no model-sized memory of its own.
  std::uint64_t ckpt_written = 0;
  double ckpt_s = 0;
  double ckpt_mean_s() const {
    return ckpt_written ? ckpt_s / static_cast<double>(ckpt_written) : NAN;
  }
  std::thread ckpt_thread;
  std::mutex ckpt_mu;
  std::condition_variable ckpt_cv;
  std::optional<Checkpoint> ckpt_job;
  bool ckpt_busy = false, ckpt_stop = false;
  std::uint64_t ckpt_skipped = 0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> ckpt_last;  // (round, step) last queued
  void checkpoint_in_background(EngineView v) {
    if (!v.bytes) return;
    if (ckpt_last == std::pair{v.round, step}) return;
    ckpt_last = {v.round, step};
    auto c = make_checkpoint(std::move(v));
    {
      std::lock_guard lk(ckpt_mu);
      if (ckpt_job) ++ckpt_skipped;
      ckpt_job = std::move(c);
      if (!ckpt_thread.joinable()) ckpt_thread = std::thread([this] { checkpoint_writer(); });
    }
    ckpt_cv.notify_all();
  }
  void checkpoint_writer() {
    std::unique_lock lk(ckpt_mu);
    for (;;) {
      ckpt_cv.wait(lk, [&] { return ckpt_stop || ckpt_job.has_value(); });
      if (!ckpt_job) return;
      const Checkpoint c = std::move(*ckpt_job);
      ckpt_job.reset();
      ckpt_busy = true;
      lk.unlock();
      write_checkpoint(c);
      lk.lock();
      ckpt_busy = false;
      ckpt_cv.notify_all();
    }
  }
  // Waits for the background checkpoint in hand, then stops the writer.
  void stop_checkpoint_writer() {
    {
      std::unique_lock lk(ckpt_mu);
      ckpt_cv.wait(lk, [&] { return !ckpt_busy && !ckpt_job; });
      ckpt_stop = true;
    }
    ckpt_cv.notify_all();
    if (ckpt_thread.joinable()) ckpt_thread.join();
  }
};

Node::Node(CliOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {
  impl_->start();
}

Node::~Node() = default;

void Node::stop() {
  impl_->stopping = true;
  impl_->cv.notify_all();
}

int Node::run() {
  return impl_->train();
}

// "status": this node. "swarm_status": every live member of the run, each asked "status" in
// parallel (3 s each); a member that does not answer is listed from its member record.
void Node::Impl::serve_status() {
  host->handle("status", [this](const transport::PeerInfo&, transport::Payload,
                                transport::Responder r) { r.reply(encode_status({my_status()})); });
  host->handle("swarm_status", [this](const transport::PeerInfo&, transport::Payload,
                                      transport::Responder r) {
    // The host strand is the DHT's strand: the member view can be read here.
    const auto live =
        stack_ready ? members->live(dht::DhtRuntime::wall_now()) : std::vector<dht::MemberInfo>{};
    struct Gather {
      std::mutex mu;
      std::vector<MemberStatus> out;
      std::size_t left = 0;
      std::optional<transport::Responder> responder;
      void done() {
        if (--left > 0) return;
        std::sort(out.begin(), out.end(),
                  [](const MemberStatus& a, const MemberStatus& b) { return a.node < b.node; });
        responder->reply(encode_status(out));
      }
    };
    auto g = std::make_shared<Gather>();
    g->responder.emplace(std::move(r));
    g->out.push_back(my_status());
    g->left = 1;
    for (const auto& m : live) {
      if (m.id == host->id()) continue;
      ++g->left;
      // A member without addresses accepts no connections: it answers if it has one open to us.
      const std::string addr = m.addresses.empty() ? std::string() : m.addresses.front();
      MemberStatus fallback;
      fallback.node = transport::to_hex(m.id).substr(0, 16);
      fallback.address = addr;
      fallback.status = "unreachable";
      fallback.run = m.run_id;
      fallback.step = m.step;
      fallback.round = m.round;
      fallback.tokens_per_s = m.throughput;
      fallback.reachable = false;
      host->request(transport::PeerRef::node(m.id, addr), "status", transport::Bytes(),
                    transport::Duration(3000),
                    [g, fallback](transport::Result<transport::Payload> res) {
                      std::optional<std::vector<MemberStatus>> got;
                      if (res) got = decode_status(res->bytes(), nullptr);
                      std::lock_guard lk(g->mu);
                      g->out.push_back(got && got->size() == 1 ? got->front() : fallback);
                      g->done();
                    });
    }
    std::lock_guard lk(g->mu);
    g->done();
  });
}

// "request_mode": body = "diloco" or "noloco", optionally followed by " <round>". The node signs
// the request record (a client that is not a member cannot) and answers with the round it names.
void Node::Impl::serve_requests() {
  host->handle("request_mode", [this](const transport::PeerInfo&, transport::Payload body,
                                      transport::Responder r) {
    const auto b = body.bytes();
    const std::string text(reinterpret_cast<const char*>(b.data()),
                           std::min<std::size_t>(b.size(), 64));
    const auto sp = text.find(' ');
    const auto mode = parse_outer(text.substr(0, sp));
    std::optional<std::uint64_t> from;
    if (sp != std::string::npos) {
      std::uint64_t v = 0;
      const auto rest = text.substr(sp + 1);
      const auto res = std::from_chars(rest.data(), rest.data() + rest.size(), v);
      if (res.ec != std::errc() || res.ptr != rest.data() + rest.size())
        return r.fail(transport::errc::rejected, "bad round in the request");
      from = v;
    }
    if (!mode) return r.fail(transport::errc::rejected, "expected diloco or noloco");
    if (!stack_ready) return r.fail(transport::errc::rejected, "the node is still starting");
    auto holder = std::make_shared<std::optional<transport::Responder>>(std::move(r));
    round->request_mode(
        *mode == OuterKind::diloco ? gossip::OuterMode::diloco : gossip::OuterMode::noloco, from,
        [holder](transport::Result<std::uint64_t> res) {
          if (!*holder) return;
          if (!res) return (*holder)->fail(transport::errc::remote_error, res.error().message());
          const std::string a = std::to_string(*res);
          (*holder)->reply({reinterpret_cast<const std::uint8_t*>(a.data()), a.size()});
        });
  });
}

void Node::Impl::start() {
  state_dir = o.state_dir.empty() ? default_state_dir() : o.state_dir;
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) throw ConfigError("state dir '" + state_dir.string() + "': " + ec.message());
  const auto identity = transport::Identity::load_or_create(state_dir);

  if (o.swarm_key_file) {
    if (o.bootstrap && !std::filesystem::exists(*o.swarm_key_file)) {
      const auto key = transport::SwarmKey::generate();
      const std::string text = key.hex() + "\n";
      if (auto e = write_file_atomically(
              *o.swarm_key_file, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}))
        throw ConfigError("cannot write swarm key file '" + *o.swarm_key_file +
                          "': " + e.message());
    }
    swarm_key = transport::SwarmKey::load(*o.swarm_key_file);
  }

  std::string why;
  resume = load_latest(state_dir, &why);
  if (!why.empty()) spdlog::warn("checkpoint: {}", why);
  if (resume) {
    auto c = parse_run_config(resume->config_text, &why);
    if (!c)
      throw ConfigError("checkpoint in '" + state_dir.string() +
                        "' names a bad run config: " + why);
    config = *c;
    run_name = config.run_name();
    if (o.run && *o.run != run_name)
      throw ConfigError("the checkpoint in '" + state_dir.string() + "' belongs to run " +
                        run_name + ", not " + *o.run + " (use another --state-dir)");
  }

  if (o.metrics) {
    metrics.open(*o.metrics, std::ios::app);
    if (!metrics) throw ConfigError("cannot open metrics file '" + *o.metrics + "'");
  }

  io_thread = std::thread([this] { io.run(); });
  transport::HostOptions ho;
  ho.listen = o.listen;
  ho.swarm_key = swarm_key;
  ho.relay.serve = o.relay;
  if (o.emulate_link) {
    transport::FaultConfig fc;
    fc.latency = transport::Duration(o.emulate_link->rtt_ms / 2);
    fc.bandwidth_bytes_per_sec = o.emulate_link->bytes_per_sec;
    fc.loss = o.emulate_link->loss;
    ho.faults = std::make_shared<transport::FaultPlan>(seed_of(identity.id()));
    ho.faults->set_default(fc);
    spdlog::info("emulating links: {:.0f} Mbit/s, +{} ms round trip, {:.1f}% loss",
                 fc.bandwidth_bytes_per_sec * 8 / 1e6, o.emulate_link->rtt_ms, 100 * fc.loss);
  }
  host = transport::Host::create(io, identity, ho);
  dht = dht::DhtRuntime::create(host, dht::DhtOptions{}, seed_of(host->id()));
  gossip = gossip::GossipRuntime::create(host);
  gossip::serve_state(*host, server);
  transport::serve_reach_checks(*host);
  me.node = transport::to_hex(host->id()).substr(0, 16);
  me.status = "starting";
  serve_status();
  serve_requests();
  on_strand(host->executor(), [&] { host->start(); });
  advertise = advertise_address(host->address(), o.peers);
  candidates = o.advertise.empty() ? local_candidates(host->address(), advertise) : o.advertise;
  addresses = candidates;
  dht->start(candidates.front());
  // A joining node is a DHT client (not handed out as a contact) until peers have dialed its
  // addresses back; the first node of a swarm has nobody to ask and advertises them as they are.
  if (!o.bootstrap) dht->set_address("");
  {
    // `grove-node status` on this machine finds the node here.
    const std::string a = advertise + "\n";
    if (auto e = write_file_atomically(state_dir / "node.addr",
                                       {reinterpret_cast<const std::uint8_t*>(a.data()), a.size()}))
      spdlog::warn("could not write {}: {}", (state_dir / "node.addr").string(), e.message());
  }
  const std::string lan_name =
      "grove-" + (swarm_key
                      ? transport::to_hex(transport::blake2b_256(swarm_key->bytes)).substr(0, 8)
                      : std::string("open"));
  dht->start_lan_discovery(lan_name);
  // A home router may forward a port to us (UPnP IGD): its address becomes a candidate, checked
  // like the others. Not with --advertise (the user has said where we are) or on loopback.
  if (const auto colon = host->address().rfind(':');
      o.upnp && o.advertise.empty() && colon != std::string::npos &&
      !host->address().starts_with("127.") && !host->address().starts_with("[::1]")) {
    PortMappingOptions pm;
    pm.port = static_cast<std::uint16_t>(std::stoul(host->address().substr(colon + 1)));
    upnp = PortMapper::start(host->executor(), pm,
                             [this](std::string ext) { on_port_mapped(std::move(ext)); });
  }

  if (!o.peers.empty()) {
    std::promise<std::size_t> p;
    auto f = p.get_future();
    dht->bootstrap(o.peers, [&p](std::size_t n) { p.set_value(n); });
    if (f.wait_for(30s) != std::future_status::ready || f.get() == 0)
      throw ConfigError("could not reach any --peer (" + o.peers.front() +
                        (o.peers.size() > 1 ? ", ..." : "") +
                        "): is the address right, and the swarm key the same?");
  }

  if (!resume) {
    if (o.bootstrap) {
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
      fresh_bootstrap = true;
    } else {
      find_run();
    }
  }
  // Every member publishes the run's config (its own signed copy), so it outlives the bootstrap,
  // and refreshes it while it runs.
  run_timer.emplace(io);
  publish_run();
  reach_timer.emplace(io);
  relay_timer.emplace(io);
  if (!o.bootstrap) {
    // Can other nodes connect to us? Asked before we advertise anything to the run.
    std::promise<void> p;
    auto f = p.get_future();
    asio::post(host->executor(), [this, &p] { check_reach([&p] { p.set_value(); }); });
    if (f.wait_for(15s) != std::future_status::ready)
      throw ConfigError("the reachability check did not end (internal error)");
  } else {
    schedule_reach_check(10s);  // once others have joined
  }

  WorkloadSpec spec;
  spec.config = config;
  spec.data_files = o.data;
  spec.node_seed = seed_of(host->id());
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
  const auto [self_addresses, self_reach] =
      on_strand(host->executor(), [&] { return std::make_pair(addresses, reach); });
  self.addresses = self_addresses;
  self.reach = self_reach;
  self.run_id = run_name;
  self.status = "joining";
  members = dht->join(run_name, dht::MembershipOptions{}, self);
  round = gossip::RoundRuntime::create(host, dht, gossip, members, server, run_name, self_addresses,
                                       round_options(config, o.threads),
                                       [this](const gossip::RoundReport& r) { on_report(r); });
  stack_ready = true;
  // A re-check that ended while the stack was being built changed only `addresses`: catch up.
  asio::post(host->executor(), [this] {
    if (reach == 2) maintain_relays();  // nodes that cannot dial us need a relay
    if (members->self().addresses == addresses && members->self().reach == reach) return;
    set_addresses(addresses);
  });
  signals.emplace(io, SIGINT, SIGTERM);
  signals->async_wait([this](const boost::system::error_code& e, int sig) {
    if (e) return;
    spdlog::info("signal {}: finishing the round in flight, then leaving", sig);
    // No more waiting in later windows for partners: the round in flight ends at its next read.
    round->with_engine([](gossip::RoundEngine& e) {
      e.set_patience(dht::Time(0));
      e.set_group_wait(dht::Time(0));
    });
    stopping = true;
    cv.notify_all();
  });
}

// Asks up to four peers we are connected to to dial our candidate addresses back (8 s), then
// applies what they found. Host strand.
void Node::Impl::check_reach(std::function<void()> done) {
  if (reach_checking || stopping) {
    if (done) done();
    return;
  }
  std::vector<transport::PeerInfo> helpers;
  for (const auto& p : host->peers())
    if (std::none_of(helpers.begin(), helpers.end(), [&](auto& h) { return h.id == p.id; }))
      helpers.push_back(p);
  std::shuffle(helpers.begin(), helpers.end(), std::mt19937_64(seed_of(host->id()) + step));
  if (helpers.size() > 4) helpers.resize(4);
  if (helpers.empty()) {
    spdlog::info("reach: no peer to check our addresses with yet; advertising {}",
                 joined(candidates));
    schedule_reach_check(10s);
    apply_reach({});
    if (done) done();
    return;
  }
  reach_checking = true;
  last_reach_check = SteadyClock::now();
  auto check = std::make_shared<transport::ReachCheck>(candidates);
  auto left = std::make_shared<std::size_t>(helpers.size());
  transport::ReachRequest req;
  req.addresses = candidates;
  if (req.addresses.size() > transport::kReachMaxAddresses)
    req.addresses.resize(transport::kReachMaxAddresses);
  const auto body = transport::encode_reach_request(req);
  for (const auto& h : helpers) {
    host->request(transport::PeerRef::node(h.id), transport::kReachMethod,
                  transport::Bytes::copy_of(body), transport::Duration(8000),
                  [this, check, left, id = h.id, done](transport::Result<transport::Payload> r) {
                    std::optional<transport::ReachReply> rep;
                    if (r) {
                      if (auto d = transport::decode_reach_reply(r->bytes())) rep = *d;
                    }
                    if (rep) {
                      check->on_reply(id, *rep);
                    } else {
                      spdlog::debug("reach: {} could not check us: {}", transport::short_id(id),
                                    r ? "malformed reply" : r.error().message());
                      check->on_failure(id);
                    }
                    if (--*left > 0) return;
                    reach_checking = false;
                    const auto v = check->verdict();
                    apply_reach(v);
                    // A helper answers one check per requester per 10 s: the next one after
                    // that when a candidate changed meanwhile or nobody could check us.
                    schedule_reach_check(
                        recheck_soon || v.helpers == 0 ? kReachRetry : std::chrono::seconds(600));
                    recheck_soon = false;
                    if (done) done();
                  });
  }
}

// Host strand. No helper answered: keep what we advertise. Otherwise advertise the addresses
// that were reached, or none (other nodes then reach us over the connections we open).
void Node::Impl::apply_reach(const transport::ReachCheck::Verdict& v) {
  // Nobody could check us (asked again too soon, or gone) after a verdict: it stands.
  if (v.helpers == 0 && reach != 0) return;
  std::vector<std::string> now = candidates;
  std::uint8_t r = 0;
  if (v.helpers > 0) {
    now = v.verified;
    r = v.reachable() ? 1 : 2;
  }
  const bool changed = now != addresses || r != reach;
  if (v.helpers > 0 && (changed || reach == 0)) {
    if (v.reachable())
      spdlog::info("reach: reachable at {} ({} peer(s) dialed us back)", joined(now), v.helpers);
    else
      spdlog::warn(
          "reach: {} peer(s) could not dial us at {}{}: taking part over the connections we "
          "open (a port forward and --advertise IP:PORT make this node reachable)",
          v.helpers, joined(candidates),
          v.observed ? " (they see us at " + *v.observed + ")" : std::string());
  }
  reach = r;
  dht->set_address(r == 2 || now.empty() ? std::string() : now.front());
  // Nodes behind relays dial us back at addresses that others have reached (connection reversal).
  host->set_dialback_addresses(r == 1 ? now : std::vector<std::string>{});
  if (r == 2) {
    // Keep the relay addresses we have while the verdict stays the same.
    if (changed) relays.clear();
    now = relay_addresses();
    if (stack_ready) maintain_relays();
  }
  if (changed || now != addresses) set_addresses(now);
}

// The socket a training script attaches to (an external workload), announced on stdout.
void Node::Impl::open_trainer_socket() {
  const std::string path =
      o.trainer_socket.empty() ? (state_dir / "trainer.sock").string() : o.trainer_socket;
  ExternalWorkload::Options eo;
  eo.socket_path = path;
  eo.shm_name = "/grove-" + transport::to_hex(host->id()).substr(0, 16);
  eo.stopping = [this] { return stopping.load(); };
  eo.on_state = [this](const std::string& s) { publish_status(s); };
  external_owner = std::make_unique<ExternalWorkload>(eo);
  std::printf("  trainer  attach with grove.attach(socket=\"%s\") (waiting for one)\n",
              path.c_str());
  std::fflush(stdout);
}

// Host strand: what we advertise from now on (member record, ready records, state offers).
void Node::Impl::set_addresses(std::vector<std::string> now) {
  addresses = std::move(now);
  if (!stack_ready) return;  // the stack is built with them (and caught up after)
  auto self = members->self();
  self.addresses = addresses;
  self.reach = reach;
  members->set_self(self);
  round->with_engine([a = addresses](gossip::RoundEngine& e) { e.set_addresses(a); });
}

// Host strand, every 15 s while we accept no connections (5 s while we have none): keep
// reservations at two reachable members, so that nodes which cannot dial us either (or that have no
// connection with us yet) reach us through them. Renewing also keeps those sessions busy (idle ones
// are closed).
void Node::Impl::maintain_relays() {
  relay_timer->expires_after(relays.empty() ? 5s : 15s);
  relay_timer->async_wait([this](const boost::system::error_code& e) {
    if (!e && !stopping) asio::post(host->executor(), [this] { maintain_relays(); });
  });
  if (reach != 2 || relays_busy || stopping) return;
  const auto now = SteadyClock::now();
  std::vector<std::pair<transport::NodeId, std::string>> pick = relays;
  std::vector<dht::MemberInfo> others;
  for (const auto& m : members->live(dht::DhtRuntime::wall_now()))
    if (m.id != host->id() && m.reach != 2 && !m.addresses.empty() &&
        !m.addresses.front().starts_with("relay:") &&
        std::none_of(pick.begin(), pick.end(), [&](auto& p) { return p.first == m.id; }) &&
        !(relay_refused.contains(m.id) && now - relay_refused[m.id] < std::chrono::minutes(5)))
      others.push_back(m);
  // Members whose addresses were checked first, then those not checked yet (the first node of
  // a swarm, until it has peers to ask).
  std::shuffle(others.begin(), others.end(), std::mt19937_64(seed_of(host->id()) + step));
  std::stable_partition(others.begin(), others.end(), [](auto& m) { return m.reach == 1; });
  for (const auto& m : others) {
    if (pick.size() >= 2) break;
    pick.emplace_back(m.id, m.addresses.front());
  }
  if (pick.empty()) return;
  relays_busy = true;
  struct Round {
    std::vector<std::pair<transport::NodeId, std::string>> ok;
    std::size_t left = 0;
  };
  auto r = std::make_shared<Round>();
  r->left = pick.size();
  for (const auto& relay : pick) {
    const transport::NodeId id = relay.first;
    const std::string addr = relay.second;
    host->reserve_relay(transport::PeerRef::node(id, addr), [this, r, id,
                                                             addr](std::error_code ec) {
      if (!ec) {
        r->ok.emplace_back(id, addr);
      } else {
        spdlog::debug("reach: {} does not relay for us: {}", transport::short_id(id), ec.message());
        relay_refused[id] = SteadyClock::now();
      }
      if (--r->left > 0) return;
      relays_busy = false;
      std::sort(r->ok.begin(), r->ok.end());
      auto before = relays;
      std::sort(before.begin(), before.end());
      relays = r->ok;
      if (reach != 2 || relays == before) return;
      const auto now = relay_addresses();
      spdlog::info("reach: reachable through {} relay(s): {}", relays.size(), joined(now));
      set_addresses(now);
    });
  }
}

// Host strand: the router mapped a port to us ("ip:port") or the mapping was lost (""). The
// candidates change; peers are asked to check them now (or right after a check under way).
void Node::Impl::on_port_mapped(std::string external) {
  if (stopping) return;
  std::erase(candidates, upnp_address);
  upnp_address = std::move(external);
  if (!upnp_address.empty() &&
      std::find(candidates.begin(), candidates.end(), upnp_address) == candidates.end())
    candidates.insert(candidates.begin(), upnp_address);
  if (reach_checking) {
    recheck_soon = true;
    return;
  }
  // Helpers answer one check per requester per 10 s.
  const auto since = SteadyClock::now() - last_reach_check;
  if (since < kReachRetry)
    return schedule_reach_check(std::chrono::ceil<std::chrono::seconds>(kReachRetry - since));
  check_reach({});
}

void Node::Impl::schedule_reach_check(std::chrono::seconds after) {
  reach_timer->expires_after(after);
  reach_timer->async_wait([this](const boost::system::error_code& e) {
    if (e || stopping) return;
    asio::post(host->executor(), [this] { check_reach({}); });
  });
}

void Node::Impl::publish_run() {
  const std::string text = config.to_text();
  dht->put_signed(dht::key_of(kRunsKey), run_name,
                  static_cast<std::uint64_t>(dht::DhtRuntime::wall_now().count()), kRunRecordTtl,
                  std::vector<std::uint8_t>(text.begin(), text.end()));
  run_timer->expires_after(kRunRecordRefresh);
  run_timer->async_wait([this](const boost::system::error_code& e) {
    if (!e && !stopping) publish_run();
  });
}

// Reads the runs published in the swarm; takes --run, or the only one there is.
void Node::Impl::find_run() {
  const auto deadline = SteadyClock::now() + 30s;
  std::string seen;
  while (SteadyClock::now() < deadline && !stopping) {
    std::promise<dht::GetResult> p;
    auto f = p.get_future();
    dht->get(dht::key_of(kRunsKey), [&p](dht::GetResult r) { p.set_value(std::move(r)); });
    const auto r = f.get();
    std::map<std::string, RunConfig> runs;
    for (const auto& rec : r.records) {
      std::string why;
      auto c = parse_run_config(
          std::string_view(reinterpret_cast<const char*>(rec.value.data()), rec.value.size()),
          &why);
      if (!c || c->run_name() != rec.subkey) {
        spdlog::warn("ignoring a run record '{}' that does not match its content ({})", rec.subkey,
                     c ? "name mismatch" : why);
        continue;
      }
      runs.emplace(rec.subkey, *c);
    }
    if (o.run) {
      if (auto it = runs.find(*o.run); it != runs.end()) {
        config = it->second;
        run_name = it->first;
        return;
      }
    } else if (runs.size() == 1) {
      config = runs.begin()->second;
      run_name = runs.begin()->first;
      return;
    } else if (runs.size() > 1) {
      std::string names;
      for (const auto& [n, c] : runs) names += " " + n;
      throw ConfigError("the swarm has several runs:" + names + "; choose one with --run NAME");
    }
    std::unique_lock lk(mu);
    cv.wait_for(lk, 1s, [&] { return stopping.load(); });
  }
  throw ConfigError(o.run ? "run " + *o.run + " was not found in the swarm"
                          : std::string("no run found in the swarm (is a --bootstrap node up?)"));
}

int Node::Impl::train() {
  const std::size_t P = workload->num_params();
  std::printf("grove-node %s\n  run      %s (%s, %s outer, %s on the wire)\n  listening %s\n",
              transport::to_hex(host->id()).substr(0, 16).c_str(), run_name.c_str(),
              workload->describe().c_str(), to_string(config.outer), to_string(config.codec),
              advertise.c_str());
  if (fresh_bootstrap) {
    std::string cmd = "grove-node --peer " + advertise;
    if (swarm_key)
      cmd = "echo " + swarm_key->hex() + " > swarm.key && grove-node --peer " + advertise +
            " --swarm-key-file swarm.key";
    if (!o.data.empty()) cmd += " --data YOUR_TEXT_FILES";
    std::printf("  join with: %s\n", cmd.c_str());
  }
  std::fflush(stdout);

  std::vector<float> theta(P);
  workload->get_params(theta);
  bool synced = false;
  if (fresh_bootstrap) {
    optim::OuterState st;
    st.phi = theta;
    st.momentum.assign(P, 0.0f);
    round->start(std::move(st));
    synced = true;
  } else {
    // Joining, or resuming with peers: take the swarm's current state if a member offers one
    // (a resumed node without --peer goes on from its checkpoint at once).
    const int attempts = resume && o.peers.empty() ? 0 : 3;
    for (int attempt = 0; attempt < attempts && !synced && !stopping; ++attempt) {
      round->join(P);
      for (;;) {
        auto r = next_report(120s);
        if (!r) break;
        if (r->kind == gossip::RoundReport::Kind::synced) {
          synced = true;
          break;
        }
        if (r->kind == gossip::RoundReport::Kind::sync_failed) {
          spdlog::warn("state sync failed: {}", r->note);
          break;
        }
      }
      if (!synced && resume) break;  // nobody offers a state: go on from the checkpoint
    }
    if (synced) {
      std::uint64_t at = 0;
      round->with_engine_wait([&](gossip::RoundEngine& e) {
        theta = e.state().phi;
        at = e.state().round;
      });
      workload->set_params(theta);
      if (resume && resume->outer.phi.size() == P) {
        std::string why;
        if (!workload->load(resume->workload, &why)) spdlog::warn("checkpoint: {}", why);
        step = resume->step;
        tokens = resume->tokens;
      }
      rounds = at;
      evaluate();  // a joiner starts from the swarm's loss, not a fresh model's
      std::printf("  synced   round %llu from the swarm: eval loss %s (floor %s)\n",
                  static_cast<unsigned long long>(at), json_number(last_eval).c_str(),
                  json_number(workload->loss_floor()).c_str());
    } else if (resume) {
      if (resume->outer.phi.size() != P) {
        spdlog::error("checkpoint does not fit this model ({} values, the model has {})",
                      resume->outer.phi.size(), P);
        return 1;
      }
      std::string why;
      if (!workload->load(resume->workload, &why)) spdlog::warn("checkpoint: {}", why);
      theta = resume->outer.phi;
      workload->set_params(theta);
      step = resume->step;
      tokens = resume->tokens;
      rounds = resume->round;
      round->start(std::move(resume->outer));
      std::printf("  resumed  round %llu, step %llu from the checkpoint\n",
                  static_cast<unsigned long long>(resume->round),
                  static_cast<unsigned long long>(step));
      synced = true;
    }
  }
  resume.reset();  // (a model-sized state: the engine has its own)
  if (!synced) {
    spdlog::error("could not get the swarm's state");
    return 1;
  }
  if (std::isnan(last_eval)) {
    evaluate();
    std::printf("  start    eval loss %s (floor %s)\n", json_number(last_eval).c_str(),
                json_number(workload->loss_floor()).c_str());
  }
  std::fflush(stdout);
  event("start", ",\"run\":" + json_string(run_name) + ",\"params\":" + std::to_string(P) +
                     ",\"loss_floor\":" + json_number(workload->loss_floor()));

  param_hash = transport::to_hex(gossip::weights_hash(theta)).substr(0, 16);  // θ = φ here
  eval_s = 0;  // utilization counts the training time only
  const auto training_since = SteadyClock::now();
  SteadyClock::time_point last_round_at{};
  publish_status("training");
  const auto done = [&] { return stopping.load() || (o.max_steps && step >= *o.max_steps); };
  bool in_flight = false;
  double tps = 0;
  // A round's result: the new slow weights become θ (with overlap: θ, trained on meanwhile, is
  // pulled halfway toward them); metrics, progress and a checkpoint follow.
  const auto apply = [&](gossip::RoundReport& r) {
    if (r.kind == gossip::RoundReport::Kind::sync_failed) {
      spdlog::warn("catching up failed: {}", r.note);
      return;
    }
    in_flight = false;
    const bool is_round = r.kind == gossip::RoundReport::Kind::round;
    bytes_sent += r.bytes_sent;
    bytes_received += r.bytes_received;
    const bool mix = o.overlap && is_round;
    // θ went to the round engine with the last submit; its buffer (pages mapped) comes back.
    if (r.spare.size() == P) theta = std::move(r.spare);
    theta.resize(P);
    if (mix) workload->get_params(theta);
    EngineView v;
    round->with_engine_wait([&](gossip::RoundEngine& e) {
      v = view_of(e);
      if (mix)
        e.mix(theta, 0.5f);
      else
        theta = e.state().phi;  // without overlap, or after catching up: start from the new φ
    });
    workload->set_params(theta);
    rounds = v.round;
    checkpoint_in_background(std::move(v));
    // The first partner's short id ("" when nobody), for the status, the live and round lines.
    const std::string partner =
        r.averaged_with.empty() ? "" : transport::to_hex(r.averaged_with.front()).substr(0, 8);
    {
      const auto now = SteadyClock::now();
      if (is_round && last_round_at != SteadyClock::time_point{}) {
        round_time_sum += std::chrono::duration<double>(now - last_round_at).count();
        ++round_count;
      }
      last_round_at = now;
      std::lock_guard lk(status_mu);
      me.tokens_per_s = tps;
      me.last_sync_ms = static_cast<double>(r.sync_time.count());
      me.last_partner = partner;
    }
    publish_status("training");
    last_partners.clear();
    for (const auto& id : r.averaged_with)
      last_partners += std::string(last_partners.empty() ? "" : ",") +
                       json_string(transport::to_hex(id).substr(0, 16));
    last_sync_ms = static_cast<long long>(r.sync_time.count());
    param_hash = transport::to_hex(r.weights_hash).substr(0, 16);
    const auto live = on_strand(dht->executor(),
                                [&] { return members->live(dht::DhtRuntime::wall_now()).size(); });
    live_members = live;
    if (is_round) {
      ++(r.local_only ? rounds_local : rounds_averaged);
      sync_ms_sum += static_cast<double>(r.sync_time.count());
    } else {
      ++syncs;
    }
    {
      std::string with = is_round ? "local-only" : "state sync";
      if (!partner.empty()) {
        with = "with " + partner;
        if (r.averaged_with.size() > 1) with += " +" + std::to_string(r.averaged_with.size() - 1);
      }
      char b[64];
      std::snprintf(
          b, sizeof b, ", %lld ms, %.2f/%.2f MB", static_cast<long long>(r.sync_time.count()),
          static_cast<double>(r.bytes_sent) / 1e6, static_cast<double>(r.bytes_received) / 1e6);
      last_sync = with + b;
    }
    const double wall = std::chrono::duration<double>(SteadyClock::now() - training_since).count();
    event(is_round ? "round" : "synced",
          ",\"mode\":" + json_string(gossip::to_string(r.mode)) + ",\"tokens_per_s\":" +
              json_number(tps) + ",\"round_bytes_sent\":" + std::to_string(r.bytes_sent) +
              ",\"round_bytes_received\":" + std::to_string(r.bytes_received) +
              ",\"local_only\":" + (r.local_only ? "true" : "false") +
              ",\"note\":" + json_string(r.note) + ",\"compute_s\":" + json_number(compute_s) +
              ",\"eval_s\":" + json_number(eval_s) + ",\"wall_s\":" + json_number(wall));
    if (o.progress) {
      std::printf(
          "%sstep %6llu  round %4llu  loss %.4f  eval %s (floor %s)  %.0f tok/s  "
          "%zu members  %s %s\n",
          tty ? "\r\033[K" : "", static_cast<unsigned long long>(step),
          static_cast<unsigned long long>(rounds), loss_ema, json_number(last_eval).c_str(),
          json_number(workload->loss_floor()).c_str(), tps, live, gossip::to_string(r.mode),
          last_sync.c_str());
      std::fflush(stdout);
    }
  };
  // Waits for the round in flight (or a catch-up) to end; false when it does not in time.
  const auto wait_round = [&](SteadyClock::duration limit, bool stop_wakes = true) {
    const auto deadline = SteadyClock::now() + limit;
    while (in_flight) {
      auto r = next_report(std::max<SteadyClock::duration>(deadline - SteadyClock::now(), 0s),
                           stop_wakes);
      if (!r) return false;
      apply(*r);
    }
    return true;
  };
  const auto take_ready = [&] {  // overlap: apply a result that arrived during the inner phase
    std::optional<gossip::RoundReport> r;
    {
      std::lock_guard lk(mu);
      if (!reports.empty()) {
        r = std::move(reports.front());
        reports.pop_front();
      }
    }
    if (r) apply(*r);
  };

  while (!done()) {
    const auto t0 = SteadyClock::now();
    std::uint64_t phase_tokens = 0;
    for (std::uint32_t h = 0; h < config.inner_steps && !done(); ++h) {
      const auto s0 = SteadyClock::now();
      const auto r = workload->train_step(step);
      compute_s += std::chrono::duration<double>(SteadyClock::now() - s0).count();
      ++step;
      tokens += r.tokens;
      phase_tokens += r.tokens;
      loss_ema = std::isfinite(loss_ema) ? 0.9 * loss_ema + 0.1 * r.loss : r.loss;
      if (step % config.eval_every == 0) {
        evaluate();
        event("eval", ",\"loss_floor\":" + json_number(workload->loss_floor()));
      }
      if (in_flight) take_ready();
      live_line(phase_tokens, t0);
    }
    const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    tps = secs > 0 ? static_cast<double>(phase_tokens) / secs : 0;
    if (stopping) break;
    // A node left alone in a window tries later windows for about one inner phase, and at least
    // the next window (patience counts from its first ready record), so that a slower node, or one
    // whose rounds fall into the other windows, still pairs (nodes that pair once then share a
    // cadence). Not at all when it is the only member, once its view has had time to fill (two
    // membership polls).
    {
      const bool settled = SteadyClock::now() - training_since > 15s;
      const bool alone = settled && on_strand(dht->executor(), [&] {
                           return members->live(dht::DhtRuntime::wall_now()).size() <= 1;
                         });
      const auto phase_ms = static_cast<std::int64_t>(secs * 1000);
      const auto patience = alone ? dht::Time(0)
                                  : dht::Time(std::clamp<std::int64_t>(
                                        phase_ms, 2 * std::int64_t{config.window_ms}, 60'000));
      round->with_engine([patience](gossip::RoundEngine& e) { e.set_patience(patience); });
    }
    if (in_flight && !wait_round(600s)) break;  // overlap: the previous round first
    theta.resize(P);
    workload->get_params(theta);
    if (!optim::all_finite(theta)) {
      // A diverged inner phase (a trainer's NaN or Inf) would poison φ and every partner: it is
      // dropped, and the next one starts from φ.
      spdlog::error(
          "the parameters after step {} hold NaN or Inf: this inner phase is dropped "
          "and training restarts from the slow weights",
          step);
      round->with_engine_wait([&](gossip::RoundEngine& e) { theta = e.state().phi; });
      workload->set_params(theta);
    }
    round->submit(std::move(theta));  // moved: one model-sized buffer less while the round runs
    theta.clear();
    in_flight = true;
    if (o.overlap && !done()) continue;
    if (!wait_round(600s)) break;
  }
  // The round in flight gets a bounded grace: its own deadlines end it well within this.
  if (in_flight && !wait_round(stopping ? 30s : 600s, false))
    spdlog::warn("leaving with a round still in flight");

  // Leaving: say so in the member record and remove it while the checkpoint is written, go.
  publish_status("leaving");
  auto left = std::make_shared<std::promise<void>>();
  auto left_f = left->get_future();
  dht->post([this, left](dht::DhtNode&, dht::Time now) {
    members->leave(now, [left] { left->set_value(); });
  });
  {
    EngineView v;
    round->with_engine_wait([&](gossip::RoundEngine& e) { v = view_of(e); });
    checkpoint_in_background(std::move(v));  // (nothing new since the last one: not written)
  }
  stop_checkpoint_writer();
  if (external)
    external->say_goodbye(stopping ? "the node was stopped (signal)" : "the node ended its run");
  left_f.wait_for(3s);
  evaluate();
  summary(training_since);
  return 0;
}

void Node::Impl::evaluate() {
  const auto t0 = SteadyClock::now();
  last_eval = workload->evaluate();
  eval_s += std::chrono::duration<double>(SteadyClock::now() - t0).count();
  if (std::isnan(first_eval)) first_eval = last_eval;
}

// On a terminal: one line rewritten in place about once a second during the inner steps.
void Node::Impl::live_line(std::uint64_t phase_tokens, SteadyClock::time_point phase_start) {
  if (!o.progress || !tty) return;
  const auto now = SteadyClock::now();
  if (now - last_live < 1s) return;
  last_live = now;
  const double secs = std::chrono::duration<double>(now - phase_start).count();
  const double rate = secs > 0 ? static_cast<double>(phase_tokens) / secs : 0;
  std::printf("\r\033[Kstep %llu  loss %.4f  eval %s (floor %s)  %.0f tok/s  %zu members  %s",
              static_cast<unsigned long long>(step), loss_ema, json_number(last_eval).c_str(),
              json_number(workload->loss_floor()).c_str(), rate, live_members,
              last_sync.empty() ? "no sync yet" : ("last sync " + last_sync).c_str());
  std::fflush(stdout);
}

// The run's outcome for this node: stdout, and the "stop" metrics event.
void Node::Impl::summary(SteadyClock::time_point training_since) {
  const double wall = std::chrono::duration<double>(SteadyClock::now() - training_since).count();
  const double util = wall - eval_s > 0 ? compute_s / (wall - eval_s) : NAN;
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const double peak = static_cast<double>(ru.ru_maxrss) * 1024.0;
  const double param_bytes = 4.0 * static_cast<double>(workload->num_params());
  event("stop",
        ",\"first_eval_loss\":" + json_number(first_eval) +
            ",\"loss_floor\":" + json_number(workload->loss_floor()) + ",\"rounds_averaged\":" +
            std::to_string(rounds_averaged) + ",\"rounds_local\":" + std::to_string(rounds_local) +
            ",\"syncs\":" + std::to_string(syncs) + ",\"compute_s\":" + json_number(compute_s) +
            ",\"eval_s\":" + json_number(eval_s) + ",\"wall_s\":" + json_number(wall) +
            ",\"utilization\":" + json_number(util) + ",\"peak_rss_bytes\":" + json_number(peak) +
            ",\"param_bytes\":" + json_number(param_bytes) + ",\"checkpoints\":" +
            std::to_string(ckpt_written) + ",\"checkpoint_s\":" + json_number(ckpt_mean_s()));
  const std::uint64_t n_rounds = rounds_averaged + rounds_local;
  std::printf(
      "%sstopped at step %llu, round %llu: eval loss %s (floor %s; %s at the first "
      "evaluation)\n",
      o.progress && tty ? "\r\033[K" : "", static_cast<unsigned long long>(step),
      static_cast<unsigned long long>(rounds), json_number(last_eval).c_str(),
      json_number(workload->loss_floor()).c_str(), json_number(first_eval).c_str());
  std::printf("  node      %s, run %s, %.2f M tokens trained here\n", me.node.c_str(),
              run_name.c_str(), static_cast<double>(tokens) / 1e6);
  std::printf(
      "  rounds    %llu here: %llu averaged, %llu local-only; %llu state sync(s)\n",
      static_cast<unsigned long long>(n_rounds), static_cast<unsigned long long>(rounds_averaged),
      static_cast<unsigned long long>(rounds_local), static_cast<unsigned long long>(syncs));
  std::printf(  // (the checkpoint writer has stopped)
      "  checkpts  %llu written in the background (mean %.2f s each), %llu skipped (a newer "
      "round came while they waited)\n",
      static_cast<unsigned long long>(ckpt_written), ckpt_written ? ckpt_mean_s() : 0.0,
      static_cast<unsigned long long>(ckpt_skipped));
  std::printf("  traffic   %.1f MB sent, %.1f MB received; mean sync %.0f ms, mean round %.1f s\n",
              static_cast<double>(bytes_sent) / 1e6, static_cast<double>(bytes_received) / 1e6,
              n_rounds ? sync_ms_sum / static_cast<double>(n_rounds) : 0.0,
              round_count ? round_time_sum / static_cast<double>(round_count) : 0.0);
  std::printf("  compute   %.1f%% of %.0f s in inner steps (%.0f s evaluating)\n", 100 * util, wall,
              eval_s);
  std::printf("  memory    peak %.0f MB resident; parameters %.1f MB\n", peak / 1e6,
              param_bytes / 1e6);
  const auto [hs, rs, r] = on_strand(
      host->executor(), [&] { return std::make_tuple(host->stats(), host->relay_stats(), reach); });
  if (external) {
    const auto h = external->handoff(true);
    const auto per = [](double s, std::uint64_t n) { return n ? 1e3 * s / n : NAN; };
    std::printf(
        "  trainer   %.1f MB of parameters; the node took them %llu time(s), %.1f ms each, gave "
        "them %llu time(s), %.1f ms each; a memcpy of the same bytes: %.1f ms\n",
        h.bytes / 1e6, static_cast<unsigned long long>(h.gets), per(h.get_s, h.gets),
        static_cast<unsigned long long>(h.sets), per(h.set_s, h.sets), 1e3 * h.memcpy_s);
    event("handoff", ",\"bytes\":" + json_number(h.bytes) +
                         ",\"get_ms\":" + json_number(per(h.get_s, h.gets)) +
                         ",\"set_ms\":" + json_number(per(h.set_s, h.sets)) +
                         ",\"memcpy_ms\":" + json_number(1e3 * h.memcpy_s));
  }
  std::printf(
      "  network   %s; %llu connection(s) dialed back at our request; relayed for others: %llu "
      "circuit(s), %llu dial-back(s) passed on\n",
      r == 1   ? "reachable"
      : r == 2 ? "not reachable (through relays)"
               : "reachability unchecked",
      static_cast<unsigned long long>(hs.dialbacks),
      static_cast<unsigned long long>(rs.circuits_total),
      static_cast<unsigned long long>(rs.reversals));
  std::fflush(stdout);
}

void Node::Impl::shutdown() {
  stop_checkpoint_writer();
  upnp.reset();  // removes the router's mapping
  if (!io_thread.joinable()) return;
  if (dht) dht->stop();
  if (signals) asio::post(io, [this] { signals->cancel(); });
  if (run_timer) asio::post(io, [this] { run_timer->cancel(); });
  if (reach_timer) asio::post(io, [this] { reach_timer->cancel(); });
  if (relay_timer) asio::post(io, [this] { relay_timer->cancel(); });
  if (host) host->shutdown();
  transport::quiesce_worker_pool();
  work.reset();
  io.stop();
  io_thread.join();
}

}  // namespace grove::node
