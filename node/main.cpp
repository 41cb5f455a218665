// grove-node: parses the command line, then runs a node (or a status / request client).
#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include "node/cli.hpp"
#include "node/node.hpp"
#include "node/workload.hpp"
#include "transport/error.hpp"

#ifndef GROVE_VERSION
#define GROVE_VERSION "0.1.0"
#endif

int main(int argc, char** argv) {
  using namespace grove::node;
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
    if (o.command != Command::run) {
      std::fprintf(stderr, "grove-node: '%s' is not available in this build yet\n",
                   o.command == Command::status ? "status" : "request");
      return 1;
    }
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
