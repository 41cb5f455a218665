// `grove-node plot`: plots of a run from --metrics files (node/python/grove/plot.py).
#pragma once

namespace grove::node {

/// Replaces this process with python3 running the plotting script on the arguments after
/// `plot` (`argv[0..argc)`); returns only when python3 cannot be started (exit status 1).
int run_plot(int argc, const char* const* argv);

}  // namespace grove::node
