#!/usr/bin/python3
"""Convergence of the default workload: N grove-node processes averaging with each outer
algorithm and wire form (NoLoCo; DiLoCo with fp32, fp16 or E3M0 messages; SparseLoCo with fp32 or
2-bit values; DiLoCo and SparseLoCo in --fragments streaming fragments; NoLoCo's compressed pairs,
which average 1/F of the model a round), and one node running
N x the steps, on loopback. Eval loss against compute (inner
steps summed over the nodes) and against bytes sent (summed over the nodes).

Bytes: per node and round, the bytes a node's averaging operation sent (round_bytes_sent, state
syncs left out), also per parameter; each against DiLoCo with fp32 on the wire (the reference,
--reference), with the final eval loss's gap to the reference's. The last line:
  convergence-bytes: <config> <bytes ratio>x <loss gap %> ...
With --seeds S1,S2,... every configuration runs once per seed (reports in --out/seed-<s>/), and a
last table and convergence_seeds.csv give each configuration's mean final eval loss over the
seeds with its range, and the gap to the reference seed by seed (the last line then carries the
means).

Every configuration is the same run config (seed, model, batch, inner steps, schedule, ...) except
--outer; the single node runs N x the steps of a swarm node, and every node's cosine schedule
spans its own steps (--schedule-steps = its --max-steps), so each run decays fully. The single
node is alone: a node that finds no partner keeps its inner phase's progress as it is (no outer
step), so it trains as one trainer alone would. `single` runs --single-factor x the steps
(default N), `single-1x` a swarm node's steps (equal compute per trainer).

NoLoCo's variants (noloco-paper: the paper's settings spelt out; noloco-lookahead,
noloco-group4, ...; --variant NAME=ARGS adds any other) are compared with DiLoCo: with diloco,
noloco-paper and noloco among the configurations the last line is
  convergence-noloco: N nodes, H h: diloco L, noloco-paper L (+x%), noloco-default L (+y%)
(each loss the mean over the seeds), after a table of every configuration's gap to DiLoCo and to
the single node at equal steps.

Writes to --out (default bench-out/):
  convergence.csv        one row per eval/round/stop event per node per configuration
  convergence_curve.csv  per configuration and eval step: mean/min/max eval loss over the nodes,
                         total inner steps and total bytes sent over the nodes
  convergence.png        two panels: eval loss vs total inner steps, vs total bytes sent
                         (needs matplotlib: apt-get install python3-matplotlib)
  convergence/<config>/  each node's stdout, stderr and metrics
and prints, per configuration, the final eval loss with its ratio to the single node's (and of
its gap to the loss floor), the rounds averaged/local-only, partners per round, state syncs and
how many different slow weights the nodes ended with (DiLoCo: 1 unless the swarm split), plus
the warnings and errors of the nodes' logs. --report-only rebuilds all of it from the metrics
of an earlier run.

Defaults fit a 2-core machine (about 3 + 3 + 6 minutes here): gpt tiny (0.12M parameters),
1000 steps per swarm node with 1 compute thread each (4 processes share the cores), 4000 on the
single node.
"""

import argparse
import csv
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nodebench as nb  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=nb.DEFAULT_BINARY, help="grove-node executable")
    ap.add_argument("--out", default="bench-out", help="output directory")
    ap.add_argument("--configs", default="noloco,diloco,single",
                    help="which configurations to run, comma-separated (" + ", ".join(CONFIGS) +
                    ")")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="one more configuration: NAME and its grove-node run options, e.g. "
                    "'noloco-la3=--outer noloco --noloco-lookahead 0.3' (repeatable)")
    ap.add_argument("--reference", default="diloco-fp32",
                    help="the configuration the bytes and losses are compared with")
    ap.add_argument("--nodes", type=int, default=4, help="swarm size")
    ap.add_argument("--steps", type=int, default=1000, help="inner steps per swarm node")
    ap.add_argument("--single-factor", type=int, default=0,
                    help="the single node runs this many x --steps (0: --nodes)")
    ap.add_argument("--single-outer", default="noloco", choices=["noloco", "diloco"],
                    help="outer optimiser of the lone node's local-only rounds")
    ap.add_argument("--model-size", default="tiny", help="gpt preset (tiny, small, base)")
    ap.add_argument("--workload", default="gpt",
                    help="gpt or mlp (built in), or lstm or transformer: PyTorch models on "
                    "Debian's fortunes corpus (apt-get install fortunes), each node with a "
                    "trainer (bench/lm_trainer.py) through the grove package")
    ap.add_argument("--inner-steps", type=int, default=50, help="H, inner steps per round")
    ap.add_argument("--fragments", type=int, default=5,
                    help="F of the *-fragments configurations (dividing --inner-steps)")
    ap.add_argument("--pair-fragments", type=int, default=0,
                    help="F of noloco-fragments (0: --fragments): its pairs average 1/F of the "
                    "model a round, so that one run can hold DiLoCo's streaming fragments and "
                    "NoLoCo's compressed pairs at their own F")
    ap.add_argument("--data", nargs="+", default=[],
                    help="text files for the built-in workloads (every node's --data; e.g. "
                    "/usr/share/games/fortunes/*), instead of the synthetic corpus")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", default="0.001")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", default="",
                    help="comma-separated seeds (overrides --seed): every configuration runs "
                    "once per seed, each seed's report goes to --out/seed-<s>/, and a last table "
                    "gives each configuration's mean over the seeds with its range")
    ap.add_argument("--window-ms", type=int, default=2000, help="matchmaking window")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="compute threads per node")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    ap.add_argument("--keep-state", action="store_true", help="keep the nodes' state dirs")
    ap.add_argument("--no-plot", action="store_true", help="CSV only")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: rebuild the CSVs, the PNG and the table from the metrics "
                    "the nodes of an earlier run left in --out/convergence/<config>/")
    return ap.parse_args()


# Each configuration's run-config options (the rest are the same for all).
CONFIGS = {
    "noloco": ["--outer", "noloco"],
    "diloco": ["--outer", "diloco"],
    "diloco-fp32": ["--outer", "diloco", "--codec", "fp32"],
    "diloco-e3m0": ["--outer", "diloco", "--codec", "e3m0"],
    "sparseloco": ["--outer", "sparseloco"],
    "sparseloco-2bit": ["--outer", "sparseloco", "--topk-bits", "2"],
    # SparseLoCo's messages with DiLoCo's Nesterov step (μ 0.9, lr 0.7) on their mean.
    "sparseloco-nesterov": ["--outer", "sparseloco", "--outer-lr", "0.7", "--outer-momentum",
                            "0.9"],
    # Streaming fragments (--fragments F of this script): a round every H/F steps syncs 1/F.
    "diloco-fragments": ["--outer", "diloco", "--fragments", "{F}"],
    "sparseloco-fragments": ["--outer", "sparseloco", "--fragments", "{F}"],
    # Compressed NoLoCo pairs: a round every H steps as NoLoCo's (inner steps H x F), in which a
    # pair averages 1/F of the model (drawn from its window) and the rest takes the local step.
    "noloco-fragments": ["--outer", "noloco", "--fragments", "{PF}", "--inner-steps", "{PHF}"],
    # NoLoCo with the paper's settings spelt out (its rule, pairs, alpha 0.5, beta = gamma =
    # 0.7, no warm-up, each phase from phi), whatever grove-node's defaults are.
    "noloco-paper": ["--outer", "noloco", "--noloco-rule", "paper", "--noloco-alpha", "0.5",
                     "--noloco-beta", "0.7", "--noloco-gamma", "0.7", "--noloco-group", "2",
                     "--noloco-lookahead", "0", "--noloco-warmup", "0"],
    # The paper's rule with a look-ahead, in groups of 4, or both.
    "noloco-lookahead": ["--outer", "noloco", "--noloco-variant", "paper",
                         "--noloco-lookahead", "0.5"],
    "noloco-group4": ["--outer", "noloco", "--noloco-variant", "paper", "--noloco-group", "4"],
    "noloco-lookahead-group4": ["--outer", "noloco", "--noloco-variant", "paper",
                                "--noloco-lookahead", "0.5", "--noloco-group", "4"],
    # grove-node's rule (the default) in groups of 4.
    "noloco-nesterov-group4": ["--outer", "noloco", "--noloco-group", "4"],
    # DiLoCo with the paper's settings spelt out (lr 0.7, Nesterov 0.9 from the first round).
    "diloco-paper": ["--outer", "diloco", "--outer-lr", "0.7", "--outer-momentum", "0.9",
                     "--outer-warmup", "0"],
    # DeMo every step (no rounds): the group all-gathers each member's top-32 DCT coefficients
    # of its momentum per 64 x 64 block and steps by the sign of their mean (lr: the schedule's).
    "demo": ["--outer", "demo"],
    "single": None,  # --single-outer, --single-factor x the steps
    "single-1x": None,  # the same, at a swarm node's steps
}


def outer_args(a, name):
    pf = a.pair_fragments or a.fragments
    subst = {"{F}": str(a.fragments), "{PF}": str(pf), "{PHF}": str(a.inner_steps * pf)}
    return [subst.get(x, x) for x in CONFIGS[name]]


# The run options of a configuration as keyword arguments of the grove package's noloco() and
# diloco() (an external workload's run is made by its first trainer's choice).
TRAINER_KWARGS = {"--noloco-alpha": "alpha", "--noloco-beta": "beta", "--noloco-gamma": "gamma",
                  "--noloco-group": "group", "--noloco-lookahead": "lookahead",
                  "--noloco-rule": "rule", "--noloco-warmup": "warmup",
                  "--outer-lr": "outer_lr", "--outer-momentum": "momentum",
                  "--outer-warmup": "warmup", "--codec": "codec", "--fragments": "fragments"}
EXTERNAL = ("lstm", "transformer")  # --workload: bench/lm_models.py through bench/lm_trainer.py


def trainer_args(outer, inner_steps):
    """(--outer, --inner-steps, --outer-args) of bench/lm_trainer.py for a configuration."""
    algo, kw, h, i = "noloco", [], inner_steps, 0
    while i < len(outer):
        k, v = outer[i], outer[i + 1]
        i += 2
        if k == "--outer":
            if v not in ("noloco", "diloco"):
                raise nb.BenchError(f"external workloads run noloco or diloco, not {v}")
            algo = v
        elif k == "--inner-steps":
            h = int(v)
        elif k == "--noloco-variant" and v == "paper":
            kw += ["rule=paper", "alpha=0.5", "beta=0.7", "gamma=0.7", "warmup=0"]
        elif k in TRAINER_KWARGS:
            kw.append(f"{TRAINER_KWARGS[k]}={v}")
        else:
            raise nb.BenchError(f"external workloads: no trainer argument for {k}")
    return ["--outer", algo, "--inner-steps", str(h), "--outer-args", ",".join(kw)]


def run_external(a, binary, name, outer, nodes, steps, logdir, sd):
    """An external workload: each node with a PyTorch trainer (bench/lm_trainer.py) attached;
    the trainers' JSON lines (their eval after every round and at the stop) go to logdir."""
    run_args = ["--workload", "external", "--window-ms", str(a.window_ms)]
    node_args = ["--max-steps", str(steps), "--threads", str(a.threads)]
    targs = trainer_args(outer, a.inner_steps)
    here = os.path.dirname(os.path.abspath(__file__))
    trainers = []

    def sock(nd):
        return os.path.join(nd.state_dir, "trainer.sock")

    def trainer(i, nd):  # (from this thread: a child dies with the thread that started it)
        argv = ["/usr/bin/python3", os.path.join(here, "lm_trainer.py"), "--socket", sock(nd),
                "--log", os.path.join(logdir, f"{nd.name}.trainer.jsonl"), "--model", a.workload,
                "--steps", str(steps), "--lr", a.lr, "--warmup", str(a.warmup),
                "--data-seed", str(a.seed * 100 + i), "--init-seed", str(1000 + a.seed)] + targs
        with open(os.path.join(logdir, f"{nd.name}.trainer.out"), "w") as out:
            trainers.append(nb.spawn(argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL))

    # A node opens its trainer socket once it has the run (a bootstrap node: at once, and it
    # says where it listens once its trainer has made the run; a joiner: once it has joined).
    boot = nb.Node(binary, "node0", ["--bootstrap"] + run_args + node_args, logdir, sd)
    nb.wait_until("node0's trainer socket", lambda: os.path.exists(sock(boot)), 120)
    trainer(0, boot)
    addr = boot.wait_listening(120)
    swarm = [boot]
    key = ["--swarm-key-file", os.path.join(boot.state_dir, "swarm.key")]
    for i in range(1, nodes):
        swarm.append(nb.Node(binary, f"node{i}", ["--peer", addr] + key + node_args, logdir, sd))
    waiting = dict(enumerate(swarm[1:], 1))
    end = time.monotonic() + a.timeout
    while waiting and time.monotonic() < end:
        for i, nd in list(waiting.items()):
            if os.path.exists(sock(nd)):
                trainer(i, nd)
            if os.path.exists(sock(nd)) or nd.proc.poll() is not None:
                del waiting[i]
        time.sleep(0.2)
    nb.wait_all(swarm, a.timeout)
    for t in trainers:
        t.wait(60)
    return swarm


def trainer_finals(swarm):
    """Each node's trainer's last eval (its `final` line), or None without trainer logs."""
    out = []
    for nd in swarm:
        path = os.path.join(os.path.dirname(nd.metrics_path), f"{nd.name}.trainer.jsonl")
        lines = nb.read_metrics(path)
        if not lines:
            return None
        out.append(lines[-1]["eval_loss"])
    return out


def run_config(a, binary, name, outer, nodes, steps, logroot):
    logdir = nb.fresh_dir(os.path.join(logroot, name))
    sd = nb.statedir(a.keep_state)
    if a.workload in EXTERNAL:
        print(f"[{name}] {nodes} node(s) x {steps} steps, {a.workload} trainers, "
              f"{' '.join(outer)}; logs in {logdir}", flush=True)
        t0 = time.monotonic()
        swarm = run_external(a, binary, name, outer, nodes, steps, logdir, sd)
        print(f"[{name}] done in {time.monotonic() - t0:.0f} s", flush=True)
        return swarm
    inner = [] if "--inner-steps" in outer else ["--inner-steps", str(a.inner_steps)]
    run_args = ["--workload", a.workload, "--model-size", a.model_size, "--seed", str(a.seed)] + inner + [
                "--batch", str(a.batch),
                "--seq-len", str(a.seq_len), "--lr", a.lr, "--warmup", str(a.warmup),
                "--schedule-steps", str(steps)] + outer + [
                "--window-ms", str(a.window_ms), "--eval-every", str(a.eval_every),
                "--eval-batches", str(a.eval_batches)]
    node_args = ["--max-steps", str(steps), "--threads", str(a.threads)] + (
        ["--data"] + a.data if a.data else [])
    print(f"[{name}] {nodes} node(s) x {steps} steps, {' '.join(outer)}; logs in {logdir}",
          flush=True)
    t0 = time.monotonic()
    swarm = nb.start_swarm(binary, nodes, run_args, node_args, logdir, sd)
    nb.wait_all(swarm, a.timeout)
    print(f"[{name}] done in {time.monotonic() - t0:.0f} s", flush=True)
    return swarm


def event_rows(name, swarm):
    """CSV rows: every eval/round/stop event of every node, with the swarm's totals (steps and
    bytes sent summed over the nodes, each at its latest event) at that moment."""
    evs = []
    for i, nd in enumerate(swarm):
        for e in nd.events():
            if e["event"] in ("eval", "round", "synced", "stop", "start"):
                evs.append((e["time"], i, e))
    evs.sort(key=lambda x: (x[0], x[1]))
    t_start = evs[0][0] if evs else 0
    last_step = [0] * len(swarm)
    last_bytes = [0] * len(swarm)
    rows = []
    for t, i, e in evs:
        last_step[i] = e["step"]
        last_bytes[i] = e["bytes_sent"]
        if e["event"] == "start":
            continue
        rows.append({
            "config": name, "node": i, "node_id": e["node"], "event": e["event"],
            "time_s": round(t - t_start, 3), "step": e["step"], "round": e["round"],
            "eval_loss": e.get("eval_loss"), "loss_floor": e.get("loss_floor"),
            "train_loss": e.get("loss"),
            "bytes_sent": e["bytes_sent"], "bytes_received": e["bytes_received"],
            "partners": len(e.get("partners", [])) if e["event"] == "round" else "",
            "local_only": e.get("local_only", ""), "param_hash": e.get("param_hash", ""),
            "swarm_steps": sum(last_step), "swarm_bytes_sent": sum(last_bytes)})
    return rows


def curve(name, swarm):
    """Per eval step s (every node evaluates at the same steps): mean/min/max eval loss over the
    nodes that reached s, compute = sum over them of s, bytes = sum of their bytes sent then."""
    by_step = {}
    for nd in swarm:
        for e in nd.events("eval"):
            by_step.setdefault(e["step"], []).append(e)
    out = []
    for s in sorted(by_step):
        es = by_step[s]
        losses = [e["eval_loss"] for e in es if e["eval_loss"] is not None]
        if not losses:
            continue
        out.append({"config": name, "step_per_node": s, "nodes": len(es),
                    "total_steps": s * len(es),
                    "total_bytes_sent": sum(e["bytes_sent"] for e in es),
                    "eval_loss_mean": sum(losses) / len(losses),
                    "eval_loss_min": min(losses), "eval_loss_max": max(losses),
                    "loss_floor": es[0].get("loss_floor")})
    return out


def write_csv(path, rows):
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


LABELS = {"noloco": "{n} nodes NoLoCo", "diloco": "{n} nodes DiLoCo",
          "diloco-fp32": "{n} nodes DiLoCo fp32", "diloco-e3m0": "{n} nodes DiLoCo E3M0",
          "sparseloco": "{n} nodes SparseLoCo", "sparseloco-2bit": "{n} nodes SparseLoCo 2-bit",
          "sparseloco-nesterov": "{n} nodes SparseLoCo + Nesterov",
          "diloco-fragments": "{n} nodes DiLoCo, {F} fragments",
          "sparseloco-fragments": "{n} nodes SparseLoCo, {F} fragments",
          "noloco-fragments": "{n} nodes NoLoCo, pairs average 1/{PF}",
          "noloco-paper": "{n} nodes NoLoCo (paper)",
          "noloco-lookahead": "{n} nodes NoLoCo, look-ahead 0.5",
          "noloco-group4": "{n} nodes NoLoCo, groups of 4",
          "noloco-lookahead-group4": "{n} nodes NoLoCo, look-ahead 0.5, groups of 4",
          "noloco-nesterov-group4": "{n} nodes NoLoCo (grove's rule), groups of 4",
          "diloco-paper": "{n} nodes DiLoCo (paper)",
          "demo": "{n} nodes DeMo (every step)",
          "single": "1 node, {f}x steps", "single-1x": "1 node, 1x steps"}
COLORS = {"noloco": "tab:blue", "diloco": "tab:orange", "single": "tab:green",
          "diloco-fp32": "tab:red", "diloco-e3m0": "tab:purple", "sparseloco": "tab:brown",
          "sparseloco-2bit": "tab:pink", "sparseloco-nesterov": "tab:olive",
          "diloco-fragments": "tab:cyan", "sparseloco-fragments": "tab:gray",
          "noloco-fragments": "tab:olive", "single-1x": "tab:gray", "noloco-paper": "tab:purple",
          "demo": "tab:red"}
SPARE_COLORS = ["black", "gold", "teal", "navy", "maroon", "lime", "coral", "orchid"]


def color_of(name):
    """The configuration's colour: its own, else one of the spare ones (by name, stable)."""
    if name not in COLORS:
        COLORS[name] = SPARE_COLORS[sum(map(ord, name)) % len(SPARE_COLORS)]
    return COLORS[name]


def plot(path, curves, finals, floor, title, labels, unit="byte"):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter, ScalarFormatter
    except ImportError:
        print("matplotlib is not installed: no PNG written (the CSVs are complete). Install it "
              "with `apt-get install python3-matplotlib` and run again.")
        return False
    if floor is not None and floor != floor:  # NaN: no known floor (the external workloads)
        floor = None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, pts in curves.items():
        if not pts:
            continue
        label = labels[name]
        x = [p["total_steps"] for p in pts]
        y = [p["eval_loss_mean"] for p in pts]
        ax1.plot(x, y, color=color_of(name), label=label)
        if not name.startswith("single"):
            ax1.fill_between(x, [p["eval_loss_min"] for p in pts],
                             [p["eval_loss_max"] for p in pts], color=color_of(name), alpha=0.2)
            xb = [p["total_bytes_sent"] / 1e6 for p in pts]
            ax2.plot(xb, y, color=color_of(name), label=label)
            ax2.fill_between(xb, [p["eval_loss_min"] for p in pts],
                             [p["eval_loss_max"] for p in pts], color=color_of(name), alpha=0.2)
        elif name in finals:
            ax2.axhline(finals[name], color=color_of(name), linestyle=":",
                        label=label + ": final (0 bytes)")
    for ax in (ax1, ax2):
        if floor is not None:
            ax.axhline(floor, color="gray", linestyle="--", label="loss floor (source entropy)")
        if floor is not None:  # the built-in workloads: the loss falls towards a known floor
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_yticks([t for t in (0.6, 0.8, 1, 1.5, 2, 3, 4, 5, 6) if t >= floor * 0.75])
        ax.set_ylabel("eval loss (nats/%s; mean over nodes, band min-max)" % unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_xlabel("compute: inner steps summed over the nodes")
    ax2.set_xlabel("bytes sent, summed over the nodes (MB)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")
    return True


def summarise(name, swarm):
    """Final figures of one configuration, from its nodes' metrics."""
    stops = [nd.stop_event() for nd in swarm]
    if any(st is None for st in stops):
        raise nb.BenchError(f"[{name}] a node wrote no stop event")
    finals = trainer_finals(swarm) or [st["eval_loss"] for st in stops]
    rounds = [e for nd in swarm for e in nd.events("round")]
    starts = [e["time"] for nd in swarm for e in nd.events("start")]
    # The slow weights each node ended with (DiLoCo: one value when the swarm stayed together).
    # φ's hash at the last round every node ended (nodes stopped one round apart hold different
    # rounds' φ, which says nothing about a split).
    by_round = []
    for nd in swarm:
        rs = [e for e in nd.events() if e["event"] in ("round", "synced")]
        if rs:
            by_round.append({e["round"]: e["param_hash"] for e in rs})
    common = min((max(h) for h in by_round), default=None)
    last_hash = {h.get(common, h[max(h)]) for h in by_round}
    # What each node's averaging sent a round (state syncs left out), and the model's size.
    per_round = [e.get("round_bytes_sent", 0) for e in rounds if e.get("partners")]
    params = next((e.get("params") for nd in swarm for e in nd.events("start")), None)
    return {
        "round_bytes": sum(per_round) / len(per_round) if per_round else float("nan"),
        "params": params,
        "nodes": len(swarm), "steps": sum(st["step"] for st in stops),
        "steps_per_node": max(st["step"] for st in stops),
        "bytes": sum(st["bytes_sent"] for st in stops),
        "final_mean": sum(finals) / len(finals), "final_min": min(finals),
        "final_max": max(finals),
        "floor": stops[0]["loss_floor"] if stops[0]["loss_floor"] is not None else float("nan"),
        "averaged": sum(st["rounds_averaged"] for st in stops),
        "local": sum(st["rounds_local"] for st in stops),
        "syncs": sum(st["syncs"] for st in stops),
        "partners": sum(len(e.get("partners", [])) for e in rounds) / max(len(rounds), 1),
        "phis": len(last_hash),
        "wall": max(st["time"] for st in stops) - min(starts) if starts else float("nan")}


def main():
    a = parse_args()
    for v in a.variant:
        name, eq, args = v.partition("=")
        if not eq or not name or not args.split():
            raise nb.BenchError(f"--variant: expected NAME=ARGS, got {v!r}")
        CONFIGS[name] = args.split()
        LABELS[name] = "{n} nodes " + name
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            raise nb.BenchError(f"--configs: unknown configuration {c!r}")
    if not a.seeds:
        run_seed(a, configs)
        return 0
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        raise nb.BenchError(f"--seeds: expected comma-separated integers, got {a.seeds!r}")
    if not seeds:
        raise nb.BenchError("--seeds: no seed given")
    per_seed = []
    for s in seeds:
        b = argparse.Namespace(**vars(a))
        b.seed, b.out = s, os.path.join(a.out, f"seed-{s}")
        print(f"=== seed {s} (report in {b.out}) ===", flush=True)
        per_seed.append(run_seed(b, configs))
    report_seeds(a, seeds, per_seed)
    return 0


def noloco_report(a, finals, n):
    """finals: {config: mean final eval loss}. Prints each configuration's gap to DiLoCo and to
    one node alone at the same steps, and returns the convergence-noloco line (or None)."""
    dl = finals.get("diloco")
    one = finals.get("single-1x")
    if dl is None and one is None:
        return None
    print()
    print("Final eval loss against DiLoCo and against one node alone at a swarm node's steps:")
    out = []
    for c, v in finals.items():
        out.append([c, f"{v:.4f}", f"{100 * (v / dl - 1):+.2f}%" if dl else "-",
                    f"{100 * (v / one - 1):+.2f}%" if one else "-"])
    print(nb.table(out, ["config", "final eval", "vs diloco", "vs single-1x"]))
    if dl is None or "noloco-paper" not in finals or "noloco" not in finals:
        return None
    p, d = finals["noloco-paper"], finals["noloco"]
    return (f"convergence-noloco: {n} nodes, H {a.inner_steps}: diloco {dl:.4f}, noloco-paper "
            f"{p:.4f} ({100 * (p / dl - 1):+.1f}%), noloco-default {d:.4f} "
            f"({100 * (d / dl - 1):+.1f}%)")


def report_seeds(a, seeds, per_seed):
    """Each configuration over the seeds: the mean final eval loss and its range, the mean bytes
    a node sent a round, and their ratios and gaps to the reference (each seed's gap to its own
    reference run, then the mean and range of those)."""
    summs = [s for s, _ in per_seed]
    labels = per_seed[-1][1]
    configs = [c for c in summs[0] if all(c in s for s in summs)]
    print()
    print(f"Over {len(seeds)} seeds ({', '.join(map(str, seeds))}): final eval loss, mean "
          f"[min, max]; bytes a node's averaging sent a round, mean; against {a.reference}")
    hdr = ["config", "final eval mean [min, max]", "bytes/node/round", "bytes/param/round",
           "ratio to reference", "gap to reference mean [min, max]"]
    out, last, rows = [], [], []
    have_ref = all(a.reference in s for s in summs)
    for c in configs:
        finals = [s[c]["final_mean"] for s in summs]
        rb = [s[c]["round_bytes"] if not c.startswith("single") else float("nan")
              for s in summs]
        mean_rb = sum(rb) / len(rb)
        params = summs[0][c]["params"]
        per_param = f"{mean_rb / params:.4f}" if params and mean_rb == mean_rb else "-"
        ratio = gap = "-"
        if have_ref and mean_rb == mean_rb and mean_rb > 0:
            ref_rb = sum(s[a.reference]["round_bytes"] for s in summs) / len(summs)
            ratio = f"{ref_rb / mean_rb:.1f}x"
        if have_ref:
            gaps = [100.0 * (s[c]["final_mean"] / s[a.reference]["final_mean"] - 1.0)
                    for s in summs]
            g = sum(gaps) / len(gaps)
            gap = f"{g:+.2f}% [{min(gaps):+.2f}, {max(gaps):+.2f}]"
            if c != a.reference and ratio != "-":
                last.append(f"{c} {ratio} {g:+.2f}%")
        out.append([labels[c], f"{sum(finals) / len(finals):.4f} [{min(finals):.4f}, "
                    f"{max(finals):.4f}]", f"{mean_rb:.0f}", per_param, ratio, gap])
        for seed, s in zip(seeds, summs):
            rows.append({"config": c, "seed": seed, "final_eval": s[c]["final_mean"],
                         "round_bytes": s[c]["round_bytes"],
                         "reference_final_eval": s[a.reference]["final_mean"] if have_ref else ""})
    print(nb.table(out, hdr))
    write_csv(os.path.join(a.out, "convergence_seeds.csv"), rows)
    print(f"wrote {os.path.join(a.out, 'convergence_seeds.csv')}")
    if all("noloco" in s and "noloco-fragments" in s for s in summs):
        gaps = [100.0 * (s["noloco-fragments"]["final_mean"] / s["noloco"]["final_mean"] - 1.0)
                for s in summs]
        per_param = [s["noloco-fragments"]["round_bytes"] / s["noloco-fragments"]["params"]
                     for s in summs]
        print(f"compressed NoLoCo against NoLoCo over the seeds: "
              f"{sum(per_param) / len(per_param):.3f} bytes a parameter a round, final eval "
              f"{sum(gaps) / len(gaps):+.2f}% [{min(gaps):+.2f}, {max(gaps):+.2f}]")
    if last:
        print("convergence-bytes: " + " ".join(last))
    means = {c: sum(s[c]["final_mean"] for s in summs) / len(summs) for c in configs}
    line = noloco_report(a, means, summs[0][configs[0]]["nodes"] if configs else a.nodes)
    if line:
        print(line)


def run_seed(a, configs):
    """Runs (or with --report-only reads) every configuration for a.seed into a.out, prints its
    tables and returns ({config: summary}, {config: label})."""
    logroot = os.path.join(a.out, "convergence")
    swarms = {}
    if a.report_only:
        for c in configs:
            d = os.path.join(logroot, c)
            if os.path.isdir(d) and nb.load_nodes(d):
                swarms[c] = nb.load_nodes(d)
        if not swarms:
            raise nb.BenchError(f"no metrics under {logroot}/<config>/: run without --report-only")
    else:
        binary = nb.check_binary(a.binary)
        factor = a.single_factor or a.nodes
        os.makedirs(a.out, exist_ok=True)
        for c in configs:
            if c in ("single", "single-1x"):
                swarms[c] = run_config(a, binary, c, ["--outer", a.single_outer], 1,
                                       a.steps * (factor if c == "single" else 1), logroot)
            else:
                swarms[c] = run_config(a, binary, c, outer_args(a, c), a.nodes, a.steps,
                                       logroot)
    rows, curves, summ = [], {}, {}
    for c, swarm in swarms.items():
        rows += event_rows(c, swarm)
        curves[c] = curve(c, swarm)
        summ[c] = summarise(c, swarm)
        nb.print_log_digest(swarm, f"[{c}]")
    write_csv(os.path.join(a.out, "convergence.csv"), rows)
    write_csv(os.path.join(a.out, "convergence_curve.csv"), [p for c in curves.values() for p in c])
    print(f"wrote {os.path.join(a.out, 'convergence.csv')} ({len(rows)} rows) and "
          f"{os.path.join(a.out, 'convergence_curve.csv')}")

    # Sizes as run (with --report-only they come from the metrics, not from the options).
    swarm_cfg = next((summ[c] for c in summ if not c.startswith("single")), None)
    n = swarm_cfg["nodes"] if swarm_cfg else a.nodes
    steps = swarm_cfg["steps_per_node"] if swarm_cfg else a.steps
    factor = summ["single"]["steps"] // max(steps, 1) if "single" in summ else n
    labels = {c: LABELS[c].format(n=n, f=factor, F=a.fragments,
                                  PF=a.pair_fragments or a.fragments) for c in summ}
    floor = next(iter(summ.values()))["floor"]
    if not a.no_plot:
        model = "" if a.workload in EXTERNAL else " " + a.model_size
        alone = " and ".join(f"1 node x {f * steps} steps" for c, f in
                             (("single", factor), ("single-1x", 1)) if c in summ) or "no single node"
        shape = "" if a.workload in EXTERNAL else f", batch {a.batch}x{a.seq_len}"
        title = (f"{a.workload}{model}: {n} nodes x {steps} steps vs {alone} "
                 f"(H={a.inner_steps}{shape})")
        plot(os.path.join(a.out, "convergence.png"), curves,
             {c: s["final_mean"] for c, s in summ.items()}, floor, title, labels,
             unit="token" if a.workload in EXTERNAL else "byte")

    base = summ.get("single")
    print()
    print(f"Final eval loss (after each node's last round; floor {floor:.4f}; "
          f"ratios vs the single node, same total inner steps)")
    hdr = ["config", "nodes", "total steps", "MB sent", "rounds avg/local", "partners/round",
           "syncs", "final phi", "final eval mean [min, max]", "gap to floor", "loss ratio",
           "gap ratio", "wall s"]
    out = []
    for c, s in summ.items():
        gap = s["final_mean"] - s["floor"]
        lr = gr = "-"
        if base:
            lr = f"{s['final_mean'] / base['final_mean']:.3f}"
            bg = base["final_mean"] - base["floor"]
            gr = f"{gap / bg:.2f}" if bg > 0 else "-"
        out.append([labels[c], str(s["nodes"]), str(s["steps"]), f"{nb.mb(s['bytes']):.1f}",
                    f"{s['averaged']}/{s['local']}", f"{s['partners']:.2f}", str(s["syncs"]),
                    f"{s['phis']} distinct",
                    f"{s['final_mean']:.4f} [{s['final_min']:.4f}, {s['final_max']:.4f}]",
                    f"{gap:.4f}", lr, gr, f"{s['wall']:.0f}"])
    print(nb.table(out, hdr))
    if base and "single" in curves:
        at = [p for p in curves["single"] if p["step_per_node"] == steps]
        if at:
            print(f"(the single node at step {steps}, a swarm node's steps, with its longer "
                  f"schedule: eval {at[0]['eval_loss_mean']:.4f})")
    for c, s in summ.items():
        if c.startswith(("diloco", "sparseloco")) and s["phis"] > 1:
            print(f"note: the {labels[c]} nodes ended with {s['phis']} different slow weights "
                  "(param_hash at the last round all ended): the swarm split or diverged")
    line = noloco_report(a, {c: s["final_mean"] for c, s in summ.items()}, n)
    ref = summ.get(a.reference)
    if ref is None:
        if line:
            print(line)
        return summ, labels
    print()
    print(f"Bytes a node's averaging sent per round, against {labels[a.reference]} (the "
          f"reference); final eval loss against the reference's ({ref['final_mean']:.4f})")
    hdr = ["config", "bytes/node/round", "bytes/param/round", "ratio to reference",
           "final eval", "gap to reference"]
    out, last = [], []
    for c, s in summ.items():
        if c.startswith("single"):
            continue
        ratio = ref["round_bytes"] / s["round_bytes"] if s["round_bytes"] else float("nan")
        gap = 100.0 * (s["final_mean"] / ref["final_mean"] - 1.0)
        per_param = s["round_bytes"] / s["params"] if s["params"] else float("nan")
        out.append([labels[c], f"{s['round_bytes']:.0f}", f"{per_param:.4f}", f"{ratio:.1f}x",
                    f"{s['final_mean']:.4f}", f"{gap:+.2f}%"])
        if c != a.reference:
            last.append(f"{c} {ratio:.1f}x {gap:+.2f}%")
    print(nb.table(out, hdr))
    pairs = summ.get("noloco")
    if pairs and "noloco-fragments" in summ and pairs["round_bytes"]:
        s = summ["noloco-fragments"]
        print(f"compressed NoLoCo against NoLoCo: {pairs['round_bytes'] / s['round_bytes']:.1f}x "
              f"fewer bytes a round ({s['round_bytes'] / s['params']:.3f} bytes a parameter), "
              f"final eval {100.0 * (s['final_mean'] / pairs['final_mean'] - 1.0):+.2f}%")
    print("convergence-bytes: " + " ".join(last))
    if line:
        print(line)
    return summ, labels


if __name__ == "__main__":
    sys.exit(nb.main_guard(main))
