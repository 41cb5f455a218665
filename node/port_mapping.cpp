#include "node/port_mapping.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <random>

#include <miniupnpc/miniupnpc.h>
#include <miniupnpc/upnpcommands.h>
#include <miniupnpc/upnperrors.h>
#include <spdlog/spdlog.h>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>

namespace grove::node {

bool is_non_public_ipv4(const std::string& ip) {
  boost::system::error_code ec;
  const auto a = boost::asio::ip::make_address_v4(ip, ec);
  if (ec) return true;
  const std::uint32_t v = a.to_uint();
  struct Net {
    std::uint32_t base;
    int bits;
  };
  // RFC 6890's special-purpose ranges that are not globally reachable, and multicast/reserved.
  static constexpr std::array<Net, 14> kNets{{{0x00000000, 8},
                                              {0x0A000000, 8},
                                              {0x64400000, 10},
                                              {0x7F000000, 8},
                                              {0xA9FE0000, 16},
                                              {0xAC100000, 12},
                                              {0xC0000000, 24},
                                              {0xC0000200, 24},
                                              {0xC0A80000, 16},
                                              {0xC6120000, 15},
                                              {0xC6336400, 24},
                                              {0xCB007100, 24},
                                              {0xE0000000, 4},
                                              {0xF0000000, 4}}};
  for (const auto& n : kNets)
    if ((v >> (32 - n.bits)) == (n.base >> (32 - n.bits))) return true;
  return false;
}

// The mapper's thread: every libminiupnpc call blocks (SSDP discovery for `discover`, then
// HTTP/SOAP requests to the gateway), so none of them runs on the node's event loop.
struct PortMapper::Impl {
  boost::asio::any_io_executor ex;
  PortMappingOptions o;
  OnChange on_change;
  std::mutex m;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;

  // The gateway and our mapping on it (thread only).
  bool have_igd = false;
  UPNPUrls urls{};
  IGDdatas data{};
  std::string lan_ip, external;  // external = "ip:port" while mapped
  std::string ext_port;
  std::string lease;  // seconds as the router took them ("0": a permanent mapping)

  ~Impl() {
    if (have_igd) FreeUPNPUrls(&urls);
  }

  void report(std::string ext) {
    boost::asio::post(ex, [cb = on_change, ext = std::move(ext)] { cb(ext); });
  }

  // Finds a connected gateway; false (with the reason logged once per `retry`) when none.
  bool find_gateway() {
    int err = 0;
    UPNPDev* devs = upnpDiscover(static_cast<int>(o.discover.count()), nullptr, nullptr,
                                 UPNP_LOCAL_PORT_ANY, 0, 2, &err);
    if (!devs) {
      spdlog::info("upnp: no gateway answered on the LAN within {} ms; no port mapping",
                   o.discover.count());
      return false;
    }
    std::array<char, 64> lan{};
#if MINIUPNPC_API_VERSION >= 18
    std::array<char, 64> wan{};
    const int r = UPNP_GetValidIGD(devs, &urls, &data, lan.data(), static_cast<int>(lan.size()),
                                   wan.data(), static_cast<int>(wan.size()));
#else
    const int r = UPNP_GetValidIGD(devs, &urls, &data, lan.data(), static_cast<int>(lan.size()));
#endif
    freeUPNPDevlist(devs);
    if (r != 1) {
      if (r > 0) FreeUPNPUrls(&urls);
      spdlog::info("upnp: no connected Internet gateway on the LAN (answer {}); no port mapping",
                   r);
      return false;
    }
    have_igd = true;
    lan_ip = lan.data();
    return true;
  }

  void forget_gateway() {
    if (have_igd) FreeUPNPUrls(&urls);
    have_igd = false;
    urls = {};
    data = {};
  }

  // Asks the router to forward external `port` to our port for `lease` seconds ("0": until
  // removed); the same request renews a mapping.
  int add_mapping(const std::string& port) const {
    const std::string in_port = std::to_string(o.port);
    return UPNP_AddPortMapping(urls.controlURL, data.first.servicetype, port.c_str(),
                               in_port.c_str(), lan_ip.c_str(), o.description.c_str(), "TCP",
                               nullptr, lease.c_str());
  }

  // Maps our port (the same number outside when free, else up to three random ones). The
  // result is "ip:port" or "".
  std::string map_port() {
    std::array<char, 40> ext_ip{};
    int r = UPNP_GetExternalIPAddress(urls.controlURL, data.first.servicetype, ext_ip.data());
    if (r != UPNPCOMMAND_SUCCESS || ext_ip[0] == '\0') {
      spdlog::info("upnp: the router did not tell its external address ({})", strupnperror(r));
      return {};
    }
    const std::string ip = ext_ip.data();
    if (is_non_public_ipv4(ip)) {
      spdlog::info(
          "upnp: the router's external address {} is not public (another NAT behind it): a "
          "mapping would not make us reachable",
          ip);
      return {};
    }
    std::mt19937 rng(std::random_device{}());
    lease = std::to_string(o.lease.count());
    for (int attempt = 0; attempt < 4; ++attempt) {
      const std::string port =
          attempt == 0 ? std::to_string(o.port)
                       : std::to_string(std::uniform_int_distribution<int>(20000, 60000)(rng));
      r = add_mapping(port);
      if (r == 725 && lease != "0") {  // OnlyPermanentLeasesSupported: removed at exit
        lease = "0";
        --attempt;
        continue;
      }
      if (r == UPNPCOMMAND_SUCCESS) {
        ext_port = port;
        return ip + ":" + port;
      }
      if (r != 718) break;  // 718: ConflictInMappingEntry (the port is taken): try another
    }
    spdlog::info("upnp: the router refused to map port {} ({})", o.port, strupnperror(r));
    return {};
  }

  void unmap() {
    if (external.empty() || !have_igd) return;
    const int r = UPNP_DeletePortMapping(urls.controlURL, data.first.servicetype, ext_port.c_str(),
                                         "TCP", nullptr);
    if (r == UPNPCOMMAND_SUCCESS)
      spdlog::info("upnp: removed the mapping {} -> {}:{}", external, lan_ip, o.port);
    else
      spdlog::warn("upnp: could not remove the mapping {} ({}); it lapses with its lease", external,
                   strupnperror(r));
    external.clear();
  }

  // Waits `d` or until stopped; true when stopped.
  bool wait(std::chrono::steady_clock::duration d) {
    std::unique_lock lk(m);
    return cv.wait_for(lk, d, [&] { return stop; });
  }

  void run() {
    while (true) {
      std::chrono::steady_clock::duration next = o.retry;
      if (external.empty()) {
        if (have_igd || find_gateway()) {
          external = map_port();
          if (!external.empty()) {
            spdlog::info("upnp: the router maps {} to us at {}:{} (lease {} s)", external, lan_ip,
                         o.port, o.lease.count());
            report(external);
            next = o.lease / 2;
          } else {
            forget_gateway();
          }
        }
      } else {
        // Renew: adding the same mapping again (with the lease the router took) extends it.
        const int r = add_mapping(ext_port);
        if (r == UPNPCOMMAND_SUCCESS) {
          next = o.lease / 2;
        } else {
          spdlog::warn("upnp: renewing the mapping {} failed ({}); looking for a gateway again",
                       external, strupnperror(r));
          external.clear();
          forget_gateway();
          report({});
          next = std::chrono::seconds(30);
        }
      }
      if (wait(next)) break;
    }
    unmap();
  }
};

std::unique_ptr<PortMapper> PortMapper::start(boost::asio::any_io_executor ex, PortMappingOptions o,
                                              OnChange on_change) {
  auto impl = std::make_unique<Impl>();
  impl->ex = std::move(ex);
  impl->o = std::move(o);
  impl->on_change = std::move(on_change);
  impl->thread = std::thread([p = impl.get()] { p->run(); });
  return std::unique_ptr<PortMapper>(new PortMapper(std::move(impl)));
}

PortMapper::PortMapper(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PortMapper::~PortMapper() {
  {
    std::lock_guard lk(impl_->m);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

}  // namespace grove::node
