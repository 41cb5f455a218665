// Collectives (collectives.hpp): the trainer's per-step calls on the node's gossip runtime.
#include "node/collectives.hpp"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "gossip/transfer.hpp"
#include "transport/crypto.hpp"

namespace grove::node {

using gossip::CallSpec;
using gossip::Protocol;
using gossip::Time;
using Clock = std::chrono::steady_clock;

struct Collectives::Shared {
  std::shared_ptr<gossip::GossipRuntime> gossip;
  std::shared_ptr<dht::DhtRuntime> dht;
  std::shared_ptr<dht::Membership> members;
  gossip::NodeId self{};
  std::string run;
  gossip::OpId op{};
  Options o;

  // The gossip strand's: where the members of a call's operation are dialled.
  std::map<gossip::NodeId, std::string> addresses;

  std::mutex mu;
  std::condition_variable cv;
  // (mu) The end of the call submitted as `tag` (a call that ended after its trainer stopped
  // waiting is not taken for the next one).
  std::optional<std::pair<std::uint64_t, gossip::CallResult>> result;

  // The trainer's thread's.
  std::uint64_t tag = 0;
  Clock::time_point refreshed{};  // the member view was last read then
  gossip::OpDeadlines deadlines;
  std::size_t last_size = 2;
};

namespace {

// The group's protocol as the gossip runtime runs it: the run's StepCalls, and after every call
// into them the driver's part (start the operation they made; hand their result to the trainer's
// thread).
class CallsHost final : public Protocol {
 public:
  CallsHost(std::unique_ptr<gossip::StepCalls> calls, std::weak_ptr<Collectives::Shared> sh)
      : calls_(std::move(calls)), sh_(std::move(sh)) {}

  gossip::StepCalls& calls() { return *calls_; }

  /// The trainer's call number `tag` (on the strand): a call still in progress fails it at once.
  void submit(std::uint64_t tag, const CallSpec& spec, optim::Floats input, Time deadline,
              optim::FloatAllocator out) {
    if (calls_->busy()) {
      gossip::CallResult r;
      r.why = "the previous collective has not ended yet";
      deliver(tag, std::move(r));
      return;
    }
    tag_ = tag;
    calls_->submit(spec, std::move(input), deadline, gossip::GossipRuntime::now(), std::move(out));
    after();
  }

  // After every call into the StepCalls (on the gossip strand).
  void after() {
    auto sh = sh_.lock();
    if (!sh) return;
    if (auto op = calls_->take_op()) {
      const gossip::OpId group = calls_->op();
      std::weak_ptr<Collectives::Shared> w = sh_;
      sh->gossip->start(std::move(op), sh->addresses, [w, group](std::unique_ptr<Protocol> p) {
        auto sh = w.lock();
        if (!sh) return;
        auto held = std::make_shared<std::unique_ptr<Protocol>>(std::move(p));
        sh->gossip->with(group, [held](Protocol& g) {
          auto& host = static_cast<CallsHost&>(g);
          host.calls_->on_op_finished(std::move(*held), gossip::GossipRuntime::now());
          host.after();
        });
      });
    }
    if (auto r = calls_->take_result()) deliver(tag_, std::move(*r));
  }

  /// grove.send / grove.recv with the member of rank `peer_rank` in the last call's group.
  void transfer(std::uint64_t tag, bool sending, std::uint32_t peer_rank, optim::Floats values,
                Time deadline) {
    auto sh = sh_.lock();
    if (!sh) return;
    const auto& members = calls_->last_members();
    gossip::CallResult r;
    r.call = calls_->last_call();
    r.size = static_cast<std::uint32_t>(members.size());
    r.rank = static_cast<std::uint32_t>(std::find(members.begin(), members.end(), sh->self) -
                                        members.begin());
    if (peer_rank >= members.size() || peer_rank == r.rank) {
      r.why = "rank " + std::to_string(peer_rank) + " is not another member of the last " +
              "collective's group (" + std::to_string(members.size()) +
              " members; make a collective, e.g. grove.barrier(), to form one)";
      return deliver(tag, std::move(r));
    }
    const gossip::NodeId peer = members[peer_rank];
    const gossip::NodeId src = sending ? sh->self : peer, dst = sending ? peer : sh->self;
    auto& seq = pair_seq_[{src, dst}];
    if (seq.first != r.call) seq = {r.call, 0};
    const std::uint64_t k = seq.second++;
    if (pair_seq_.size() > 4 * gossip::StepGroupOptions{}.max_members)
      std::erase_if(pair_seq_, [&](const auto& e) { return e.second.first != r.call; });

    transport::Blake2b256 h;
    const std::string tagname = "grove/p2p";
    h.update(std::span(reinterpret_cast<const std::uint8_t*>(tagname.data()), tagname.size()));
    h.update(std::span(reinterpret_cast<const std::uint8_t*>(sh->run.data()), sh->run.size()));
    h.update(src);
    h.update(dst);
    std::uint8_t nums[16];
    for (int i = 0; i < 8; ++i) {
      nums[i] = static_cast<std::uint8_t>(r.call >> (8 * i));
      nums[8 + i] = static_cast<std::uint8_t>(k >> (8 * i));
    }
    h.update(nums);
    const auto d = h.final();
    gossip::OpId op{};
    std::memcpy(op.data(), d.data(), op.size());

    const Time now = gossip::GossipRuntime::now();
    gossip::TransferOptions o;
    o.chunk_values = sh->o.calls.chunk_values;
    o.heartbeat = sh->o.calls.timers.heartbeat;
    o.chunk_timeout = sh->o.calls.timers.chunk_timeout;
    o.total_timeout = std::max(Time(1), deadline - now);
    auto t = sending ? gossip::Transfer::send(op, peer, std::move(values), o, now)
                     : gossip::Transfer::receive(op, peer, std::move(values), o, now);
    std::weak_ptr<Collectives::Shared> w = sh_;
    const gossip::OpId group = calls_->op();
    sh->gossip->start(std::unique_ptr<Protocol>(std::move(t)), sh->addresses,
                      [w, group, tag, r](std::unique_ptr<Protocol> p) {
                        auto sh = w.lock();
                        if (!sh) return;
                        auto held = std::make_shared<std::unique_ptr<Protocol>>(std::move(p));
                        sh->gossip->with(group, [held, tag, r](Protocol& g) mutable {
                          auto* t = dynamic_cast<gossip::Transfer*>(held->get());
                          if (t && t->status() == gossip::OpStatus::done) {
                            r.ok = true;
                            r.values = t->take_result();
                          } else {
                            r.why = t ? t->failure() : "the transfer could not start";
                          }
                          static_cast<CallsHost&>(g).deliver(tag, std::move(r));
                        });
                      });
  }

  void deliver(std::uint64_t tag, gossip::CallResult r) {
    auto sh = sh_.lock();
    if (!sh) return;
    std::lock_guard lk(sh->mu);
    sh->result.emplace(tag, std::move(r));
    sh->cv.notify_all();
  }

  const gossip::OpId& op() const override { return calls_->op(); }
  void on_message(const gossip::NodeId& from, const gossip::Message& m, Time now) override {
    calls_->on_message(from, m, now);
    after();
  }
  void on_peer_failed(const gossip::NodeId& peer, Time now) override {
    calls_->on_peer_failed(peer, now);
    after();
  }
  void on_timer(Time now) override {
    calls_->on_timer(now);
    after();
  }
  std::optional<Time> next_deadline() const override { return calls_->next_deadline(); }
  std::vector<gossip::Outgoing> take_outgoing() override { return calls_->take_outgoing(); }
  bool finished() const override { return false; }
  bool ordered() const override { return calls_->ordered(); }

 private:
  std::unique_ptr<gossip::StepCalls> calls_;
  std::weak_ptr<Collectives::Shared> sh_;
  std::uint64_t tag_ = 0;
  // Transfers per (sender, receiver) since the last call: (that call, how many).
  std::map<std::pair<gossip::NodeId, gossip::NodeId>, std::pair<std::uint64_t, std::uint64_t>>
      pair_seq_;
};

const char* kind_name(CallSpec::Kind k) {
  switch (k) {
    case CallSpec::Kind::all_reduce:
      return "all-reduce";
    case CallSpec::Kind::all_gather:
      return "all-gather";
    case CallSpec::Kind::barrier:
      return "barrier";
  }
  return "?";
}

}  // namespace

gossip::OpId Collectives::group_op(const std::string& run) {
  transport::Blake2b256 h;
  const std::string tag = "grove/step-group";
  h.update(std::span(reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()));
  h.update(std::span(reinterpret_cast<const std::uint8_t*>(run.data()), run.size()));
  const auto d = h.final();
  gossip::OpId op{};
  std::memcpy(op.data(), d.data(), op.size());
  return op;
}

Collectives::Collectives(std::shared_ptr<gossip::GossipRuntime> gossip,
                         std::shared_ptr<dht::DhtRuntime> dht,
                         std::shared_ptr<dht::Membership> members, gossip::NodeId self,
                         std::string run, Options o)
    : sh_(std::make_shared<Shared>()) {
  sh_->gossip = std::move(gossip);
  sh_->dht = std::move(dht);
  sh_->members = std::move(members);
  sh_->self = self;
  sh_->run = std::move(run);
  sh_->op = group_op(sh_->run);
  sh_->o = std::move(o);
  sh_->deadlines = gossip::OpDeadlines(sh_->o.deadlines);
  auto calls = std::make_unique<gossip::StepCalls>(sh_->run, sh_->op, self, sh_->o.calls);
  sh_->gossip->start(std::make_unique<CallsHost>(std::move(calls), sh_), {}, {});
}

Collectives::~Collectives() = default;

void Collectives::refresh_members() {
  auto sh = sh_;
  sh->refreshed = Clock::now();
  std::map<gossip::NodeId, std::string> addresses;
  try {
    sh->dht->post_wait([&](dht::DhtNode&, dht::Time) {
      for (const auto& m : sh->members->live(dht::DhtRuntime::wall_now()))
        if (m.id != sh->self)
          addresses[m.id] = m.addresses.empty() ? std::string() : m.addresses.front();
    });
  } catch (const std::exception& e) {
    spdlog::debug("collectives: could not read the member view: {}", e.what());
    return;
  }
  std::vector<gossip::NodeId> ids;
  for (const auto& [id, a] : addresses) ids.push_back(id);
  sh->gossip->set_addresses(sh->op, addresses);
  sh->gossip->with(
      sh->op, [sh, ids = std::move(ids), addresses = std::move(addresses)](Protocol& g) mutable {
        sh->addresses = std::move(addresses);
        auto& host = static_cast<CallsHost&>(g);
        host.calls().set_candidates(std::move(ids), gossip::GossipRuntime::now());
        host.after();
      });
}

std::uint64_t Collectives::wire_bytes(const CallSpec& spec, std::uint64_t n) const {
  const std::size_t members = std::max<std::size_t>(2, sh_->last_size);
  switch (spec.kind) {
    case CallSpec::Kind::all_reduce:
      return gossip::allreduce_wire_bytes(spec.wire, n, members);
    case CallSpec::Kind::all_gather: {
      gossip::GatherCodec c;
      c.kind = gossip::WireCodec::fp32;
      return gossip::allgather_wire_bytes(c, n, members);
    }
    case CallSpec::Kind::barrier:
      return 64;
  }
  return 0;
}

std::string Collectives::describe_deadline(const CallSpec& spec, std::uint64_t n) const {
  return sh_->deadlines.describe(wire_bytes(spec, n));
}

// The call ends by its deadline (the group's wait and the ring's total time, or the transfer's,
// end there); a grace period on top covers the strand's queue. Stopping ends the wait, not the
// call (whose views hold the trainer's segment while it runs).
CollectiveOutcome Collectives::wait_for(std::uint64_t tag, Time limit,
                                        const std::function<bool()>& stopping, const char* what) {
  auto sh = sh_;
  const auto give_up =
      Clock::now() + std::chrono::milliseconds(limit.count()) + std::chrono::seconds(30);
  auto next_refresh = Clock::now() + sh->o.refresh;
  std::unique_lock lk(sh->mu);
  for (;;) {
    if (sh->result && sh->result->first == tag) break;
    sh->result.reset();  // a call this thread gave up on
    if (stopping && stopping()) {
      CollectiveOutcome r;
      r.why = "the node is stopping";
      return r;
    }
    if (Clock::now() >= give_up) {
      spdlog::error("collectives: a {} did not end 30 s after its deadline", what);
      CollectiveOutcome r;
      r.why = "the call did not end by its deadline";
      return r;
    }
    if (Clock::now() >= next_refresh) {
      lk.unlock();
      refresh_members();
      lk.lock();
      next_refresh = Clock::now() + sh->o.refresh;
      continue;
    }
    sh->cv.wait_for(lk, std::chrono::milliseconds(200));
  }
  auto r = std::move(sh->result->second);
  sh->result.reset();
  lk.unlock();
  CollectiveOutcome o;
  o.ok = r.ok;
  o.why = std::move(r.why);
  o.call = r.call;
  o.rank = r.rank;
  o.size = r.size;
  o.joined = r.joined;
  o.values = std::move(r.values);
  return o;
}

CollectiveOutcome Collectives::transfer(bool sending, std::uint32_t peer, optim::Floats values,
                                        std::chrono::milliseconds timeout,
                                        const std::function<bool()>& stopping) {
  auto sh = sh_;
  const std::uint64_t n = values.size();
  const std::uint64_t bytes = n * sizeof(float);
  const Time t0 = gossip::GossipRuntime::now();
  const Time limit =
      timeout.count() > 0 ? Time(timeout.count()) : sh->deadlines.deadline_for(bytes);
  const std::uint64_t tag = ++sh->tag;
  auto v = std::make_shared<optim::Floats>(std::move(values));
  sh->gossip->with(sh->op, [tag, sending, peer, v, deadline = t0 + limit](Protocol& g) {
    static_cast<CallsHost&>(g).transfer(tag, sending, peer, std::move(*v), deadline);
  });
  const char* what = sending ? "send" : "recv";
  CollectiveOutcome o = wait_for(tag, limit, stopping, what);
  const Time took = gossip::GossipRuntime::now() - t0;
  if (o.ok)
    spdlog::debug("collectives: {} of {} values with rank {} in {} ms", what, n, peer,
                  took.count());
  else
    spdlog::warn("collectives: {} of {} values with rank {} failed after {} ms: {}", what, n, peer,
                 took.count(), o.why);
  return o;
}

CollectiveOutcome Collectives::run(const CallSpec& spec, optim::Floats input,
                                   optim::FloatAllocator out, std::chrono::milliseconds timeout,
                                   const std::function<bool()>& stopping) {
  auto sh = sh_;
  // The member view once every `refresh` (a DHT round trip: not on every call of a training
  // loop that makes hundreds a minute).
  if (Clock::now() >= sh->refreshed + sh->o.refresh) refresh_members();
  const std::uint64_t n = input.size();
  const std::uint64_t bytes = wire_bytes(spec, n);
  const Time t0 = gossip::GossipRuntime::now();
  const Time limit =
      timeout.count() > 0 ? Time(timeout.count()) : sh->deadlines.deadline_for(bytes);
  const Time deadline = t0 + limit;
  const std::uint64_t tag = ++sh->tag;
  auto in = std::make_shared<optim::Floats>(std::move(input));
  sh->gossip->with(sh->op, [tag, spec, in, deadline, out = std::move(out)](Protocol& g) mutable {
    static_cast<CallsHost&>(g).submit(tag, spec, std::move(*in), deadline, std::move(out));
  });

  CollectiveOutcome o = wait_for(tag, limit, stopping, kind_name(spec.kind));
  const Time took = gossip::GossipRuntime::now() - t0;
  if (o.ok) {
    sh->last_size = o.size;
    if (o.size > 1) sh->deadlines.observe(wire_bytes(spec, n), took);
    spdlog::debug("collectives: call {} ({}, {} values) among {} in {} ms", o.call,
                  kind_name(spec.kind), n, o.size, took.count());
  } else {
    spdlog::warn("collectives: call {} ({}, {} values) failed after {} ms: {}", o.call,
                 kind_name(spec.kind), n, took.count(), o.why);
  }
  return o;
}

}  // namespace grove::node
