// UPnP IGD port mapping: on a home network the router may forward a port to us when asked
// (UPnP Internet Gateway Device, via Debian's libminiupnpc). The mapper runs on its own thread
// (the library's calls block): it looks for a gateway on the LAN, maps our listening port (the
// same external port when free, else another), renews the mapping at half its lease, and removes
// it when destroyed. What it finds is only a candidate address: the node's reachability check
// (transport/reach.hpp) decides whether others can really dial it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio/any_io_executor.hpp>

namespace grove::node {

struct PortMappingOptions {
  std::uint16_t port = 0;  ///< our listening port (the internal port)
  std::chrono::seconds lease{3600};
  std::chrono::milliseconds discover{2000};  ///< how long to wait for gateways to answer
  std::chrono::seconds retry{600};           ///< after no gateway, or a failed mapping
  std::string description = "grove-node";
};

/// True for an IPv4 address that is not routable on the Internet (private, shared, loopback,
/// link-local, documentation, benchmarking, multicast, reserved): a gateway reporting one as its
/// external address sits behind another NAT, and a mapping on it would not make us reachable.
bool is_non_public_ipv4(const std::string& ip);

class PortMapper {
 public:
  /// "ip:port" when the router maps a port to us, "" when a mapping we had is lost. Posted to the
  /// executor given to start().
  using OnChange = std::function<void(std::string external)>;
  static std::unique_ptr<PortMapper> start(boost::asio::any_io_executor ex, PortMappingOptions o,
                                           OnChange on_change);
  /// Removes the mapping (one request to the router, a few seconds at most) and stops.
  ~PortMapper();
  PortMapper(const PortMapper&) = delete;
  PortMapper& operator=(const PortMapper&) = delete;

  struct Impl;

 private:
  explicit PortMapper(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace grove::node
