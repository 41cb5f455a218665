// What a node keeps in its state directory so that its swarm and it find each other again after a
// restart: the addresses of the swarm's members it last saw (at most kMaxContacts, the newest
// first), through which a node restarted without --peer rejoins, and the port it listened on,
// which a restart takes again (the others' contacts and DHT tables name it). The file ("contacts",
// one HOST:PORT a line) is rewritten atomically while the node trains; what is read back is bounded
// and checked (a line that is no address is skipped), since the file may be cut or edited.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace grove::node {

inline constexpr std::size_t kMaxContacts = 32;

std::filesystem::path contacts_path(const std::filesystem::path& state_dir);

/// The saved contacts (none when there is no file); lines that are no HOST:PORT are skipped with
/// a warning.
std::vector<std::string> load_contacts(const std::filesystem::path& state_dir);

/// `newer` (newest first), then those of `older` not in it, up to kMaxContacts; duplicates and
/// non-addresses dropped.
std::vector<std::string> merge_contacts(const std::vector<std::string>& newer,
                                        const std::vector<std::string>& older);

/// Writes `contacts` (at most kMaxContacts of them) atomically; false (and a warning) when the
/// file cannot be written.
bool save_contacts(const std::filesystem::path& state_dir,
                   const std::vector<std::string>& contacts);

/// `listen` (HOST:PORT) with, when its port is 0, the port of the node's previous run when that
/// port is free now (else `listen` as it is).
std::string sticky_listen(const std::string& listen, const std::filesystem::path& state_dir);
/// Keeps the port of `bound` (the address the node listens on) for the next start.
void remember_port(const std::filesystem::path& state_dir, const std::string& bound);

/// Whether `a` looks like an address to dial (HOST:PORT or [IPv6]:PORT, at most 255 bytes, no
/// spaces or control characters).
bool plausible_address(const std::string& a);

}  // namespace grove::node
