#include "node/addresses.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace grove::node {

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

}  // namespace grove::node
