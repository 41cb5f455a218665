#include "node/network.hpp"

#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "node/addresses.hpp"
#include "transport/reach.hpp"
#include "transport/strand.hpp"

namespace grove::node {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using transport::ConfigError;

namespace {

constexpr const char* kRunsKey = "grove-runs";
constexpr dht::Time kRunRecordTtl{23 * 3600 * 1000};
constexpr auto kRunRecordRefresh = std::chrono::hours(6);  // well inside the TTL

}  // namespace

std::uint64_t seed_of(const transport::NodeId& id) {
  std::uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s = (s << 8) | id[static_cast<std::size_t>(i)];
  return s;
}

Network::Time Network::now() {
  return std::chrono::duration_cast<Time>(std::chrono::steady_clock::now().time_since_epoch());
}

Network::Network(
    const CliOptions& o, const transport::Identity& identity,
    std::optional<transport::SwarmKey> swarm_key,
    const std::function<void(const std::shared_ptr<transport::Host>&)>& register_handlers) {
  io_thread_ = std::thread([this] { io_.run(); });
  transport::HostOptions ho;
  ho.listen = o.listen;
  ho.swarm_key = swarm_key;
  keyed_ = swarm_key.has_value();
  ho.relay.serve = o.relay;
  if (o.emulate_link) {
    transport::FaultConfig fc;
    fc.latency = transport::Duration(o.emulate_link->rtt_ms / 2);
    fc.bandwidth_bytes_per_sec = o.emulate_link->bytes_per_sec;
    fc.packet_loss = o.emulate_link->loss;
    ho.faults = std::make_shared<transport::FaultPlan>(seed_of(identity.id()));
    ho.faults->set_default(fc);
    spdlog::info(
        "emulating links: {:.0f} Mbit/s, +{} ms round trip, {:.1f}% packet loss (a frame with a "
        "lost packet arrives a retransmission timeout late)",
        fc.bandwidth_bytes_per_sec * 8 / 1e6, o.emulate_link->rtt_ms, 100 * fc.packet_loss);
  }
  try {
    host_ = transport::Host::create(io_, identity, ho);
    dht_ = dht::DhtRuntime::create(host_, dht::DhtOptions{}, seed_of(host_->id()));
    gossip_ = gossip::GossipRuntime::create(host_);
    gossip::serve_state(*host_, server_);
    transport::serve_reach_checks(*host_);
    register_handlers(host_);
    transport::run_on(host_->executor(), [&] { host_->start(); });
    start(o, swarm_key);
  } catch (...) {
    shutdown();  // (the io thread is joined before this object goes)
    throw;
  }
}

void Network::start(const CliOptions& o, const std::optional<transport::SwarmKey>& swarm_key) {
  advertise_ = advertise_address(host_->address(), o.peers);
  auto candidates =
      o.advertise.empty() ? local_candidates(host_->address(), advertise_) : o.advertise;
  dht_->start(candidates.front());
  // A joining node is a DHT client (not handed out as a contact) until peers have dialed its
  // addresses back; the first node of a swarm has nobody to ask and advertises them as they are.
  if (!o.bootstrap) dht_->set_address("");
  const std::string lan_name =
      "grove-" + (swarm_key
                      ? transport::to_hex(transport::blake2b_256(swarm_key->bytes)).substr(0, 8)
                      : std::string("open"));
  lan_ = dht::discover_on_lan(dht_, *host_, lan_name);
  transport::run_on(host_->executor(), [&] {
    published_ = {candidates, transport::Reachability::unchecked};
    upkeep_.emplace(std::move(candidates), seed_of(host_->id()), !o.bootstrap, now());
    timer_.emplace(io_);
    run_timer_.emplace(io_);
    if (o.bootstrap) arm();  // the first check once others have joined
  });
  // A home router may forward a port to us (UPnP IGD): its address becomes a candidate, checked
  // like the others. Not with --advertise (the user has said where we are) or on loopback.
  if (const auto colon = host_->address().rfind(':');
      o.upnp && o.advertise.empty() && colon != std::string::npos &&
      !host_->address().starts_with("127.") && !host_->address().starts_with("[::1]")) {
    PortMappingOptions pm;
    pm.port = static_cast<std::uint16_t>(std::stoul(host_->address().substr(colon + 1)));
    upnp_ = PortMapper::start(host_->executor(), pm, [this](std::string ext) {
      upkeep_->set_mapped(std::move(ext), now());
      pump();
    });
  }
}

Network::~Network() {
  shutdown();
}

void Network::bootstrap(const std::vector<std::string>& peers) {
  if (peers.empty()) return;
  // A peer's process may not answer for a few seconds (a node of a large model stalls at its
  // round's end while its disk writes the state back): the pings go again, every 2 s, until one
  // answers or 30 s have passed.
  const auto until = std::chrono::steady_clock::now() + 30s;
  for (int attempt = 1;; ++attempt) {
    transport::Rendezvous<std::size_t> reached;
    const auto started = std::chrono::steady_clock::now();
    dht_->bootstrap(peers, reached.callback());
    const auto n = reached.wait_for(
        std::max<std::chrono::steady_clock::duration>(until - started, std::chrono::seconds(1)));
    if (n && *n > 0) {
      if (attempt > 1) spdlog::info("reached the swarm at attempt {}", attempt);
      return;
    }
    const auto next = started + 2s;
    if (next >= until) break;
    std::this_thread::sleep_until(next);  // (a retry's pace, not a wait for a condition)
  }
  throw ConfigError(
      "could not reach any --peer (" + peers.front() + (peers.size() > 1 ? ", ..." : "") +
      (keyed_ ? "): is the address right, and the swarm key the one of its join command?"
              : "): is the address right? A swarm is closed unless bootstrapped with "
                "--open: join it with the --swarm-key its bootstrap printed"));
}

bool Network::rejoin(const std::vector<std::string>& contacts, std::chrono::milliseconds lan_wait,
                     const std::atomic<bool>& stopping) {
  const auto known = [&] {
    std::size_t n = 0;
    dht_->post_wait([&](dht::DhtNode& d, dht::Time) { n = d.table().size(); });
    return n;
  };
  if (!contacts.empty()) {
    transport::Rendezvous<std::size_t> reached;
    dht_->bootstrap(contacts, reached.callback());
    if (const auto n = reached.wait_for(30s); n && *n > 0) {
      spdlog::info("rejoining: {} of the {} saved contacts answered", *n, contacts.size());
      return true;
    }
    spdlog::info("rejoining: none of the {} saved contacts answered", contacts.size());
  }
  if (!lan_) return known() > 0;
  // LAN discovery adds the nodes of our swarm it finds to the DHT as they show up.
  for (const auto end = std::chrono::steady_clock::now() + lan_wait;
       std::chrono::steady_clock::now() < end && !stopping;) {
    if (known() > 0) {
      spdlog::info("rejoining: found the swarm on the LAN");
      return true;
    }
    std::this_thread::sleep_for(200ms);
  }
  return known() > 0;
}

void Network::publish_run(const RunConfig& config) {
  const std::string text = config.to_text();
  dht_->put_signed(dht::key_of(kRunsKey), config.run_name(),
                   static_cast<std::uint64_t>(dht::DhtRuntime::wall_now().count()), kRunRecordTtl,
                   std::vector<std::uint8_t>(text.begin(), text.end()));
  asio::post(host_->executor(), [this, config] {
    run_timer_->expires_after(kRunRecordRefresh);
    run_timer_->async_wait([this, config](const boost::system::error_code& e) {
      if (!e) publish_run(config);
    });
  });
}

// Reads the runs published in the swarm; takes `name`, or the only one there is.
std::pair<std::string, RunConfig> Network::find_run(const std::optional<std::string>& name,
                                                    const std::atomic<bool>& stopping) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline && !stopping) {
    transport::Rendezvous<dht::GetResult> got;
    dht_->get(dht::key_of(kRunsKey), got.callback());
    const auto r = got.wait_for(30s);
    std::map<std::string, RunConfig> runs;
    for (const auto& rec : r ? r->records : std::vector<dht::Record>{}) {
      auto c = parse_run_config(
          std::string_view(reinterpret_cast<const char*>(rec.value.data()), rec.value.size()));
      if (!c || c->run_name() != rec.subkey) {
        spdlog::warn("ignoring a run record '{}' that does not match its content ({})", rec.subkey,
                     c ? "name mismatch" : c.why());
        continue;
      }
      runs.emplace(rec.subkey, *c);
    }
    if (name) {
      if (auto it = runs.find(*name); it != runs.end()) return *it;
    } else if (runs.size() == 1) {
      return *runs.begin();
    } else if (runs.size() > 1) {
      std::string names;
      for (const auto& [n, c] : runs) names += " " + n;
      throw ConfigError("the swarm has several runs:" + names + "; choose one with --run NAME");
    }
    for (int i = 0; i < 10 && !stopping; ++i) std::this_thread::sleep_for(100ms);
  }
  throw ConfigError(name ? "run " + *name + " was not found in the swarm"
                         : std::string("no run found in the swarm (is a --bootstrap node up?)"));
}

// ---- reachability (host strand) ---------------------------------------------------------------

void Network::check_reach_now() {
  transport::Rendezvous<bool> checked;
  asio::post(host_->executor(),
             [this, done = checked.callback()] { run_check(now(), [done] { done(true); }); });
  if (!checked.wait_for(15s))
    throw ConfigError("the reachability check did not end (internal error)");
}

std::pair<std::vector<std::string>, transport::Reachability> Network::advertised() {
  return transport::run_on(host_->executor(), [this] {
    return std::pair{upkeep_->addresses(), upkeep_->reach()};
  });
}

void Network::attach(std::shared_ptr<dht::Membership> members,
                     std::shared_ptr<gossip::RoundRuntime> round, Servers& servers) {
  transport::run_on(host_->executor(), [&] {
    servers.attach({members, round, [this] {
                      const auto& a = upkeep_->addresses();
                      return a.empty() ? std::string() : a.front();
                    }});
    members_ = std::move(members);
    round_ = std::move(round);
    // A re-check that ended while the stack was being built: catch up.
    published_.second = members_->self().reach;
    published_.first = members_->self().addresses;
    publish();
    pump();
  });
}

void Network::stop() {
  asio::post(host_->executor(), [this] {
    if (upkeep_) upkeep_->stop();
    if (timer_) timer_->cancel();
  });
}

void Network::pump() {
  const Time t = now();
  if (auto c = upkeep_->next_check(); c && *c <= t) run_check(t, {});
  if (auto r = upkeep_->next_renewal(); r && *r <= t && members_) run_renewal(t);
  arm();
}

void Network::arm() {
  std::optional<Time> next = upkeep_->next_check();
  if (auto r = upkeep_->next_renewal(); r && members_ && (!next || *r < *next)) next = r;
  if (!next) return;
  timer_->expires_at(std::chrono::steady_clock::time_point(*next));
  timer_->async_wait([this](const boost::system::error_code& e) {
    if (!e) pump();
  });
}

// Asks up to four peers we are connected to to dial our candidate addresses back (8 s), then
// applies what they found.
void Network::run_check(Time t, std::function<void()> done) {
  std::vector<transport::NodeId> peers;
  for (const auto& p : host_->peers()) peers.push_back(p.id);
  auto c = upkeep_->begin_check(std::move(peers), t);
  if (!c) {  // under way, or nobody to ask (applied at once)
    publish();
    if (done) done();
    return;
  }
  auto check = std::make_shared<transport::ReachCheck>(upkeep_->candidates());
  auto left = std::make_shared<std::size_t>(c->helpers.size());
  transport::ReachRequest req;
  req.addresses = c->addresses;
  const auto body = transport::encode_reach_request(req);
  for (const auto& id : c->helpers) {
    host_->request(transport::PeerRef::node(id), transport::kReachMethod,
                   transport::Bytes::copy_of(body), transport::Duration(8000),
                   [this, check, left, id, done](transport::Result<transport::Payload> r) {
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
                     upkeep_->on_verdict(check->verdict(), now());
                     publish();
                     arm();
                     if (done) done();
                   });
  }
}

void Network::run_renewal(Time t) {
  auto pick = upkeep_->begin_renewal(members_->live(dht::DhtRuntime::wall_now()), host_->id(), t);
  if (pick.empty()) return;
  struct Renewal {
    std::vector<ReachUpkeep::Relay> ok;
    std::vector<transport::NodeId> refused;
    std::size_t left = 0;
  };
  auto r = std::make_shared<Renewal>();
  r->left = pick.size();
  for (const auto& relay : pick) {
    host_->reserve_relay(transport::PeerRef::node(relay.first, relay.second),
                         [this, r, relay](std::error_code ec) {
                           if (!ec) {
                             r->ok.push_back(relay);
                           } else {
                             spdlog::debug("reach: {} does not relay for us: {}",
                                           transport::short_id(relay.first), ec.message());
                             r->refused.push_back(relay.first);
                           }
                           if (--r->left > 0) return;
                           if (upkeep_->on_renewal(std::move(r->ok), r->refused, now())) publish();
                           arm();
                         });
  }
}

// What we advertise goes out: DHT address, dial-back addresses, and (once the run's stack exists
// and it changed) the member record, ready records and state offers.
void Network::publish() {
  dht_->set_address(upkeep_->dht_address());
  // Nodes behind relays dial us back at addresses that others have reached (connection reversal).
  host_->set_dialback_addresses(upkeep_->dialback());
  std::pair now_published{upkeep_->addresses(), upkeep_->reach()};
  if (!members_ || now_published == published_) return;
  published_ = now_published;
  auto self = members_->self();
  self.addresses = published_.first;
  self.reach = published_.second;
  members_->set_self(self);
  round_->with_engine([a = published_.first](gossip::RoundEngine& e) { e.set_addresses(a); });
}

void Network::on_signal(std::function<void(int)> fn) {
  transport::run_on(host_->executor(), [&] {
    signals_.emplace(io_, SIGINT, SIGTERM);
    signals_->async_wait([fn = std::move(fn)](const boost::system::error_code& e, int sig) {
      if (!e) fn(sig);
    });
  });
}

Network::Stats Network::stats() {
  return transport::run_on(host_->executor(), [this] {
    return Stats{host_->stats(), host_->relay_stats(), upkeep_->reach()};
  });
}

void Network::shutdown() {
  if (shut_) return;
  shut_ = true;
  upnp_.reset();  // removes the router's mapping
  if (!io_thread_.joinable()) return;
  lan_.reset();  // (no LAN peer is reported after this)
  if (dht_) dht_->stop();
  asio::post(io_, [this] {
    if (signals_) signals_->cancel();
    if (run_timer_) run_timer_->cancel();
    if (timer_) timer_->cancel();
  });
  if (host_) host_->shutdown();
  transport::quiesce_worker_pool();
  work_.reset();
  io_.stop();
  io_thread_.join();
}

}  // namespace grove::node
