#include "node/contacts.hpp"

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

}  // namespace grove::node
