// grove-node: parses the command line, then runs a node (or a status / request client).
#include <malloc.h>

#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include <filesystem>
#include <string_view>

#include "node/cli.hpp"
#include "node/node.hpp"
#include "node/plot_command.hpp"
#include "node/status.hpp"
#include "node/status_client.hpp"
#include "node/swarm_key.hpp"
#include "node/top.hpp"
#include "node/workload.hpp"
#include "transport/error.hpp"

#ifndef GROVE_VERSION
#define GROVE_VERSION "0.1.0"
#endif

namespace {

using namespace grove;

// `status` and `request`: one request to the local node (address in the state dir) or --peer,
// over the same encrypted transport (an identity of its own; the swarm key when one is set).
int run_client(const node::CliOptions& o) {
  std::string why;
  const std::string target = node::client_target(o, why);
  if (target.empty()) {
    std::fprintf(stderr, "grove-node: %s\n", why.c_str());
    return 1;
  }
  node::StatusClient client(node::client_swarm_key(
      o, std::filesystem::path(o.state_dir.empty() ? node::default_state_dir() : o.state_dir)));
  if (o.command == node::Command::top) return node::run_top(client, target);
  if (o.command == node::Command::request) {
    std::string body = node::to_string(o.request_mode);
    if (o.from_round) body += " " + std::to_string(*o.from_round);
    auto res = client.call(target, "request_mode", body, std::chrono::seconds(15));
    if (!res) {
      std::fprintf(stderr, "grove-node: %s did not answer: %s\n", target.c_str(),
                   res.text().c_str());
      return 1;
    }
    std::printf("the swarm switches to %s from round %.*s\n", node::to_string(o.request_mode),
                static_cast<int>(res->size()), reinterpret_cast<const char*>(res->data()));
    return 0;
  }
  auto members = client.swarm_status(target, std::chrono::seconds(15));
  if (!members) {
    std::fprintf(stderr, "grove-node: no status from %s: %s\n", target.c_str(),
                 members.text().c_str());
    return 1;
  }
  std::fputs((o.json ? node::status_json(*members) : node::status_table(*members)).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace grove::node;
  // Model-sized buffers (θ, φ, snapshots, checkpoints, exchange tensors) come and go every round.
  // glibc raises its mmap threshold after the first such free (up to 32 MiB); from then on
  // buffers below that are carved from the heap and their pages stay resident after free. A
  // fixed threshold keeps every large buffer a mapping of its own, returned when freed (measured
  // peak RSS of a gpt-base node alone: 1.67 GB → 1.26 GB at 1 MiB). 256 KiB: a round's messages
  // (a chunk of 2^18 values is 512 KiB in fp16) and received streams are such buffers too, by
  // the thousand, freed on many threads' arenas.
  ::mallopt(M_MMAP_THRESHOLD, 256 << 10);
  if (argc > 1 && std::string_view(argv[1]) == "plot") return run_plot(argc - 2, argv + 2);
  CliOptions o;
  try {
    o = parse_cli(argc, argv);
  } catch (const CliError& e) {
    std::fprintf(stderr, "grove-node: %s\n(see grove-node --help)\n", e.what());
    return 2;
  }
  if (o.command == Command::help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  if (o.command == Command::version) {
    std::printf("grove-node %s\n", GROVE_VERSION);
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(o.log_level));
#ifdef GROVE_HAVE_GPT
  set_gpt_factory(&make_gpt_workload);
#endif
  try {
    if (o.command != Command::run) return run_client(o);
    Node node(o);
    return node.run();
  } catch (const grove::transport::ConfigError& e) {
    std::fprintf(stderr, "grove-node: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grove-node: unexpected error: %s\n", e.what());
    return 1;
  }
}
