// Where simulated nodes are and what their links can do: regions with a round-trip-time matrix,
// and access kinds (a cloud machine, a lab, a home line) with their up and down rates. Each node
// is placed in a region and an access kind drawn by their shares from the simulator's seed. The
// one-way latency between two nodes is half their regions' RTT; a message leaves at the sender's
// uplink rate and arrives no faster than the receiver's downlink takes it.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dht/record.hpp"

namespace grove::sim {

struct Region {
  std::string name;
  double share = 1;  ///< relative weight when nodes are placed
};

struct Access {
  std::string name;
  double share = 1;
  double up_mbit = 1000, down_mbit = 1000;
  double last_mile_ms = 0;  ///< one-way latency the access line adds (home lines: a few ms)
};

struct NetModel {
  std::vector<Region> regions;
  std::vector<std::vector<double>> rtt_ms;  ///< regions × regions, symmetric
  std::vector<Access> access;
  double jitter_ms = 0;  ///< uniform ± on every message's one-way latency
  double loss = 0;       ///< packet loss (DHT datagrams are dropped; TCP flows slow down)

  /// Every pair at `rtt_ms`, every node with `mbit` up and down.
  static NetModel uniform(double rtt_ms, double mbit, double loss = 0);
  /// Four regions (US east, US west, Europe, East Asia) with RTTs of public inter-region
  /// measurements, and a mix of cloud (1 Gbit/s), lab (500 Mbit/s) and home (200 down / 20 up)
  /// machines.
  static NetModel world();

  struct Placement {
    std::size_t region = 0, access = 0;
  };
  Placement place(std::mt19937_64& rng) const;
  dht::Time one_way(const Placement& a, const Placement& b) const;
  /// Mbit/s → bytes per millisecond.
  static double bytes_per_ms(double mbit) { return mbit * 1e6 / 8 / 1000; }
};

}  // namespace grove::sim
