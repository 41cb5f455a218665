// Which of this machine's addresses a node names to its peers before they have checked any.
#pragma once

#include <string>
#include <vector>

namespace grove::node {

/// The address peers should dial: the listen address `bound`, unless it is a wildcard; then the
/// local address that routes to the first peer, or the first non-loopback IPv4 address, or
/// loopback.
std::string advertise_address(const std::string& bound, const std::vector<std::string>& peers);

/// The addresses a node without --advertise has checked: `advertise` and, when it listens on the
/// IPv6 wildcard (IPv6 and IPv4), its first address of the other family (a global IPv6 one, or a
/// non-loopback IPv4 one) with the same port: a helper checks one address of the other family
/// too, and nodes that have only that family can then dial us.
std::vector<std::string> local_candidates(const std::string& bound, const std::string& advertise);

}  // namespace grove::node
