#include "sim/swarm.hpp"

#include "gossip/state_check.hpp"

#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>

namespace grove::sim {

SwarmOptions fast_options(gossip::OuterMode mode) {
  using ms = std::chrono::milliseconds;
  SwarmOptions o;
  o.params = 512;
  o.round.mode = mode;
  o.round.noloco = optim::kNoLoCoGrove;  // the node's default (node/config.hpp)
  o.round.match.window = ms(2000);
  o.round.match.min_lead = ms(500);
  o.round.match.settle = ms(500);
  o.round.match.read_timeout = ms(4000);
  o.round.mode_poll = ms(1000);
  o.round.exchange.chunk_timeout = ms(3000);
  o.round.allreduce.chunk_timeout = ms(3000);
  o.round.allreduce.heartbeat = ms(500);
  o.round.threads = 1;
  o.membership.poll_every = ms(1000);
  o.membership.publish_every = ms(2000);
  o.membership.ttl = ms(6000);
  return o;
}

struct Swarm::Node {
  std::size_t index = 0;
  gossip::NodeId id{};
  NodeSpec spec;
  std::unique_ptr<dht::Membership> members;
  std::shared_ptr<gossip::StateServer> server;
  std::unique_ptr<gossip::RoundEngine> engine;
  std::unique_ptr<node::Controller> ctl;
  std::optional<Time> inner_done;  // a phase under way (the controller's `train`) ends then
  std::vector<float> theta;        // the fast weights
  std::size_t phases = 0;
  std::size_t checkpoints = 0;
  bool left_done = false;  // the member record's removal went out
  Time first_inner{-1};
  Time busy{0};
  std::size_t requests_in = 0;
  std::vector<gossip::RoundReport> reports;
  std::size_t rounds = 0;
  bool alive = true;
  std::mt19937_64 rng;  // the inner phases' own randomness
  NetModel::Placement place;
  bool leaving = false;      // leave() was asked
  std::optional<Time> wake;  // its entry in wake_
  int join_attempts = 0;
  Time state_up_free{0};  // when its link is free of the state replies already sent
};

Swarm::Swarm(std::uint64_t seed, SwarmOptions opts)
    : opts_(std::move(opts)),
      seed_(seed),
      dht_(seed, opts_.dht_link, opts_.dht),
      gossip_(seed ^ 0x9e3779b97f4a7c15ull, opts_.gossip_link) {
  if (opts_.workload) opts_.params = opts_.workload->params();
  if (opts_.stands_for > static_cast<double>(opts_.params)) {
    scale_ = opts_.stands_for / static_cast<double>(opts_.params);
    gossip_.set_payload_scale(scale_);
    auto& r = opts_.round;
    r.op_deadline.min_rate /= scale_;
    r.sync.min_rate /= scale_;
    // A silence timeout grows by the factor a simulated piece (a chunk, a state chunk) stands
    // for over a real one.
    const auto silence = [&](Time t, double piece, double real_piece) {
      const double f = scale_ * piece / real_piece;
      return Time(static_cast<std::int64_t>(static_cast<double>(t.count()) * std::max(1.0, f)));
    };
    const double real_chunk = double(gossip::ExchangeOptions{}.chunk_values);  // the node's
    r.exchange.chunk_timeout =
        silence(r.exchange.chunk_timeout, double(r.exchange.chunk_values), real_chunk);
    r.allreduce.chunk_timeout =
        silence(r.allreduce.chunk_timeout, double(r.allreduce.chunk_values), real_chunk);
    const double state_bytes = 8.0 * static_cast<double>(opts_.params) + 64;
    opts_.control.join_wait =
        silence(opts_.control.join_wait, std::min(state_bytes, double(r.snapshot_chunk)),
                double(r.snapshot_chunk));
    r.allreduce.linger = std::max(r.allreduce.linger, r.allreduce.chunk_timeout + Time(2000));
  }
  if (opts_.net) {
    const auto& net = *opts_.net;
    auto link = opts_.dht_link;
    link.jitter = Time(static_cast<std::int64_t>(net.jitter_ms));
    link.loss = net.loss;
    dht_.set_model(link);
    dht_.set_latency([this](std::size_t a, std::size_t b) {
      return opts_.net->one_way(nodes_.at(a)->place, nodes_.at(b)->place);
    });
    gossip_.set_latency([this](const gossip::NodeId& a, const gossip::NodeId& b) {
      return opts_.net->one_way(nodes_.at(index_.at(a))->place, nodes_.at(index_.at(b))->place);
    });
  }
  dht_.set_on_touched([this](std::size_t i) { touched_.insert(i); });
  now_ = dht_.now();
  gossip_.run_until(now_);  // one time base for both networks
  gossip_.set_on_finished([this](const gossip::NodeId& id, std::unique_ptr<gossip::Protocol> p) {
    for (auto& n : nodes_) {
      if (!n->alive || n->id != id) continue;
      const std::size_t i = n->index;
      dht_.call(i, [&](dht::DhtNode&) { n->engine->on_op_finished(std::move(p), now_); });
      service(i);
      touched_.insert(i);
      return;
    }
  });
}

Swarm::~Swarm() {
  // Engines and memberships refer to the DHT nodes: they go first.
  for (auto& n : nodes_) {
    n->engine.reset();
    n->members.reset();
  }
}

std::size_t Swarm::add(NodeSpec spec) {
  const std::size_t i = dht_.add_node();
  auto n = std::make_unique<Node>();
  n->index = i;
  n->id = dht_.node(i).id();
  n->rng.seed(seed_ * 0x2545f4914f6cdd1dull + i);
  gossip_.add_node(n->id);
  index_[n->id] = i;
  if (opts_.net) {
    std::mt19937_64 prng(seed_ ^ (0x51ed27u + 7919 * i));
    n->place = opts_.net->place(prng);
    const auto& a = opts_.net->access.at(n->place.access);
    gossip_.set_uplink(n->id, NetModel::bytes_per_ms(a.up_mbit));
    gossip_.set_downlink(n->id, NetModel::bytes_per_ms(a.down_mbit));
  }
  if (opts_.workload) {
    std::mt19937_64 wrng(seed_ * 31 + 17 * i + 1);
    opts_.workload->add_node(i, wrng);
  }
  if (spec.target.empty() && !opts_.workload) {
    std::mt19937_64 rng(seed_ * 1000003 + i);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    spec.target.resize(opts_.params);
    for (auto& v : spec.target) v = dist(rng);
  }
  if (!opts_.workload && spec.target.size() != opts_.params)
    throw std::invalid_argument("Swarm: target size");
  n->spec = std::move(spec);
  n->members = std::make_unique<dht::Membership>(dht_.node(i), opts_.run_id, opts_.membership);
  dht::MemberInfo self;
  self.addresses = {dht_.address(i)};
  self.status = "joining";
  n->members->set_self(self);
  n->server = std::make_shared<gossip::StateServer>();
  n->engine =
      std::make_unique<gossip::RoundEngine>(dht_.node(i), *n->members, opts_.run_id,
                                            std::vector{dht_.address(i)}, opts_.round, n->server);
  auto control = opts_.control;
  control.window = opts_.round.match.window;
  control.overlap = n->spec.overlap;
  n->ctl = std::make_unique<node::Controller>(control);
  nodes_.push_back(std::move(n));
  return i;
}

std::size_t Swarm::bootstrap(NodeSpec spec) {
  const std::size_t i = add(std::move(spec));
  nodes_[i]->ctl->begin(node::StartKind::bootstrap, false, now_);
  service(i);
  reschedule(i);
  return i;
}

std::size_t Swarm::join(std::size_t via, NodeSpec spec) {
  const std::size_t i = add(std::move(spec));
  dht_.call(i, [&](dht::DhtNode& d) {
    d.bootstrap({dht_.address(via)}, now_, [this, i](std::size_t) {
      if (!alive(i)) return;
      nodes_[i]->ctl->begin(node::StartKind::join, true, dht_.now());
      touched_.insert(i);  // its actions run at the next visit
    });
  });
  service(i);
  return i;
}

void Swarm::kill(std::size_t i) {
  auto& n = *nodes_.at(i);
  if (!n.alive) return;
  n.alive = false;
  n.engine.reset();
  n.members.reset();
  n.server.reset();
  gossip_.kill(n.id);
  dht_.kill(i);
  if (n.wake) wake_.erase({*n.wake, i});
  n.wake.reset();
  touched_.erase(i);
}

void Swarm::leave(std::size_t i) {
  auto& n = *nodes_.at(i);
  if (!n.alive || n.leaving) return;
  n.leaving = true;
  n.inner_done.reset();  // the phase under way is abandoned
  n.ctl->stop(now_);
  touched_.insert(i);
}

bool Swarm::leaving(std::size_t i) const {
  return i < nodes_.size() && nodes_[i]->leaving;
}

bool Swarm::alive(std::size_t i) const {
  return i < nodes_.size() && nodes_[i]->alive;
}

std::size_t Swarm::alive_count() const {
  std::size_t c = 0;
  for (const auto& n : nodes_) c += n->alive;
  return c;
}

NetModel::Placement Swarm::placement(std::size_t i) const {
  return nodes_.at(i)->place;
}

double Swarm::loss(std::size_t i) const {
  if (!opts_.workload) throw std::logic_error("Swarm::loss: no workload");
  const auto& e = *nodes_.at(i)->engine;
  return e.stepping() ? NAN : opts_.workload->loss(e.state().phi);
}

void Swarm::inner_phase(std::size_t i, std::span<float> theta) {
  auto& n = *nodes_[i];
  if (opts_.workload) return opts_.workload->inner(i, theta, n.rng);
  for (std::size_t k = 0; k < theta.size(); ++k)
    theta[k] += opts_.inner_lr * (n.spec.target[k] - theta[k]);
}
gossip::RoundEngine& Swarm::engine(std::size_t i) {
  return *nodes_.at(i)->engine;
}
dht::Membership& Swarm::membership(std::size_t i) {
  return *nodes_.at(i)->members;
}
const std::vector<gossip::RoundReport>& Swarm::reports(std::size_t i) const {
  return nodes_.at(i)->reports;
}
const std::vector<float>& Swarm::target(std::size_t i) const {
  return nodes_.at(i)->spec.target;
}
gossip::NodeId Swarm::id(std::size_t i) {
  return nodes_.at(i)->id;
}
std::size_t Swarm::rounds(std::size_t i) const {
  return nodes_.at(i)->rounds;
}

const node::Controller& Swarm::controller(std::size_t i) const {
  return *nodes_.at(i)->ctl;
}

std::size_t Swarm::checkpoints(std::size_t i) const {
  return nodes_.at(i)->checkpoints;
}

int Swarm::join_attempts(std::size_t i) const {
  return nodes_.at(i)->join_attempts;
}

std::size_t Swarm::state_requests(std::size_t i) const {
  return nodes_.at(i)->requests_in;
}

double Swarm::utilization(std::size_t i) const {
  const auto& n = *nodes_.at(i);
  if (n.first_inner < Time(0) || now_ <= n.first_inner) return 0;
  return static_cast<double>(n.busy.count()) / static_cast<double>((now_ - n.first_inner).count());
}

void Swarm::end_step(std::size_t i, gossip::RoundEngine::StepJob& job) {
  job.run();
  dht_.call(i, [&](dht::DhtNode&) { nodes_[i]->engine->on_step_done(job.seq, now_); });
}

void Swarm::service(std::size_t i) {
  // Until neither the engine nor the controller has anything more: what one produces (a report,
  // a submit) may give the other something to do at this same instant.
  for (bool more = true; more && alive(i);) {
    more = drain(i);
    if (alive(i)) more = act(i) || more;
  }
}

bool Swarm::drain(std::size_t i) {
  auto& n = *nodes_[i];
  bool any = false;
  for (auto& op : n.engine->take_ops()) {
    any = true;
    auto p = op.make(gossip_.now());
    if (!p) {  // it could not be built: the engine hears so, as from grove-node's runtime
      dht_.call(i, [&](dht::DhtNode&) { n.engine->on_op_finished(nullptr, now_); });
      continue;
    }
    gossip_.attach(n.id, std::move(p));
    if (!n.alive) return true;
  }
  for (auto& job : n.engine->take_step_jobs()) {
    any = true;
    if (n.spec.step_time > Time(0) && !job.prepare) {  // ends after step_time (virtual)
      steps_.push({now_ + n.spec.step_time, seq_++, i, std::move(job)});
      continue;
    }
    end_step(i, job);
    if (!n.alive) return true;
  }
  for (auto& job : n.engine->take_snapshot_jobs()) {  // built at once (virtual time)
    any = true;
    auto snap = gossip::StateSnapshot::of(job.run_id, job.round, job.blob, job.chunk_bytes);
    if (!snap) throw std::logic_error("a memory blob failed: " + snap.text());
    dht_.call(i, [&](dht::DhtNode&) { n.engine->on_snapshot(job.seq, std::move(*snap), now_); });
  }
  for (auto& req : n.engine->take_state_requests()) {
    any = true;
    Reply r;
    r.to = i;
    r.id = req.id;
    const auto lat = opts_.gossip_link.latency;
    std::optional<std::size_t> donor;
    if (req.address.rfind("sim:", 0) == 0) {
      try {
        donor = std::stoul(req.address.substr(4));
      } catch (const std::exception&) {
      }
    }
    if (!donor || !alive(*donor)) {
      r.at = now_ + lat + opts_.gossip_link.loss_detect;
    } else if (const bool probe = gossip::decode_probe(req.body).has_value();
               auto body = (nodes_[*donor]->requests_in += !probe,
                            nodes_[*donor]->server->answer(req.body))) {
      r.ok = true;
      r.body = std::move(*body);
      if (probe) {  // a few hundred bytes: not held up behind the chunks being served
        r.at = now_ + 2 * lat;
        r.seq = seq_++;
        replies_.push(std::move(r));
        continue;
      }
      // The donor's replies leave over its link one after another.
      auto& up = nodes_[*donor]->state_up_free;
      up = std::max(up, now_ + lat) +
           Time(static_cast<std::int64_t>(static_cast<double>(r.body.size()) * scale_ /
                                          opts_.gossip_link.bytes_per_ms));
      r.at = up + lat;
    } else {
      r.at = now_ + 2 * lat;
    }
    r.seq = seq_++;
    replies_.push(std::move(r));
  }
  for (auto& rep : n.engine->take_reports()) {
    any = true;
    if (rep.kind == gossip::RoundReport::Kind::round) ++n.rounds;
    n.ctl->on_report(rep, now_);
    // reports(i) keeps outcomes (rounds, syncs); a sync's progress goes to the controller and
    // the watcher only.
    if (rep.kind != gossip::RoundReport::Kind::sync_progress) n.reports.push_back(rep);
    if (watch_) watch_(i, rep);
    if (!n.alive) return true;
  }
  return any;
}

// The controller's actions on this node: the same ones grove-node carries out (node/
// training_loop.cpp), with θ a vector here and the inner phase a stretch of virtual time.
bool Swarm::act(std::size_t i) {
  auto& n = *nodes_[i];
  auto actions = n.ctl->take_actions();
  for (const auto& a : actions) {
    if (!n.alive) return true;
    using K = node::Action::Kind;
    switch (a.kind) {
      case K::start_fresh: {
        optim::OuterState s;
        if (opts_.workload)
          s.phi = opts_.workload->initial();
        else
          s.phi.assign(opts_.params, 0.0f);
        dht_.call(i, [&](dht::DhtNode&) { n.engine->start(std::move(s), now_); });
        break;
      }
      case K::start_checkpoint:
        throw std::logic_error("Swarm: simulated nodes have no checkpoints to resume from");
      case K::join:
        ++n.join_attempts;
        dht_.call(i, [&](dht::DhtNode&) { n.engine->join(now_, opts_.params); });
        break;
      case K::load_phi: {
        // (n.theta is the θ submitted; a round of one streaming fragment takes that part.)
        const auto& phi = n.engine->state().phi;
        if (n.theta.size() != phi.size() || a.slice.whole(phi.size())) {
          n.theta = phi.to_vector();
        } else {
          const std::size_t lo = std::min(a.slice.lo, phi.size()), hi = a.slice.end(phi.size());
          std::copy(phi.begin() + lo, phi.begin() + hi, n.theta.begin() + lo);
        }
        break;
      }
      case K::mix: {  // (a round of one streaming fragment: that part of θ)
        const std::size_t lo = std::min(a.slice.lo, n.theta.size()),
                          hi = std::max(lo, a.slice.end(n.theta.size()));
        n.engine->mix_part(std::span(n.theta).subspan(lo, hi - lo), lo, a.alpha);
        break;
      }
      case K::train:
        if (n.first_inner < Time(0)) n.first_inner = now_;
        n.inner_done = now_ + n.spec.inner_time;
        break;
      case K::check:
        n.ctl->on_theta(n.theta, now_);
        break;
      case K::submit:
        dht_.call(i, [&](dht::DhtNode&) { n.engine->submit(n.theta, now_); });
        break;
      case K::set_patience:
        dht_.call(i, [&](dht::DhtNode&) { n.engine->set_patience(a.time); });
        break;
      case K::set_group_wait:
        dht_.call(i, [&](dht::DhtNode&) { n.engine->set_group_wait(a.time); });
        break;
      case K::checkpoint:
        ++n.checkpoints;
        break;
      case K::leave:
        dht_.call(i, [&](dht::DhtNode&) {
          n.members->leave(now_, [this, i] {
            if (!alive(i)) return;
            nodes_[i]->left_done = true;
            touched_.insert(i);
          });
        });
        break;
      case K::exit:
        kill(i);
        return true;
    }
  }
  return !actions.empty();
}

std::optional<Time> Swarm::deadline(std::size_t i) const {
  const auto& n = *nodes_[i];
  if (!n.alive) return std::nullopt;
  Time t = n.members->next_deadline();
  if (auto d = n.engine->next_deadline()) t = std::min(t, *d);
  if (n.inner_done) t = std::min(t, *n.inner_done);
  if (auto d = n.ctl->next_deadline()) t = std::min(t, *d);
  return t;
}

void Swarm::reschedule(std::size_t i) {
  auto& n = *nodes_[i];
  if (n.wake) wake_.erase({*n.wake, i});
  n.wake = deadline(i);
  if (n.wake) wake_.insert({*n.wake, i});
}

void Swarm::visit(std::size_t i) {
  auto& n = *nodes_[i];
  if (!n.alive) return;
  if (n.inner_done && *n.inner_done <= now_) {
    n.inner_done.reset();
    n.busy += n.spec.inner_time;
    inner_phase(i, n.theta);
    if (n.spec.after_inner) n.spec.after_inner(n.phases, n.theta);
    ++n.phases;
    n.ctl->on_inner_done(n.spec.inner_time, n.members->live(now_).size(), now_);
  }
  if (n.left_done) {
    n.left_done = false;
    n.ctl->on_left(now_);
  }
  if (auto d = n.ctl->next_deadline(); d && *d <= now_) n.ctl->on_timer(now_);
  if (auto d = deadline(i); d && *d <= now_)
    dht_.call(i, [&](dht::DhtNode&) {
      n.members->on_timer(now_);
      n.engine->on_timer(now_);
    });
  service(i);
  if (!n.alive) return;
  reschedule(i);
}

void Swarm::step(Time t) {
  now_ = t;
  dht_.run_until(t);
  gossip_.run_until(t);
  while (!replies_.empty() && replies_.top().at <= t) {
    Reply r = replies_.top();
    replies_.pop();
    if (!alive(r.to)) continue;
    auto& e = *nodes_[r.to]->engine;
    dht_.call(r.to, [&](dht::DhtNode&) {
      if (r.ok)
        e.on_state_response(r.id, r.body, now_);
      else
        e.on_state_failure(r.id, now_);
    });
    service(r.to);
  }
  while (!steps_.empty() && steps_.top().at <= t) {
    PendingStep p = steps_.top();
    steps_.pop();
    if (!alive(p.to)) continue;
    end_step(p.to, p.job);
    service(p.to);
  }
  while (!wake_.empty() && wake_.begin()->first <= t) {
    const std::size_t i = wake_.begin()->second;
    wake_.erase(wake_.begin());
    nodes_[i]->wake.reset();
    touched_.insert(i);
  }
  // Each node once per step, in index order; what visiting one does to others (or to itself)
  // is seen at the next step of this same instant.
  const auto due = std::exchange(touched_, {});
  for (const std::size_t i : due) visit(i);
}

void Swarm::run_until(Time t) {
  run_until([] { return false; }, t - now_);
}

bool Swarm::run_until(const std::function<bool()>& pred, Time limit) {
  const Time end = now_ + limit;
  Time last{-1};
  int same = 0;
  while (!pred()) {
    std::optional<Time> next = dht_.next_event();
    auto take = [&](std::optional<Time> d) {
      if (d && (!next || *d < *next)) next = d;
    };
    take(gossip_.next_event());
    if (!replies_.empty()) take(replies_.top().at);
    if (!steps_.empty()) take(steps_.top().at);
    if (!wake_.empty()) take(wake_.begin()->first);
    if (!touched_.empty()) take(now_);
    if (!next || *next > end) break;
    const Time t = std::max(*next, now_);
    if (t == last && ++same > 100000) {
      std::string who;
      for (std::size_t i = 0; i < nodes_.size(); ++i) {
        if (!nodes_[i]->alive) continue;
        const auto& n = *nodes_[i];
        if (n.members->next_deadline() <= t) who += " membership of node " + std::to_string(i);
        if (auto d = n.engine->next_deadline(); d && *d <= t)
          who += " round engine of node " + std::to_string(i);
        if (n.inner_done && *n.inner_done <= t) who += " inner phase of node " + std::to_string(i);
      }
      throw std::logic_error("Swarm: no progress at one instant:" + who);
    }
    if (t != last) same = 0;
    last = t;
    step(t);
  }
  if (pred()) return true;
  if (now_ < end) step(end);
  return pred();
}

}  // namespace grove::sim
