// grove-sim: the scale experiments (sim/experiments.hpp) from one command line:
//   grove-sim EXPERIMENT [--out DIR] [--name value ...]
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "sim/experiments.hpp"

namespace {

struct Experiment {
  const char* name;
  const char* what;
  const char* options;
  std::function<int(const grove::sim::Args&, const std::string&)> run;
};

const Experiment kExperiments[] = {
    {"sync-time",
     "one averaging step's time against N: NoLoCo pairs, DiLoCo ring, SparseLoCo and E3M0 "
     "all-gathers, tree (model)",
     "--nodes 16,32,...,4096 --rtt-ms 50 --gbit 1 --loss 0.01 --params 1e8 --ring-max 4096 "
     "--gather-max 256 --seed 1",
     grove::sim::run_sync_time},
    {"dht-churn", "DHT lookup success and latency with a share of the nodes replaced every period",
     "--nodes 1000 --records 100 --minutes 60 --period-min 10 --replace 0.2 --every-s 2 "
     "--rtt-ms 0 (0: world model) --loss 0.01 --seed 1",
     grove::sim::run_dht_churn},
    {"spread", "NoLoCo vs DiLoCo in a simulated swarm: loss and replica spread against N and H",
     "--nodes 8,16,32,64,128 --inner-steps 10,50,200 --steps 2000 --workload quadratic|mlp "
     "--noloco-variant grove|paper "
     "--step-ms 100 --rtt-ms 0 (0: world model) --loss 0 --seed 1",
     grove::sim::run_spread},
    {"churn", "training while a share of the nodes leaves or crashes and as many join",
     "--nodes 32 --inner-steps 50 --share 0.3 --minutes 30 --outer noloco|diloco|sparseloco|e3m0 "
     "--fragments 1 --noloco-variant grove|paper --noloco-group 2 --noloco-lookahead 0 "
     "--workload quadratic|mlp --step-ms 100 --rtt-ms 0 (0: world model) --loss 0 --seed 1",
     grove::sim::run_churn},
    {"scale", "the whole swarm at growing N: join time, control-plane bytes, views, rounds",
     "--nodes 16,64,256,1024 --inner-steps 50 --join-minutes 2 --minutes 5 "
     "--outer noloco|diloco|sparseloco|e3m0 --fragments 1 --noloco-variant grove|paper "
     "--noloco-group 2 --noloco-lookahead 0 "
     "--workload quadratic|mlp --step-ms 100 --rtt-ms 0 (0: world model) --loss 0 --seed 1",
     grove::sim::run_scale},
    {"size", "a swarm at model size over slow lines: join vs its bound, rounds, deadlines fired",
     "--params 1e9,8e9 --mbit 20,100 --outer noloco|diloco --inner-min 10 --rtt-ms 50 --seed 77 "
     "--overlap 0|1",
     grove::sim::run_size},
    {"noloco-sweep",
     "gossip settings (group size, gamma, beta, alpha, partners, look-ahead) vs DiLoCo",
     "--replicas 16 --steps 3000 --inner-steps 50 --seeds 3 --workload mlp|quadratic",
     grove::sim::run_noloco_sweep},
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: grove-sim EXPERIMENT [--out DIR] [--option value ...]\n"
               "Runs a deterministic simulation of a grove swarm (the real dht, gossip and optim\n"
               "cores in virtual time) and writes DIR/<experiment>.csv and, when /usr/bin/python3\n"
               "has matplotlib, a PNG beside it. DIR defaults to sim-out.\n\nexperiments:\n");
  for (const auto& e : kExperiments)
    std::fprintf(f, "  %-13s %s\n  %-13s options: %s\n", e.name, e.what, "", e.options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const Experiment* ex = nullptr;
  for (const auto& e : kExperiments)
    if (argv[1] == std::string(e.name)) ex = &e;
  if (!ex) {
    std::fprintf(stderr, "grove-sim: unknown experiment '%s' (see grove-sim --help)\n", argv[1]);
    return 2;
  }
  std::map<std::string, std::string> kv;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || k.size() < 3 || i + 1 >= argc) {
      std::fprintf(stderr, "grove-sim: expected --name value, got '%s'\n", argv[i]);
      return 2;
    }
    kv[k.substr(2)] = argv[++i];
  }
  // Every option must be one the experiment knows: a typo must not run a default silently.
  for (const auto& [k, v] : kv)
    if (k != "out" && !std::strstr(ex->options, ("--" + k + " ").c_str())) {
      std::fprintf(stderr, "grove-sim %s: unknown option --%s (options: %s)\n", ex->name, k.c_str(),
                   ex->options);
      return 2;
    }
  try {
    grove::sim::Args args(kv);
    return ex->run(args, args.str("out", "sim-out"));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "grove-sim %s: %s\n", ex->name, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grove-sim %s: %s\n", ex->name, e.what());
    return 1;
  }
}
