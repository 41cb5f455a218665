#include "gossip/round_runtime.hpp"

#include <algorithm>
#include <chrono>
#include <future>

#include <boost/asio/post.hpp>

#include <spdlog/spdlog.h>

namespace grove::gossip {

namespace {
constexpr const char* kStateMethod = "state";

// The engine runs on the DHT strand: while it computes (an outer step, hashing and serialising
// a large state), DHT messages wait. Long holds are logged: they explain records that arrive
// expired and windows a node misses.
template <class Fn>
void timed(const char* what, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const auto ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (ms >= 250) spdlog::info("round engine: {} held the DHT strand for {:.0f} ms", what, ms);
}
}  // namespace

boost::asio::thread_pool& state_read_pool() {
  // Never destroyed: a read may still be running when the process exits.
  static auto* pool = new boost::asio::thread_pool(2);
  return *pool;
}

void serve_state(transport::Host& host, std::shared_ptr<StateServer> server) {
  // Answered on the state-read threads, never on the host's strand: a chunk of a file-backed
  // snapshot is a read of a few MiB, which on a busy disk takes seconds, and every session of
  // the host (its keepalives, the DHT's records, other peers' streams) waits on that strand.
  host.handle(kStateMethod, [server](const transport::PeerInfo& from, transport::Payload body,
                                     transport::Responder r) {
    boost::asio::post(state_read_pool(),
                      [server, id = from.id, body = std::move(body), r = std::move(r)]() mutable {
                        if (r.cancelled())
                          return;  // the requester gave up (or its deadline passed) meanwhile
                        auto answer = server->answer(body.bytes());
                        if (!answer) {
                          spdlog::debug("state request from {} refused: {}", transport::to_hex(id),
                                        answer.error().message());
                          r.fail(transport::errc::rejected, answer.error().message());
                          return;
                        }
                        r.reply(*answer);
                      });
  });
}

RoundRuntime::RoundRuntime(std::shared_ptr<transport::Host> host,
                           std::shared_ptr<dht::DhtRuntime> dht,
                           std::shared_ptr<GossipRuntime> gossip,
                           std::shared_ptr<dht::Membership> members, ReportFn on_report)
    : host_(std::move(host)),
      dht_(std::move(dht)),
      gossip_(std::move(gossip)),
      members_(std::move(members)),
      on_report_(std::move(on_report)) {}

std::shared_ptr<RoundRuntime> RoundRuntime::create(
    std::shared_ptr<transport::Host> host, std::shared_ptr<dht::DhtRuntime> dht,
    std::shared_ptr<GossipRuntime> gossip, std::shared_ptr<dht::Membership> members,
    std::shared_ptr<StateServer> server, std::string run_id, std::vector<std::string> addresses,
    RoundOptions opts, ReportFn on_report) {
  auto rt = std::shared_ptr<RoundRuntime>(
      new RoundRuntime(std::move(host), dht, std::move(gossip), members, std::move(on_report)));
  // The engine is built on the strand: it registers a membership watch and uses the DHT node.
  // (A configuration error is rethrown here.)
  dht->post_wait([&](dht::DhtNode& node, dht::Time) {
    rt->engine_ =
        std::make_unique<RoundEngine>(node, *rt->members_, std::move(run_id), std::move(addresses),
                                      std::move(opts), std::move(server));
    rt->dht_->add_rider(rt);
  });
  return rt;
}

void RoundRuntime::start(optim::OuterState state) {
  dht_->post(
      [self = shared_from_this(), state = std::move(state)](dht::DhtNode&, dht::Time now) mutable {
        self->engine_->start(std::move(state), now);
      });
}

void RoundRuntime::join(std::optional<std::size_t> values) {
  dht_->post([self = shared_from_this(), values](dht::DhtNode&, dht::Time now) {
    self->engine_->join(now, values);
  });
}

void RoundRuntime::submit(optim::Floats theta) {
  dht_->post(
      [self = shared_from_this(), theta = std::move(theta)](dht::DhtNode&, dht::Time now) mutable {
        if (!self->engine_->idle()) {
          spdlog::error("round engine busy: θ of this inner phase dropped");
          return;
        }
        timed("a submit", [&] { self->engine_->submit(std::move(theta), now); });
      });
}

void RoundRuntime::request_mode(OuterMode mode, std::optional<std::uint64_t> from_round,
                                std::function<void(transport::Result<std::uint64_t>)> done) {
  dht_->post([self = shared_from_this(), mode, from_round, done = std::move(done)](
                 dht::DhtNode&, dht::Time now) mutable {
    self->engine_->request_mode(mode, from_round, now, std::move(done));
  });
}

void RoundRuntime::with_engine(std::function<void(RoundEngine&)> fn) {
  dht_->post([self = shared_from_this(), fn = std::move(fn)](dht::DhtNode&, dht::Time) {
    timed("a request of the node", [&] { fn(*self->engine_); });
  });
}

void RoundRuntime::with_engine_wait(const std::function<void(RoundEngine&)>& fn) {
  dht_->post_wait(
      [&](dht::DhtNode&, dht::Time) { timed("a request of the node", [&] { fn(*engine_); }); });
}

void RoundRuntime::on_timer(dht::Time now) {
  if (engine_) timed("a timer", [&] { engine_->on_timer(now); });
}

std::optional<dht::Time> RoundRuntime::next_deadline() const {
  return engine_ ? engine_->next_deadline() : std::nullopt;
}

void RoundRuntime::after_event() {
  if (!engine_) return;
  std::weak_ptr<RoundRuntime> weak = shared_from_this();
  for (auto& op : engine_->take_ops()) {
    // Without addresses of our own (none, or relays only) nobody can dial us directly: open the
    // connections to every member of the operation ourselves (members without our address wait
    // for them: transport::Host::connect; a direct connection is kept over a relayed one).
    const auto& ours = engine_->addresses();
    if (std::all_of(ours.begin(), ours.end(), [](auto& a) { return a.starts_with("relay:"); }))
      for (const auto& [id, addr] : op.addresses)
        if (!addr.empty()) host_->connect(transport::PeerRef::node(id, addr), [](auto&&) {});
    // Built on the gossip strand: encoding and hashing a large θ would hold the DHT's.
    gossip_->start(std::move(op.make), std::move(op.addresses),
                   [weak](std::unique_ptr<Protocol> done) {
                     auto self = weak.lock();
                     if (!self) return;
                     // Back from the gossip strand to the DHT strand.
                     auto shared = std::make_shared<std::unique_ptr<Protocol>>(std::move(done));
                     self->dht_->post([weak, shared](dht::DhtNode&, dht::Time now) {
                       if (auto s = weak.lock())
                         timed("an operation's end",
                               [&] { s->engine_->on_op_finished(std::move(*shared), now); });
                     });
                   });
  }
  // A round's step runs on a thread of its own; the job holds its work only (like a snapshot job,
  // below, it never holds this object).
  for (auto& job : engine_->take_step_jobs())
    boost::asio::post(step_pool_, [dht = dht_, weak, job = std::move(job)]() mutable {
      job.run();
      dht->post([weak, seq = job.seq](dht::DhtNode&, dht::Time now) {
        if (auto s = weak.lock())
          timed("ending a round", [&] { s->engine_->on_step_done(seq, now); });
      });
    });
  // Snapshots are hashed on a thread of their own (seconds for a large state), then handed back
  // on the strand. The job holds the engine's state blob (shared, not copied) and the DHT
  // runtime, never this object (whose last owner must not be that thread: it joins it).
  for (auto& job : engine_->take_snapshot_jobs())
    boost::asio::post(snapshot_pool_, [dht = dht_, weak, job = std::move(job)]() mutable {
      std::shared_ptr<const StateSnapshot> snap;
      if (auto r = StateSnapshot::of(job.run_id, job.round, std::move(job.blob), job.chunk_bytes))
        snap = std::move(*r);
      else
        spdlog::warn("cannot serve the state of round {}: {}", job.round, r.text());
      dht->post([weak, seq = job.seq, snap = std::move(snap)](dht::DhtNode&,
                                                              dht::Time now) mutable {
        if (auto s = weak.lock())
          timed("serving a snapshot", [&] { s->engine_->on_snapshot(seq, std::move(snap), now); });
      });
    });
  for (auto& req : engine_->take_state_requests()) {
    const auto until = req.give_up > dht::Time(0) ? req.give_up : req.deadline;
    const auto timeout = std::max(dht::Time(1), until - dht::DhtRuntime::wall_now());
    host_->request(
        transport::PeerRef::node(req.to, req.address), kStateMethod,
        transport::Bytes::copy_of(req.body), timeout,
        [weak, id = req.id](transport::Result<transport::Payload> res) {
          auto self = weak.lock();
          if (!self) return;
          auto body = res ? std::make_shared<std::vector<std::uint8_t>>(res->bytes().begin(),
                                                                        res->bytes().end())
                          : nullptr;
          std::string why = res ? std::string() : res.text();
          self->dht_->post([weak, id, body, why = std::move(why)](dht::DhtNode&, dht::Time now) {
            auto s = weak.lock();
            if (!s) return;
            if (body)
              timed("a state chunk", [&] { s->engine_->on_state_response(id, *body, now); });
            else
              s->engine_->on_state_failure(id, now, why);
          });
        });
  }
  // A snapshot no longer served, or an array replaced, is freed on the snapshot thread: closing
  // a large state's file frees its blocks (a second at 800 MB here; θ's 400 MB of pages held the
  // strand for 0.4-2.3 s at 100M, 3.5 s at 500M), which would hold the DHT strand.
  if (auto retired = engine_->take_retired(); !retired.empty())
    boost::asio::post(snapshot_pool_, [r = std::move(retired)]() mutable { r = {}; });
  for (auto& r : engine_->take_reports())
    if (on_report_) on_report_(std::move(r));
}

}  // namespace grove::gossip
