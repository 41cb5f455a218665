#include "node/contacts.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <set>

#include <spdlog/spdlog.h>

#include "node/checkpoint.hpp"

namespace grove::node {

std::filesystem::path contacts_path(const std::filesystem::path& state_dir) {
  return state_dir / "contacts";
}

bool plausible_address(const std::string& a) {
  if (a.empty() || a.size() > 255) return false;
  for (const char c : a)
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return false;
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size()) return false;
  unsigned port = 0;
  const char* end = a.data() + a.size();
  const auto [p, ec] = std::from_chars(a.data() + colon + 1, end, port);
  return ec == std::errc() && p == end && port > 0 && port <= 65535;
}

std::vector<std::string> load_contacts(const std::filesystem::path& state_dir) {
  std::vector<std::string> out;
  std::ifstream f(contacts_path(state_dir), std::ios::binary);
  if (!f) return out;
  // Bounded: the file's first 16 KiB (32 lines of at most 256 bytes, twice over).
  std::string text(16 << 10, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(f.gcount()));
  std::set<std::string> seen;
  std::size_t skipped = 0;
  for (std::size_t at = 0; at < text.size() && out.size() < kMaxContacts;) {
    auto end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    if (!plausible_address(line))
      ++skipped;
    else if (seen.insert(line).second)
      out.push_back(line);
  }
  if (skipped)
    spdlog::warn("{}: skipped {} line(s) that are no HOST:PORT", contacts_path(state_dir).string(),
                 skipped);
  return out;
}

std::vector<std::string> merge_contacts(const std::vector<std::string>& newer,
                                        const std::vector<std::string>& older) {
  std::vector<std::string> out;
  std::set<std::string> kept;
  for (const auto* list : {&newer, &older})
    for (const auto& a : *list)
      if (out.size() < kMaxContacts && plausible_address(a) && kept.insert(a).second)
        out.push_back(a);
  return out;
}

bool save_contacts(const std::filesystem::path& state_dir,
                   const std::vector<std::string>& contacts) {
  std::string text;
  for (std::size_t i = 0; i < contacts.size() && i < kMaxContacts; ++i) text += contacts[i] + "\n";
  if (auto e = write_file_atomically(
          contacts_path(state_dir),
          {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()})) {
    spdlog::warn("could not save the swarm's contacts in {}: {}", contacts_path(state_dir).string(),
                 e.message());
    return false;
  }
  return true;
}

namespace {

// Whether a TCP socket can bind ip:port now (as the host's acceptor would: SO_REUSEADDR).
bool port_free(std::string ip, unsigned port) {
  if (ip.size() > 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
      ::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(sockaddr_in);
  } else if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
             ::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    return false;  // a name: let the host resolve it, with a port of its own choosing
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::string sticky_listen(const std::string& listen, const std::filesystem::path& state_dir) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || listen.substr(colon + 1) != "0") return listen;
  std::ifstream f(state_dir / "port");
  unsigned port = 0;
  if (!(f >> port) || port == 0 || port > 65535) return listen;
  const std::string host = listen.substr(0, colon);
  if (!port_free(host, port)) return listen;
  return host + ":" + std::to_string(port);
}

void remember_port(const std::filesystem::path& state_dir, const std::string& bound) {
  const auto colon = bound.rfind(':');
  if (colon == std::string::npos) return;
  const std::string text = bound.substr(colon + 1) + "\n";
  if (auto e = write_file_atomically(
          state_dir / "port", {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}))
    spdlog::warn("could not keep our port in {}: {}", (state_dir / "port").string(), e.message());
}

}  // namespace grove::node
