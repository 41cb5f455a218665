#include "node/swarm_key.hpp"

#include <spdlog/spdlog.h>

#include "node/checkpoint.hpp"
#include "transport/error.hpp"

namespace grove::node {

using transport::ConfigError;

namespace {

void keep(const transport::SwarmKey& key, const std::filesystem::path& file) {
  const std::string text = key.hex() + "\n";
  if (auto e = write_file_atomically(
          file, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}))
    throw ConfigError("cannot write the swarm key file '" + file.string() + "': " + e.message());
}

}  // namespace

std::filesystem::path swarm_key_path(const std::filesystem::path& state_dir) {
  return state_dir / "swarm.key";
}

SwarmKeyChoice choose_swarm_key(const CliOptions& o, const std::filesystem::path& state_dir) {
  const auto own = swarm_key_path(state_dir);
  SwarmKeyChoice c;
  if (o.swarm_key) {
    c.key = transport::SwarmKey::parse(*o.swarm_key);
    c.how = "given with --swarm-key";
  } else if (o.swarm_key_file) {
    std::error_code ec;
    if (o.bootstrap && !std::filesystem::exists(*o.swarm_key_file, ec)) {
      keep(transport::SwarmKey::generate(), *o.swarm_key_file);
      c.how = "new, written to " + *o.swarm_key_file;
    } else {
      c.how = "from " + *o.swarm_key_file;
    }
    c.key = transport::SwarmKey::load(*o.swarm_key_file);
  } else if (o.open) {
    c.how = "none (--open)";
    return c;
  } else if (std::error_code ec; std::filesystem::exists(own, ec)) {
    c.key = transport::SwarmKey::load(own);
    c.how = "from " + own.string();
    return c;
  } else if (o.bootstrap) {
    c.key = transport::SwarmKey::generate();
    keep(*c.key, own);
    c.how = "new, kept in " + own.string();
    return c;
  } else {
    c.how = "none";
    return c;
  }
  // A key given: the state directory keeps it for a restart without the option.
  std::error_code ec;
  if (!o.swarm_key_file || !std::filesystem::equivalent(*o.swarm_key_file, own, ec))
    keep(*c.key, own);
  return c;
}

std::optional<transport::SwarmKey> client_swarm_key(const CliOptions& o,
                                                    const std::filesystem::path& state_dir) {
  if (o.swarm_key) return transport::SwarmKey::parse(*o.swarm_key);
  if (o.swarm_key_file) return transport::SwarmKey::load(*o.swarm_key_file);
  if (std::error_code ec; std::filesystem::exists(swarm_key_path(state_dir), ec))
    return transport::SwarmKey::load(swarm_key_path(state_dir));
  return std::nullopt;
}

}  // namespace grove::node
