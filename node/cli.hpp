// The grove-node command line: parsing and help. Pure (no I/O besides what main prints), so every
// rule is unit-tested. Bad input throws CliError with a message meant for the user; main prints
// it with a pointer to --help and exits 2.
//
//   grove-node --bootstrap [run config options] [node options]   start a swarm and train
//   grove-node [--peer HOST:PORT ...] [node options]             join (LAN discovery without
//   --peer) grove-node status [--json] [--peer HOST:PORT]                the swarm's members
//   grove-node request diloco|noloco [--from-round R] [--peer HOST:PORT]
//   grove-node top [--peer HOST:PORT]                             a live dashboard of the swarm
//
// Run config options (workload, sizes, hyperparameters, outer mode, codec) are fixed at
// --bootstrap: a joiner takes them from the swarm and is refused if it sets them.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "node/config.hpp"

namespace grove::node {

class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Command { run, status, request, top, help, version };

struct CliOptions {
  Command command = Command::run;
  // run
  bool bootstrap = false;
  RunConfig config;                   ///< --bootstrap: the run config (defaults + options)
  std::vector<std::string> set_keys;  ///< run config options given (for the joiner's refusal)
  std::vector<std::string> peers;     ///< HOST:PORT, in the order given
  std::string listen = "0.0.0.0:0";
  /// --advertise IP:PORT (repeatable, IPv4 or [IPv6]): the addresses to advertise and have
  /// checked, instead of the listen address (or the local address that routes to the peers).
  std::vector<std::string> advertise;
  bool relay = true;      ///< relay for nodes that accept no connections (--no-relay: false)
  bool upnp = true;       ///< ask the home router for a port mapping (--no-upnp: false)
  std::string state_dir;  ///< empty: default_state_dir()
  std::optional<std::string> swarm_key_file;
  std::optional<std::string> swarm_key;  ///< --swarm-key HEX (the bootstrap's join command)
  bool open = false;                     ///< --open: no swarm key (a public swarm)
  std::optional<std::string> run;        ///< join this run (when the swarm has several)
  bool overlap = false;
  std::vector<std::string> data;
  std::optional<std::uint64_t> max_steps;
  /// --checkpoint-every N: a checkpoint every N rounds; --checkpoint-minutes M: every M minutes.
  /// Neither: every round for a state under 1 GB, else every 10 minutes.
  std::optional<std::uint32_t> checkpoint_every;
  std::optional<std::uint32_t> checkpoint_minutes;
  std::optional<std::string> metrics;
  /// --trainer-socket PATH: where a trainer attaches (an external workload); default
  /// <state dir>/trainer.sock.
  std::string trainer_socket;
  unsigned threads = 0;  ///< 0: all hardware threads
  std::string log_level = "info";
  bool progress = true;  ///< live progress line on a terminal
  /// --emulate-link RATE[,RTT[,LOSS]]: every link of this node is slowed in-process (testing and
  /// benchmarks on one machine; this kernel has no netem).
  struct LinkEmulation {
    double bytes_per_sec = 0;  ///< 0 = unlimited
    std::uint32_t rtt_ms = 0;  ///< half is added to every frame this node sends
    double loss = 0;  ///< packet loss of the path: a frame with a lost packet is an RTO late
  };
  std::optional<LinkEmulation> emulate_link;
  // status / request
  bool json = false;
  OuterMode request_mode = OuterMode::diloco;
  std::optional<std::uint64_t> from_round;
};

/// Parses argv (argv[0] is the program). Throws CliError.
CliOptions parse_cli(int argc, const char* const* argv);
/// "100mbit,100ms", "1gbit", "500kbit,40ms,0.01": the rate (kbit, mbit or gbit per second; 0 =
/// unlimited), the round-trip time it adds, the loss. Throws CliError.
CliOptions::LinkEmulation parse_link_emulation(const std::string& opt, const std::string& v);
/// The complete --help text.
std::string usage();
/// $XDG_DATA_HOME/grove-node, else $HOME/.local/share/grove-node, else ./grove-state.
std::string default_state_dir();

}  // namespace grove::node
