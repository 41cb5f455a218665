// `grove-node plot METRICS.jsonl... -o run.png`: runs the package's plotting script (a copy
// built into the binary: node/plot_script.hpp) with Debian's python3 and matplotlib.
#include "node/plot_command.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "node/plot_script.hpp"

namespace grove::node {

int run_plot(int argc, const char* const* argv) {
  const char* python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  std::vector<const char*> args = {python, "-c", kPlotScript};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp(python, const_cast<char* const*>(args.data()));
  std::fprintf(stderr, "grove-node: plot needs python3 (with python3-matplotlib): %s\n",
               std::strerror(errno));
  return 1;
}

}  // namespace grove::node
