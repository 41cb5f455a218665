#include "node/cli.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string_view>
#include <utility>

#include "transport/crypto.hpp"
#include "transport/reach.hpp"

namespace grove::node {

namespace {

std::uint64_t parse_whole(const std::string& opt, const std::string& v, std::uint64_t lo,
                          std::uint64_t hi) {
  std::uint64_t x = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || x < lo || x > hi)
    throw CliError(opt + ": expected a whole number from " + std::to_string(lo) + " to " +
                   std::to_string(hi) + ", got '" + v + "'");
  return x;
}

float parse_number(const std::string& opt, const std::string& v, double lo, double hi) {
  float x = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || !std::isfinite(x) ||
      x < lo || x > hi) {
    char b[96];
    std::snprintf(b, sizeof b, "expected a number from %g to %g", lo, hi);
    throw CliError(opt + ": " + b + ", got '" + v + "'");
  }
  return x;
}

void check_host_port(const std::string& opt, const std::string& v) {
  const auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == v.size())
    throw CliError(opt + ": expected HOST:PORT, got '" + v + "'");
  parse_whole(opt + " (port)", v.substr(colon + 1), 0, 65535);
}

// Run config options: name → how to apply the value.
using Setter = std::function<void(RunConfig&, const std::string& opt, const std::string& v)>;
const std::map<std::string, Setter>& config_options() {
  static const std::map<std::string, Setter> m = {
      {"--workload",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         auto w = parse_workload(v);
         if (!w) throw CliError(o + ": expected gpt, mlp or external, got '" + v + "'");
         c.workload = *w;
       }},
      {"--model-size",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         if (v.empty() || v.size() > 32 ||
             v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
           throw CliError(o + ": expected a preset name such as tiny, small or base, got '" + v +
                          "'");
         c.model = v;
       }},
      {"--seed", [](RunConfig& c, const std::string& o,
                    const std::string& v) { c.seed = parse_whole(o, v, 0, UINT64_MAX); }},
      {"--inner-steps",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.inner_steps = static_cast<std::uint32_t>(parse_whole(o, v, 1, 1'000'000));
       }},
      {"--batch",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.batch = static_cast<std::uint32_t>(parse_whole(o, v, 1, 4096));
       }},
      {"--seq-len",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.seq_len = static_cast<std::uint32_t>(parse_whole(o, v, 2, 8192));
       }},
      {"--lr", [](RunConfig& c, const std::string& o,
                  const std::string& v) { c.lr = parse_number(o, v, 1e-9, 1); }},
      {"--warmup",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.warmup = static_cast<std::uint32_t>(parse_whole(o, v, 0, 1'000'000'000));
       }},
      {"--schedule-steps",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.schedule_steps = static_cast<std::uint32_t>(parse_whole(o, v, 1, 1'000'000'000));
       }},
      {"--weight-decay", [](RunConfig& c, const std::string& o,
                            const std::string& v) { c.weight_decay = parse_number(o, v, 0, 1); }},
      {"--clip", [](RunConfig& c, const std::string& o,
                    const std::string& v) { c.clip = parse_number(o, v, 0, 1e6); }},
      {"--outer",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         if (!c.set_outer(v))
           throw CliError(o + ": expected noloco, diloco, sparseloco, demo or none, got '" + v +
                          "'");
         // SparseLoCo's own outer step (Grove's defaults): lr 1.0, no momentum, unless given.
         if (c.sparseloco && c.outer_lr == RunConfig{}.outer_lr) c.outer_lr = 1.0f;
         if (c.sparseloco && c.outer_momentum == RunConfig{}.outer_momentum)
           c.outer_momentum = 0.0f;
       }},
      {"--topk",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.topk = static_cast<std::uint32_t>(parse_whole(o, v, 1, 65536));
       }},
      {"--topk-chunk",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         const auto n = parse_whole(o, v, 64, 65536);
         if ((n & (n - 1)) != 0) throw CliError(o + ": expected a power of two, got '" + v + "'");
         c.topk_chunk = static_cast<std::uint32_t>(n);
       }},
      {"--topk-bits",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         if (v != "32" && v != "2") throw CliError(o + ": expected 32 or 2, got '" + v + "'");
         c.topk_bits = v == "2" ? 2 : 32;
       }},
      {"--error-decay", [](RunConfig& c, const std::string& o,
                           const std::string& v) { c.error_decay = parse_number(o, v, 0, 1); }},
      {"--demo-decay", [](RunConfig& c, const std::string& o,
                          const std::string& v) { c.demo_decay = parse_number(o, v, 0, 0.999999); }},
      {"--demo-topk",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.demo_topk = static_cast<std::uint32_t>(parse_whole(o, v, 1, 65536));
       }},
      {"--demo-chunk",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.demo_chunk = static_cast<std::uint32_t>(parse_whole(o, v, 1, 256));
       }},
      {"--fragments",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.fragments = static_cast<std::uint32_t>(parse_whole(o, v, 1, 64));
       }},
      {"--outer-lr", [](RunConfig& c, const std::string& o,
                        const std::string& v) { c.outer_lr = parse_number(o, v, 1e-6, 10); }},
      {"--outer-momentum",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.outer_momentum = parse_number(o, v, 0, 0.999);
       }},
      {"--outer-warmup",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.outer_warmup = static_cast<std::uint32_t>(parse_whole(o, v, 0, 1'000'000));
       }},
      {"--noloco-alpha",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.noloco_alpha = parse_number(o, v, 0, 0.999);
       }},
      {"--noloco-variant",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         if (!set_noloco_variant(c, v))
           throw CliError(o + ": expected paper or grove, got '" + v + "'");
       }},
      {"--noloco-group",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.noloco_group = static_cast<std::uint32_t>(parse_whole(o, v, 2, 64));
       }},
      {"--noloco-lookahead",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.noloco_lookahead = parse_number(o, v, 0, 0.999);
       }},
      {"--noloco-rule",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         if (v != "paper" && v != "nesterov")
           throw CliError(o + ": expected paper or nesterov, got '" + v + "'");
         c.noloco_nesterov = v == "nesterov" ? 1 : 0;
       }},
      {"--noloco-warmup",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.noloco_warmup = static_cast<std::uint32_t>(parse_whole(o, v, 0, 1'000'000));
       }},
      {"--noloco-beta", [](RunConfig& c, const std::string& o,
                           const std::string& v) { c.noloco_beta = parse_number(o, v, 1e-6, 2); }},
      {"--noloco-gamma", [](RunConfig& c, const std::string& o,
                            const std::string& v) { c.noloco_gamma = parse_number(o, v, 0, 2); }},
      {"--codec",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         auto k = parse_codec(v);
         if (!k) throw CliError(o + ": expected fp16, bf16, fp32 or e3m0, got '" + v + "'");
         c.codec = *k;
       }},
      {"--window-ms",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.window_ms = static_cast<std::uint32_t>(parse_whole(o, v, 500, 600'000));
       }},
      {"--eval-every",
       [](RunConfig& c, const std::string& o, const std::string& v) {
         c.eval_every = static_cast<std::uint32_t>(parse_whole(o, v, 1, 1'000'000));
       }},
      {"--eval-batches",
       [](RunConfig& c, const std::string& o,
          const std::string&
              v) { c.eval_batches = static_cast<std::uint32_t>(parse_whole(o, v, 1, 10'000)); }},
  };
  return m;
}

}  // namespace

CliOptions::LinkEmulation parse_link_emulation(const std::string& opt, const std::string& v) {
  const auto bad = [&] {
    return CliError(opt +
                    ": expected RATE[,RTT[,LOSS]] such as 100mbit,100ms or 1gbit,20ms,0.01, "
                    "got '" +
                    v + "'");
  };
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const auto comma = v.find(',', at);
    parts.push_back(v.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (parts.size() > 3) throw bad();
  CliOptions::LinkEmulation e;
  const auto number = [&](std::string_view t, double& x) {
    const auto r = std::from_chars(t.data(), t.data() + t.size(), x);
    return !t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size() && std::isfinite(x) &&
           x >= 0;
  };
  {
    std::string_view r = parts[0];
    double scale = 0;
    for (const auto& [unit, bits] :
         {std::pair<std::string_view, double>{"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}})
      if (r.size() > unit.size() && r.substr(r.size() - unit.size()) == unit) {
        scale = bits;
        r.remove_suffix(unit.size());
      }
    double x = 0;
    if (r == "0") scale = 1;
    if (scale == 0 || !number(r, x) || x * scale > 1e12) throw bad();
    e.bytes_per_sec = x * scale / 8;
  }
  if (parts.size() > 1) {
    std::string_view t = parts[1];
    if (t.size() < 3 || t.substr(t.size() - 2) != "ms") throw bad();
    t.remove_suffix(2);
    double x = 0;
    if (!number(t, x) || x > 60'000) throw bad();
    e.rtt_ms = static_cast<std::uint32_t>(x);
  }
  if (parts.size() > 2 && (!number(parts[2], e.loss) || e.loss >= 1)) throw bad();
  return e;
}

std::string usage() {
  return R"(grove-node: peer-to-peer training without a coordinator

Usage:
  grove-node --bootstrap [options]     start a new swarm (creates the run), then train
  grove-node [--peer HOST:PORT]...     join a swarm (LAN discovery when no --peer), then train
  grove-node status [--json] [--peer HOST:PORT]
                                       the swarm's members: step, loss, throughput, last sync
                                       and partner, bytes, round times, status (from the local
                                       node, or from the member given with --peer)
  grove-node request diloco|noloco [--from-round R] [--peer HOST:PORT]
                                       ask the swarm to switch its outer mode from round R on
                                       (default: the earliest round every member can still meet)
  grove-node top [--peer HOST:PORT]    a live dashboard of the swarm (q quits, arrows select,
                                       s/S sort by the next/previous column, r reverses): every
                                       member's state, step, round, loss, tokens/s, last sync,
                                       bytes in and out per second, the swarm's loss and sync
                                       time; a plain table when the output is not a terminal
  grove-node plot METRICS.jsonl... [-o run.png]
                                       loss and eval loss against steps and time for every
                                       node, sync time and bytes per round, from --metrics
                                       files (python3 and Debian's python3-matplotlib)
  grove-node --help | --version

Node options (any node):
  --peer HOST:PORT        a member to join through (repeatable; default: the saved contacts
                          of the state dir, then a swarm on the LAN)
  --listen HOST:PORT      address to listen on (default 0.0.0.0:0, a free port; [::]:PORT
                          for IPv6 and IPv4)
  --advertise IP:PORT     an address other nodes can dial us at, e.g. a router's port
                          forward (repeatable; IPv4 or [IPv6]:PORT). A joining node has peers
                          dial its addresses back: without one that works it takes part
                          through the connections it opens, and through relays
  --no-relay              do not relay for nodes that accept no connections (a reachable
                          node relays for up to 16 pairs at 100 Mbit/s in all by default)
  --no-upnp               do not ask the home router (UPnP IGD) to forward a port to us
                          (asked by default unless --advertise is given; removed at exit)
  --state-dir DIR         identity key, checkpoints, local control address
                          (default $XDG_DATA_HOME/grove-node or ~/.local/share/grove-node)
  --trainer-socket PATH   where a training script attaches (--workload external runs; default
                          <state dir>/trainer.sock)
  --swarm-key HEX         the swarm's key (64 hex digits), as the bootstrap's join command gives
                          it; kept in the state dir, so a restart needs it no more
  --swarm-key-file FILE   the swarm's key from a file (with --bootstrap a missing file is created
                          with a new key). A swarm is closed by default: --bootstrap creates a key
                          in the state dir and prints a join command that carries it; a node
                          without the key can neither join nor read anything of the swarm
  --open                  with --bootstrap: a public swarm, no key (anyone who can reach a member
                          can join and average into the model); when joining: use no key
  --run NAME              the run to join when the swarm has several (default: its only one)
  --data FILE...          text files to train on (this node's own data; each node draws its own
                          random windows; default: the workload's synthetic corpus). Needs a
                          run bootstrapped with --data.
  --overlap               exchange in the background while the next inner steps run
                          (default off; at --bootstrap: the run's, every member overlaps)
  --max-steps N           stop after N inner steps on this node (default: no limit)
  --checkpoint-every N    write a checkpoint every N rounds (default: see below)
  --checkpoint-minutes M  write a checkpoint every M minutes (with --checkpoint-every: whichever
                          comes first); default: every round while the outer state (8 bytes a
                          parameter) is under 1 GB, else every 10 minutes. Under 1 GB the
                          previous checkpoint is kept too (checkpoint.prev); above, only the
                          newest, and the state is serialised (the snapshot served to joiners)
                          only at this cadence, not every round
  --metrics FILE          append one JSON object per event (JSON lines; default: none)
  --threads N             compute threads (default: all the machine's)
  --log-level LEVEL       trace, debug, info, warn, error or off (default info)
  --no-progress           no live progress line (default: one on a terminal)
  --emulate-link RATE[,RTT[,LOSS]]
                          testing: slow every link of this node in-process, e.g. 100mbit,100ms
                          (default: none)
                          (RATE in kbit, mbit or gbit per second; RTT added; LOSS of packets:
                          as over TCP, a frame with a lost packet arrives a retransmission
                          timeout late, 200 ms + RTT, and the frames behind it wait).
                          It shapes what this node sends (give it to every node to shape both
                          ways). Frames are serialised at RATE, then travel RTT/2; those not
                          serialised yet count in the sender's bounded send queue, so control
                          frames wait behind at most ~10 ms (or 256 KiB) of bulk data

Run config (only with --bootstrap; fixed for the run, joiners take it from the swarm):
  --workload gpt|mlp|external
                          byte-level GPT language model (default), a tiny MLP (for tests), or
                          the model of your own PyTorch training script (the grove package:
                          node/python; its first trainer fixes the model and the algorithm)
  --model-size NAME       size preset: gpt tiny|small|base (default small), mlp tiny|small
  --seed N                model initialisation, synthetic corpus, evaluation (default 1)
  --inner-steps H         inner AdamW steps per outer round (default 50)
  --batch N               sequences per inner step (default 16)
  --seq-len N             tokens per sequence (default 128)
  --lr X                  peak inner learning rate (default 0.001)
  --warmup N              linear warm-up steps (default 100)
  --schedule-steps N      cosine decay horizon in inner steps (default 20000)
  --weight-decay X        AdamW weight decay (default 0.1)
  --clip X                gradient-norm clip, 0 = off (default 1)
  --outer noloco|diloco|sparseloco|demo|none
                          outer optimiser (default noloco: random pairwise averaging; diloco:
                          group all-reduce of the pseudo-gradient; sparseloco: the group
                          all-gathers each member's top-k of an error buffer, ~30x fewer bytes;
                          demo: no rounds, every step the group all-gathers each member's top-k
                          DCT coefficients of its momentum and steps by their mean's sign
                          (built-in workloads); none: no rounds, the trainers' per-step
                          collectives only, with --workload external)
  --outer-lr X            DiLoCo Nesterov learning rate (default 0.7; SparseLoCo 1.0)
  --outer-momentum X      DiLoCo Nesterov momentum (default 0.9; SparseLoCo 0)
  --outer-warmup N        DiLoCo: over the first N rounds the outer step ramps from plain
                          averaging (lr 1, no momentum) to --outer-lr and --outer-momentum
                          (default 10; 0: from the first round, as the DiLoCo paper)
  --topk K                SparseLoCo: values sent per chunk (default 64)
  --topk-chunk N          SparseLoCo: chunk of the top-k, a power of two (default 4096)
  --topk-bits 32|2        SparseLoCo: bits per value sent (default 32; 2: a scale per chunk)
  --error-decay X         SparseLoCo: error buffer decay per round (default 0.95)
  --demo-decay X          DeMo: momentum decay per step (default 0.999; lr: --lr's schedule)
  --demo-topk K           DeMo: coefficients sent per block (default 32)
  --demo-chunk N          DeMo: a block side at most, 1 to 256 (default 64)
  --fragments F           1 to 64 dividing --inner-steps (default 1): a round every H/F steps
                          syncs 1/F of the model (DiLoCo/SparseLoCo: each in turn; NoLoCo: a
                          pair averages one drawn at random, the rest takes the local step)
  --noloco-alpha X        NoLoCo momentum (default 0.9)
  --noloco-beta X         NoLoCo step on the averaged pseudo-gradient (default 0.7)
  --noloco-gamma X        NoLoCo pull toward the partners' slow weights, paper rule only
                          (default 1; grove-node's rule averages whole)
  --noloco-variant paper|grove
                          NoLoCo's settings at once (rule, alpha, beta, gamma, group,
                          look-ahead, warm-up): the paper's (paper rule, pairs, 0.5, 0.7, 0.7,
                          none, 0) or grove-node's defaults (nesterov rule, pairs, 0.9, 0.7, 1,
                          none, 10); the options after it still change single settings
  --noloco-group N        NoLoCo group size, 2 to 64 (default 2: pairs)
  --noloco-lookahead X    NoLoCo: each inner phase starts from φ + X·m, where the momentum is
                          heading (default 0: from φ; for the paper rule: grove-node's is a
                          Nesterov step already, and overshoots with it)
  --noloco-rule paper|nesterov
                          NoLoCo's step (default nesterov): each member takes DiLoCo's
                          Nesterov step on its own pseudo-gradient and the group averages the
                          results and the momenta (two tensors travel); paper: the NoLoCo
                          paper's, the pull toward the group's slow weights through each
                          member's momentum (one tensor travels when beta = gamma)
  --noloco-warmup R       NoLoCo: over the first R rounds the step ramps from plain averaging
                          to alpha, beta and gamma (default 10)
  --codec fp16|bf16|fp32|e3m0
                          what goes on the wire (default fp16; e3m0 with diloco: the
                          all-reduce's partial sums in 4 bits, each member keeping what its
                          encodings left out for its next round: error feedback)
  --window-ms MS          matchmaking window: nodes ready in the same window pair up
                          (default 10000; shorter for short rounds on a LAN)
  --eval-every N          inner steps between evaluations (default 100)
  --eval-batches N        held-out batches per evaluation (default 8)

Exit status: 0 on a clean stop (Ctrl-C, SIGTERM, --max-steps), 2 for bad arguments,
1 for other errors.
)";
}

std::string default_state_dir() {
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/grove-node";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.local/share/grove-node";
  return "grove-state";
}

CliOptions parse_cli(int argc, const char* const* argv) {
  CliOptions o;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::size_t i = 0;
  if (i < args.size() && (args[i] == "status" || args[i] == "request" || args[i] == "top")) {
    o.command = args[i] == "status"    ? Command::status
                : args[i] == "request" ? Command::request
                                       : Command::top;
    ++i;
    if (o.command == Command::request) {
      if (i >= args.size()) throw CliError("request: expected diloco or noloco");
      auto k = parse_mode(args[i]);
      if (!k) throw CliError("request: expected diloco or noloco, got '" + args[i] + "'");
      o.request_mode = *k;
      ++i;
    }
  }
  const auto value = [&](const std::string& opt) -> std::string {
    if (i + 1 >= args.size() || (args[i + 1].size() > 1 && args[i + 1].rfind("--", 0) == 0))
      throw CliError(opt + ": missing value");
    return args[++i];
  };
  const bool running = o.command == Command::run;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto run_only = [&] {
      if (!running) throw CliError(a + " is not an option of this command");
    };
    if (a == "--help" || a == "-h") {
      o.command = Command::help;
      return o;
    } else if (a == "--version") {
      o.command = Command::version;
      return o;
    } else if (a == "--peer") {
      const auto v = value(a);
      check_host_port(a, v);
      o.peers.push_back(v);
    } else if (a == "--json" && o.command == Command::status) {
      o.json = true;
    } else if (a == "--from-round" && o.command == Command::request) {
      o.from_round = parse_whole(a, value(a), 0, UINT64_MAX / 2);
    } else if (a == "--state-dir") {
      o.state_dir = value(a);
    } else if (a == "--log-level") {
      o.log_level = value(a);
      static const char* levels[] = {"trace", "debug", "info", "warn", "error", "off"};
      if (std::find(std::begin(levels), std::end(levels), o.log_level) == std::end(levels))
        throw CliError(a + ": expected trace, debug, info, warn, error or off, got '" +
                       o.log_level + "'");
    } else if (a == "--swarm-key-file") {
      o.swarm_key_file = value(a);
    } else if (a == "--swarm-key") {
      o.swarm_key = value(a);
      try {
        (void)transport::SwarmKey::parse(*o.swarm_key);
      } catch (const std::exception& e) {
        throw CliError(a + ": " + e.what());
      }
    } else if (a == "--open") {
      run_only();
      o.open = true;
    } else if (a == "--bootstrap") {
      run_only();
      o.bootstrap = true;
    } else if (a == "--advertise") {
      run_only();
      const auto v = value(a);
      check_host_port(a, v);
      if (transport::ip_of(v).empty())
        throw CliError(a + ": expected IP:PORT or [IPv6]:PORT (an address, not a name), got '" + v +
                       "'");
      o.advertise.push_back(v);
    } else if (a == "--listen") {
      run_only();
      o.listen = value(a);
      check_host_port(a, o.listen);
    } else if (a == "--run") {
      run_only();
      o.run = value(a);
      if (!valid_run_name(*o.run))
        throw CliError(a + ": expected a run name such as gpt-0123456789ab, got '" + *o.run + "'");
    } else if (a == "--data") {
      run_only();
      o.data.push_back(value(a));
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) o.data.push_back(args[++i]);
    } else if (a == "--overlap") {
      run_only();
      o.overlap = true;
      o.config.overlap = 1;  // at --bootstrap: the run's
    } else if (a == "--max-steps") {
      run_only();
      o.max_steps = parse_whole(a, value(a), 1, UINT64_MAX / 2);
    } else if (a == "--checkpoint-every") {
      run_only();
      o.checkpoint_every = static_cast<std::uint32_t>(parse_whole(a, value(a), 1, 1'000'000));
    } else if (a == "--checkpoint-minutes") {
      run_only();
      o.checkpoint_minutes = static_cast<std::uint32_t>(parse_whole(a, value(a), 1, 10'000));
    } else if (a == "--metrics") {
      run_only();
      o.metrics = value(a);
    } else if (a == "--trainer-socket") {
      run_only();
      o.trainer_socket = value(a);
      if (o.trainer_socket.empty() || o.trainer_socket.size() > 100)
        throw CliError(a + ": a path of 1 to 100 bytes");
    } else if (a == "--threads") {
      run_only();
      o.threads = static_cast<unsigned>(parse_whole(a, value(a), 1, 1024));
    } else if (a == "--emulate-link") {
      run_only();
      o.emulate_link = parse_link_emulation(a, value(a));
    } else if (a == "--no-progress") {
      run_only();
      o.progress = false;
    } else if (a == "--no-relay") {
      run_only();
      o.relay = false;
    } else if (a == "--no-upnp") {
      run_only();
      o.upnp = false;
    } else if (auto it = config_options().find(a); it != config_options().end()) {
      run_only();
      it->second(o.config, a, value(a));
      o.set_keys.push_back(a);
    } else if (a.rfind("-", 0) == 0) {
      throw CliError("unknown option " + a);
    } else {
      throw CliError("unexpected argument '" + a + "'");
    }
  }
  if (running) {
    if (!o.set_keys.empty() && !o.bootstrap)
      throw CliError(o.set_keys.front() +
                     " is part of the run config: set it with --bootstrap (a joiner takes the "
                     "config from the swarm)");
    if (o.bootstrap && o.run) throw CliError("--run names a run to join; --bootstrap creates one");
    if (o.open && (o.swarm_key || o.swarm_key_file))
      throw CliError("--open is a swarm without a key: drop --swarm-key / --swarm-key-file");
    if (o.swarm_key && o.swarm_key_file)
      throw CliError("--swarm-key and --swarm-key-file both name the key: give one");
    if (o.bootstrap && !o.data.empty()) o.config.data = DataKind::files;
    if (o.config.warmup > o.config.schedule_steps)
      throw CliError("--warmup must not exceed --schedule-steps");
  }
  return o;
}

}  // namespace grove::node
