#include "dht/lan_discovery.hpp"

#include <net/if.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <utility>

#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/address.h>
#include <avahi-common/alternative.h>
#include <avahi-common/domain.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "dht/runtime.hpp"
#include "transport/host.hpp"

namespace grove::dht {

static_assert(kLanAnyInterface == AVAHI_IF_UNSPEC);

namespace {

constexpr const char* kType = "_grove._tcp";
static_assert(std::string_view(kType) == kLanServiceType);

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

std::string to_lower(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

/// Untrusted text for a log line: at most `max` bytes, non-printable / non-ASCII bytes escaped.
std::string printable(std::string_view s, std::size_t max = 64) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

enum class Txt { missing, too_long, ok };

/// Reads TXT `key=value` into `out` if its value is at most `max` bytes (copying nothing more).
Txt txt_value(AvahiStringList* txt, const char* key, std::size_t max, std::string& out) {
  AvahiStringList* item = avahi_string_list_find(txt, key);
  if (!item) return Txt::missing;
  char* k = nullptr;
  char* v = nullptr;
  std::size_t size = 0;
  if (avahi_string_list_get_pair(item, &k, &v, &size) < 0) return Txt::missing;
  Txt r = Txt::ok;
  if (!v) {
    out.clear();
  } else if (size > max) {
    r = Txt::too_long;
  } else {
    out.assign(v, size);
  }
  avahi_free(k);
  avahi_free(v);
  return r;
}

std::string format_address(const AvahiAddress& a, std::uint16_t port, AvahiIfIndex iface) {
  char buf[AVAHI_ADDRESS_STR_MAX] = {};
  avahi_address_snprint(buf, sizeof buf, &a);
  if (a.proto != AVAHI_PROTO_INET6) return std::string(buf) + ":" + std::to_string(port);
  std::string s = "[";
  s += buf;
  const auto* b = a.data.ipv6.address;
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80 && iface > 0) {  // link-local: needs its scope
    char name[IF_NAMESIZE] = {};
    if (if_indextoname(static_cast<unsigned>(iface), name)) {
      s += "%";
      s += name;
    }
  }
  s += "]:" + std::to_string(port);
  return s;
}

/// What the Avahi thread shares with callbacks posted to the caller's executor.
struct Shared {
  std::recursive_mutex m;  // held while on_peer runs; recursive: on_peer may destroy us
  bool alive = true;
  std::function<void(LanPeer)> on_peer;
};

}  // namespace

struct LanDiscovery::Impl {
  boost::asio::any_io_executor ex;
  LanDiscoveryOptions opts;  // validated; node_id_hex lower-case
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();

  AvahiThreadedPoll* poll = nullptr;
  AvahiClient* client = nullptr;
  AvahiEntryGroup* group = nullptr;
  AvahiServiceBrowser* browser = nullptr;
  bool poll_running = false;

  // Below: touched by the Avahi thread; read elsewhere only under avahi_threaded_poll_lock.
  std::string name;      // current instance name
  bool started = false;  // start() finished (it logs set-up failures itself)
  bool failed = false;   // daemon connection lost
  bool established = false;
  std::size_t pending = 0;  // resolvers in flight
  bool saturated = false;   // warned that pending hit the bound

  ~Impl() {
    if (poll_running) avahi_threaded_poll_stop(poll);  // joins the Avahi thread
    if (client) avahi_client_free(client);  // also frees the group, browser and resolvers
    if (poll) avahi_threaded_poll_free(poll);
  }

  // ---- publishing (Avahi thread, or start() before the thread runs) ----

  void rename() {
    char* alt = avahi_alternative_service_name(name.c_str());
    if (!alt) return;
    spdlog::info("LAN discovery: service name '{}' is taken; using '{}'", printable(name),
                 printable(alt));
    name = alt;
    avahi_free(alt);
  }

  void create_services(AvahiClient* c) {
    if (!group) {
      group = avahi_entry_group_new(c, &Impl::on_group, this);
      if (!group) {
        spdlog::warn("LAN discovery: cannot publish ({})", avahi_strerror(avahi_client_errno(c)));
        return;
      }
    }
    if (!avahi_entry_group_is_empty(group)) return;
    established = false;
    for (int attempt = 0; attempt < 32; ++attempt) {
      AvahiStringList* txt = avahi_string_list_new("v=1", nullptr);
      txt = avahi_string_list_add_pair_arbitrary(
          txt, "swarm", reinterpret_cast<const std::uint8_t*>(opts.swarm.data()),
          opts.swarm.size());
      txt = avahi_string_list_add_pair(txt, "id", opts.node_id_hex.c_str());
      const int r = avahi_entry_group_add_service_strlst(
          group, opts.interface_index, AVAHI_PROTO_UNSPEC, static_cast<AvahiPublishFlags>(0),
          name.c_str(), kType, nullptr, nullptr, opts.port, txt);
      avahi_string_list_free(txt);
      if (r == AVAHI_ERR_COLLISION) {  // a local service already has this name
        rename();
        continue;
      }
      if (r < 0) {
        spdlog::warn("LAN discovery: cannot publish '{}' ({})", printable(name), avahi_strerror(r));
        avahi_entry_group_reset(group);
        return;
      }
      if (const int rc = avahi_entry_group_commit(group); rc < 0)
        spdlog::warn("LAN discovery: cannot publish '{}' ({})", printable(name),
                     avahi_strerror(rc));
      return;
    }
    spdlog::warn("LAN discovery: no free service name after 32 attempts; not publishing");
    avahi_entry_group_reset(group);
  }

  static void on_group(AvahiEntryGroup* g, AvahiEntryGroupState state, void* userdata) {
    auto* self = static_cast<Impl*>(userdata);
    switch (state) {
      case AVAHI_ENTRY_GROUP_ESTABLISHED:
        self->established = true;
        spdlog::info("LAN discovery: published '{}' ({}, port {}, swarm '{}')",
                     printable(self->name), kType, self->opts.port, printable(self->opts.swarm));
        break;
      case AVAHI_ENTRY_GROUP_COLLISION:  // someone on the network has our name
        self->established = false;
        self->rename();
        avahi_entry_group_reset(g);
        self->create_services(avahi_entry_group_get_client(g));
        break;
      case AVAHI_ENTRY_GROUP_FAILURE:
        self->established = false;
        spdlog::warn("LAN discovery: publishing '{}' failed ({})", printable(self->name),
                     avahi_strerror(avahi_client_errno(avahi_entry_group_get_client(g))));
        break;
      case AVAHI_ENTRY_GROUP_UNCOMMITED:
      case AVAHI_ENTRY_GROUP_REGISTERING:
        break;
    }
  }

  static void on_client(AvahiClient* c, AvahiClientState state, void* userdata) {
    auto* self = static_cast<Impl*>(userdata);
    switch (state) {
      case AVAHI_CLIENT_S_RUNNING:
        if (self->opts.publish && !self->failed) self->create_services(c);
        break;
      case AVAHI_CLIENT_S_COLLISION:  // our host name is being renamed: withdraw, re-add later
      case AVAHI_CLIENT_S_REGISTERING:
        self->established = false;
        if (self->group) avahi_entry_group_reset(self->group);
        break;
      case AVAHI_CLIENT_FAILURE:
        if (self->failed) break;
        self->failed = true;
        self->established = false;
        if (self->started)  // during start() the caller logs the one line itself
          spdlog::warn(
              "LAN discovery stopped: lost the Avahi daemon ({}); peers must be given with "
              "--peer host:port",
              avahi_strerror(avahi_client_errno(c)));
        break;
      case AVAHI_CLIENT_CONNECTING:
        break;
    }
  }

  // ---- browsing (Avahi thread) ----

  static void on_browse(AvahiServiceBrowser* b, AvahiIfIndex iface, AvahiProtocol proto,
                        AvahiBrowserEvent event, const char* name, const char* type,
                        const char* domain, AvahiLookupResultFlags, void* userdata) {
    auto* self = static_cast<Impl*>(userdata);
    switch (event) {
      case AVAHI_BROWSER_NEW: {
        if (self->failed) break;
        if (self->pending >= self->opts.max_pending_resolves) {
          if (!self->saturated)
            spdlog::warn("LAN discovery: {} services being resolved; skipping new ones for now",
                         self->pending);
          self->saturated = true;
          break;
        }
        AvahiClient* c = avahi_service_browser_get_client(b);
        // The address is asked in the protocol the service was seen on: with AVAHI_PROTO_UNSPEC
        // the IPv4 and the IPv6 announcement may both resolve to the IPv6 address (the daemon
        // answers from its cache, in no set order), and a node that listens on IPv4 only would
        // then never be dialed at the address it can be reached on.
        if (avahi_service_resolver_new(c, iface, proto, name, type, domain, proto,
                                       static_cast<AvahiLookupFlags>(0), &Impl::on_resolve, self))
          ++self->pending;
        else
          spdlog::debug("LAN discovery: cannot resolve '{}' ({})", printable(name ? name : ""),
                        avahi_strerror(avahi_client_errno(c)));
        break;
      }
      case AVAHI_BROWSER_FAILURE:
        if (!self->failed)
          spdlog::warn("LAN discovery: browsing failed ({})",
                       avahi_strerror(avahi_client_errno(avahi_service_browser_get_client(b))));
        break;
      case AVAHI_BROWSER_REMOVE:
      case AVAHI_BROWSER_ALL_FOR_NOW:
      case AVAHI_BROWSER_CACHE_EXHAUSTED:
        break;
    }
  }

  static void on_resolve(AvahiServiceResolver* r, AvahiIfIndex iface, AvahiProtocol,
                         AvahiResolverEvent event, const char* name, const char*, const char*,
                         const char*, const AvahiAddress* address, std::uint16_t port,
                         AvahiStringList* txt, AvahiLookupResultFlags, void* userdata) {
    auto* self = static_cast<Impl*>(userdata);
    if (self->pending > 0) --self->pending;
    if (self->pending < self->opts.max_pending_resolves) self->saturated = false;
    const std::string service = printable(name ? name : "");
    if (event == AVAHI_RESOLVER_FOUND && address)
      self->found(service, iface, *address, port, txt);
    else if (event == AVAHI_RESOLVER_FAILURE)
      spdlog::debug("LAN discovery: resolving '{}' failed ({})", service,
                    avahi_strerror(avahi_client_errno(avahi_service_resolver_get_client(r))));
    avahi_service_resolver_free(r);
  }

  void found(const std::string& service, AvahiIfIndex iface, const AvahiAddress& address,
             std::uint16_t port, AvahiStringList* txt) {
    std::string swarm, id;
    switch (txt_value(txt, "swarm", kLanMaxSwarmLen, swarm)) {
      case Txt::missing:
        spdlog::warn("LAN discovery: ignoring service '{}': no swarm in its TXT record", service);
        return;
      case Txt::too_long:
        spdlog::warn("LAN discovery: ignoring service '{}': TXT swarm longer than {} bytes",
                     service, kLanMaxSwarmLen);
        return;
      case Txt::ok:
        break;
    }
    if (swarm != opts.swarm) {
      spdlog::debug("LAN discovery: ignoring service '{}' of swarm '{}'", service,
                    printable(swarm));
      return;
    }
    if (txt_value(txt, "id", kLanNodeIdHexLen, id) != Txt::ok || id.size() != kLanNodeIdHexLen ||
        !is_hex(id)) {
      spdlog::warn("LAN discovery: ignoring service '{}': TXT id is not {} hex digits", service,
                   kLanNodeIdHexLen);
      return;
    }
    id = to_lower(std::move(id));
    if (id == opts.node_id_hex) return;  // ourselves
    if (port == 0) {
      spdlog::warn("LAN discovery: ignoring service '{}': port 0", service);
      return;
    }
    LanPeer peer{format_address(address, port, iface), std::move(id), std::move(swarm)};
    spdlog::debug("LAN discovery: found {} at {} ('{}')", peer.id_hex.substr(0, 8), peer.address,
                  service);
    boost::asio::post(ex, [sh = shared, peer = std::move(peer)]() mutable {
      std::lock_guard lock(sh->m);
      if (sh->alive && sh->on_peer) sh->on_peer(std::move(peer));
    });
  }
};

namespace {

void validate(LanDiscoveryOptions& o) {
  using transport::ConfigError;
  if (o.swarm.empty() || o.swarm.size() > kLanMaxSwarmLen ||
      o.swarm.find('\0') != std::string::npos)
    throw ConfigError("LAN discovery: swarm name must be 1 to 64 bytes without NUL");
  if (o.node_id_hex.size() != kLanNodeIdHexLen || !is_hex(o.node_id_hex))
    throw ConfigError("LAN discovery: node id must be 64 hex digits");
  o.node_id_hex = to_lower(std::move(o.node_id_hex));
  if (o.publish && o.port == 0) throw ConfigError("LAN discovery: cannot publish port 0");
  if (o.instance_name.empty()) o.instance_name = "grove-" + o.node_id_hex.substr(0, 8);
  if (!avahi_is_valid_service_name(o.instance_name.c_str()) ||
      o.instance_name.find('\0') != std::string::npos)
    throw ConfigError("LAN discovery: invalid service instance name (1 to 63 bytes)");
  if (o.interface_index < kLanAnyInterface)
    throw ConfigError("LAN discovery: invalid interface index");
  if (o.max_pending_resolves == 0) o.max_pending_resolves = 1;
}

}  // namespace

LanDiscovery::LanDiscovery(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LanDiscovery::~LanDiscovery() {
  {
    std::lock_guard lock(impl_->shared->m);  // waits for an on_peer running elsewhere
    impl_->shared->alive = false;
  }
  impl_.reset();  // stops the Avahi thread, then frees the client
}

transport::Result<std::unique_ptr<LanDiscovery>> LanDiscovery::start(
    boost::asio::any_io_executor ex, LanDiscoveryOptions opts,
    std::function<void(LanPeer)> on_peer) {
  validate(opts);
  auto impl = std::make_unique<Impl>();
  impl->ex = std::move(ex);
  impl->name = opts.instance_name;
  impl->opts = std::move(opts);
  impl->shared->on_peer = std::move(on_peer);

  const auto off = [](const char* why, int err) {
    spdlog::warn("LAN discovery off: {} ({}); use --peer host:port", why, avahi_strerror(err));
    return transport::Result<std::unique_ptr<LanDiscovery>>(transport::errc::unreachable);
  };

  impl->poll = avahi_threaded_poll_new();
  if (!impl->poll) return off("cannot create the Avahi event loop", AVAHI_ERR_NO_MEMORY);

  // The Avahi thread is not running yet: callbacks during set-up run here, without the lock.
  int err = 0;
  impl->client =
      avahi_client_new(avahi_threaded_poll_get(impl->poll), static_cast<AvahiClientFlags>(0),
                       &Impl::on_client, impl.get(), &err);
  if (!impl->client) return off("no Avahi daemon reachable", err);
  if (impl->failed) return off("no Avahi daemon reachable", avahi_client_errno(impl->client));

  if (impl->opts.browse) {
    impl->browser = avahi_service_browser_new(
        impl->client, impl->opts.interface_index, AVAHI_PROTO_UNSPEC, kType, nullptr,
        static_cast<AvahiLookupFlags>(0), &Impl::on_browse, impl.get());
    if (!impl->browser) return off("cannot browse for services", avahi_client_errno(impl->client));
  }

  // Formatted before the Avahi thread runs: it may rename us (collision) from then on.
  const std::string what =
      (impl->opts.publish ? "publishing '" + printable(impl->name) + "'" : "not publishing") +
      (impl->opts.browse ? ", browsing" : "");
  impl->started = true;
  if (const int r = avahi_threaded_poll_start(impl->poll); r < 0)
    return off("cannot start the Avahi thread", r);
  impl->poll_running = true;
  spdlog::info("LAN discovery on: swarm '{}', {}", printable(impl->opts.swarm), what);
  return std::unique_ptr<LanDiscovery>(new LanDiscovery(std::move(impl)));
}

std::string LanDiscovery::instance_name() const {
  avahi_threaded_poll_lock(impl_->poll);
  std::string n = impl_->name;
  avahi_threaded_poll_unlock(impl_->poll);
  return n;
}

bool LanDiscovery::published() const {
  avahi_threaded_poll_lock(impl_->poll);
  const bool e = impl_->established;
  avahi_threaded_poll_unlock(impl_->poll);
  return e;
}

bool LanDiscovery::active() const {
  avahi_threaded_poll_lock(impl_->poll);
  const bool a = !impl_->failed;
  avahi_threaded_poll_unlock(impl_->poll);
  return a;
}

std::unique_ptr<LanDiscovery> discover_on_lan(const std::shared_ptr<DhtRuntime>& dht,
                                              const transport::Host& host,
                                              const std::string& swarm) {
  const auto& a = host.address();
  const auto colon = a.rfind(':');
  LanDiscoveryOptions o;
  o.swarm = swarm;
  o.node_id_hex = transport::to_hex(host.id());
  o.port =
      colon == std::string::npos ? 0 : static_cast<std::uint16_t>(std::stoul(a.substr(colon + 1)));
  // Announcements repeat; a LAN peer is pinged once (then the DHT keeps track of it). The set is
  // touched on the host strand only.
  auto seen = std::make_shared<std::set<std::string>>();
  auto lan = LanDiscovery::start(host.executor(), o,
                                 [weak = std::weak_ptr<DhtRuntime>(dht), seen](LanPeer p) {
                                   auto rt = weak.lock();
                                   if (!rt || seen->size() > 4096 ||
                                       !seen->insert(p.address).second)
                                     return;
                                   spdlog::info("dht: found {} on the LAN at {}",
                                                p.id_hex.substr(0, 8), p.address);
                                   rt->add_contact(p.address);
                                 });
  if (!lan) return nullptr;
  return std::move(*lan);
}

}  // namespace grove::dht
