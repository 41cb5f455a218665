// Which swarm key a node uses, and where it keeps it. A swarm is closed by default: `--bootstrap`
// creates a key in the state directory (unless `--open`) and prints a join command that carries
// it; a joiner given `--swarm-key HEX` or `--swarm-key-file FILE` keeps a copy there, so a
// restart on the same state directory rejoins with it. Without a key a node can join only an
// open swarm (one bootstrapped with --open), and a closed swarm's nodes refuse its handshake.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "node/cli.hpp"
#include "transport/crypto.hpp"

namespace grove::node {

struct SwarmKeyChoice {
  std::optional<transport::SwarmKey> key;  ///< none: an open swarm
  std::string how;                         ///< for the log: where it came from
};

/// The file in a state directory that holds the node's swarm key (0600).
std::filesystem::path swarm_key_path(const std::filesystem::path& state_dir);

/// The key a node of `o` uses, in this order: --swarm-key, --swarm-key-file (with --bootstrap a
/// missing file is created), the state directory's copy (unless --open), a new key for
/// --bootstrap (unless --open), none. A key given is kept in the state directory. Throws
/// ConfigError when a key cannot be read or kept.
SwarmKeyChoice choose_swarm_key(const CliOptions& o, const std::filesystem::path& state_dir);

/// For `status` and `request` (clients): --swarm-key, --swarm-key-file, else the state
/// directory's copy when there is one.
std::optional<transport::SwarmKey> client_swarm_key(const CliOptions& o,
                                                    const std::filesystem::path& state_dir);

}  // namespace grove::node
