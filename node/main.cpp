// grove-node: parses the command line, then runs a node (or a status / request client).
#include <malloc.h>

#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <thread>

#include "node/cli.hpp"
#include "node/node.hpp"
#include "node/status.hpp"
#include "node/swarm_key.hpp"
#include "node/workload.hpp"
#include "transport/error.hpp"
#include "transport/host.hpp"
#include "transport/identity.hpp"
#include "transport/strand.hpp"

#ifndef GROVE_VERSION
#define GROVE_VERSION "0.1.0"
#endif

namespace {

using namespace grove;

// `status` and `request`: one request to the local node (address in the state dir) or --peer,
// over the same encrypted transport (an ephemeral identity; the swarm key when one is set).
int run_client(const node::CliOptions& o) {
  std::string target;
  if (!o.peers.empty()) {
    target = o.peers.front();
  } else {
    const auto dir = o.state_dir.empty() ? node::default_state_dir() : o.state_dir;
    std::ifstream f(std::filesystem::path(dir) / "node.addr");
    if (!(f >> target)) {
      std::fprintf(stderr,
                   "grove-node: no local node found in %s (start one, or name a member with "
                   "--peer HOST:PORT)\n",
                   dir.c_str());
      return 1;
    }
  }
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread t([&] { io.run(); });
  transport::HostOptions ho;
  ho.listen = "";
  ho.swarm_key = node::client_swarm_key(
      o, std::filesystem::path(o.state_dir.empty() ? node::default_state_dir() : o.state_dir));
  auto host = transport::Host::create(io, transport::Identity::generate(), ho);
  std::string method = "swarm_status", body;
  if (o.command == node::Command::request) {
    method = "request_mode";
    body = node::to_string(o.request_mode);
    if (o.from_round) body += " " + std::to_string(*o.from_round);
  }
  transport::Rendezvous<transport::Result<transport::Payload>> answer;
  host->request(
      transport::PeerRef::at(target), method,
      transport::Bytes::copy_of({reinterpret_cast<const std::uint8_t*>(body.data()), body.size()}),
      transport::Duration(15000), answer.callback());
  // (The request's own deadline answers within 15 s.)
  auto res = answer.wait_for(std::chrono::seconds(20))
                 .value_or(transport::make_error_code(transport::errc::timed_out));
  int rc = 0;
  if (!res) {
    std::fprintf(stderr, "grove-node: %s did not answer: %s\n", target.c_str(),
                 res.error().message().c_str());
    rc = 1;
  } else if (o.command == node::Command::request) {
    const auto b = res->bytes();
    std::printf("the swarm switches to %s from round %.*s\n", node::to_string(o.request_mode),
                static_cast<int>(b.size()), reinterpret_cast<const char*>(b.data()));
  } else {
    auto members = node::decode_status(res->bytes());
    if (!members) {
      std::fprintf(stderr, "grove-node: bad status answer from %s: %s\n", target.c_str(),
                   members.why().c_str());
      rc = 1;
    } else {
      std::fputs((o.json ? node::status_json(*members) : node::status_table(*members)).c_str(),
                 stdout);
    }
  }
  host->shutdown();
  transport::quiesce_worker_pool();
  work.reset();
  io.stop();
  t.join();
  return rc;
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
