// Zero-config LAN discovery over mDNS/DNS-SD (Avahi): publishes this node as a `_grove._tcp`
// service and reports the other nodes of the same swarm that are announced on the local network.
//
// Threads: Avahi runs its own event loop thread (avahi_threaded_poll). Peers are delivered on the
// caller's executor (boost::asio::post), never on the Avahi thread, and never after the
// LanDiscovery has been destroyed.
//
// Errors (docs/ERRORS.md): a missing Avahi daemon / D-Bus is a routine condition, not an
// exception: start() returns errc::unreachable and logs one line. Invalid options (bad node id,
// empty or over-long swarm name, port 0 while publishing, invalid instance name) are
// configuration errors and throw transport::ConfigError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

#include "transport/error.hpp"

namespace grove::transport {
class Host;
}

namespace grove::dht {

/// DNS-SD service type every grove node publishes and browses.
inline constexpr std::string_view kLanServiceType = "_grove._tcp";
/// Longest swarm name accepted, in our options and in a peer's TXT record (bytes).
inline constexpr std::size_t kLanMaxSwarmLen = 64;
/// Length of a node id in hex (TXT `id=`): 32 bytes.
inline constexpr std::size_t kLanNodeIdHexLen = 64;
/// "Any interface" (the value of AVAHI_IF_UNSPEC).
inline constexpr int kLanAnyInterface = -1;

/// A node of our swarm seen on the LAN. Values come from the network: `id_hex` is validated
/// (exactly 64 hex digits, lower-cased) and `swarm` equals ours, but nothing is authenticated;
/// the transport handshake proves the identity when the caller dials `address`.
struct LanPeer {
  std::string address;  // "ip:port"; IPv6 as "[addr]:port" ("[fe80::1%eth0]:port" if link-local)
  std::string id_hex;   // 64 lower-case hex digits
  std::string swarm;
};

struct LanDiscoveryOptions {
  std::string swarm;          // our swarm name: 1..64 bytes, no NUL
  std::uint16_t port = 0;     // TCP port we accept on (must be non-zero when publishing)
  std::string node_id_hex;    // our node id: 64 hex digits (either case)
  std::string instance_name;  // DNS-SD instance name; empty: "grove-<first 8 hex of id>"
  int interface_index = kLanAnyInterface;  // restrict to one interface (if_nametoindex)
  bool publish = true;                     // announce ourselves
  bool browse = true;                      // look for peers
  std::size_t max_pending_resolves = 64;   // bound on concurrent resolutions of services seen
};

class LanDiscovery {
 public:
  /// Connects to the Avahi daemon over D-Bus, publishes and/or browses as asked, and starts the
  /// Avahi thread. `on_peer` runs on `ex` for every resolved service whose TXT swarm equals ours
  /// and whose id differs from ours; the same peer may be reported again (re-announcements, one
  /// report per interface and address family): the caller deduplicates.
  /// Returns errc::unreachable (after one log line) when no Avahi daemon is reachable.
  /// Throws transport::ConfigError for invalid options.
  static transport::Result<std::unique_ptr<LanDiscovery>> start(
      boost::asio::any_io_executor ex, LanDiscoveryOptions opts,
      std::function<void(LanPeer)> on_peer);

  /// Stops the Avahi thread, withdraws our service and frees the client. After it returns no
  /// `on_peer` call runs or starts (it waits for one that is running on another thread; it may be
  /// called from inside `on_peer`). Destroy it before the io_context behind `ex`.
  ~LanDiscovery();

  LanDiscovery(const LanDiscovery&) = delete;
  LanDiscovery& operator=(const LanDiscovery&) = delete;

  /// The instance name currently used (it changes after a name collision).
  std::string instance_name() const;
  /// True once our service is established on the network (publishing only).
  bool published() const;
  /// False after the connection to the Avahi daemon was lost (discovery has stopped).
  bool active() const;

 private:
  struct Impl;
  explicit LanDiscovery(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class DhtRuntime;

/// Zero-config discovery on the LAN for a node's DHT: announces `host` as `_grove._tcp` with the
/// swarm name and pings every node of the same swarm that shows up (each address once). Nullptr
/// (with one log line) when no Avahi daemon is reachable: the node carries on with its --peer
/// list. The caller keeps it until before the host's io_context stops.
std::unique_ptr<LanDiscovery> discover_on_lan(const std::shared_ptr<DhtRuntime>& dht,
                                              const transport::Host& host,
                                              const std::string& swarm);

}  // namespace grove::dht
