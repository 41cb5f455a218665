#!/usr/bin/python3
"""Compute utilization of grove-node (time in inner steps / wall time, evaluation excluded) with
and without --overlap, every node's links emulating 100 Mbit/s and 100 ms RTT (--emulate-link).

Runs the same swarm twice on loopback (a fresh run each time): without --overlap, then with it.
Prints, per node, the utilization of its stop event (compute_s / (wall_s - eval_s)) and where
the rest of the wall time went, estimated from its round events:
  steady     utilization between its first and its last-but-one round event (start-up and the
             last round excluded)
  per-round  mean time per round outside the inner steps, evaluation and (without overlap)
             the round itself (its sync time): applying the result, the checkpoint, the
             submission; with overlap also any wait for the previous round
  sync       mean time from submitting a round to its result (window wait + exchange + outer step)
  late       rounds (the last excluded) whose sync took longer than an inner phase: with overlap
             the node waited for them before submitting the next round
  last round the final round's sync time: with overlap nothing is left to train meanwhile
  leave      from the last round's result to the stop event, evaluation excluded
then the ratio with/without overlap. Target: >= 0.98 with overlap.

Defaults (gpt small, 3.26M parameters, 6.5 MB of fp16 per round each way; 10 inner steps of
~0.7 s on one thread, 2 s matchmaking windows) make a round's communication a third or more of
an inner phase without overlap. Logs and metrics go to --out/utilization/<mode>/.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nodebench as nb  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=nb.DEFAULT_BINARY, help="grove-node executable")
    ap.add_argument("--out", default="bench-out", help="output directory")
    ap.add_argument("--modes", default="off,on", help="overlap off and/or on, in this order")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200, help="inner steps per node")
    ap.add_argument("--inner-steps", type=int, default=10, help="H, inner steps per round")
    ap.add_argument("--window-ms", type=int, default=2000, help="matchmaking window")
    ap.add_argument("--emulate-link", default="100mbit,100ms",
                    help="RATE[,RTT[,LOSS]] given to every node")
    ap.add_argument("--workload", default="gpt")
    ap.add_argument("--model-size", default="small")
    ap.add_argument("--outer", default="noloco", choices=["noloco", "diloco"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=0,
                    help="inner steps between evaluations (0: --steps, i.e. once at the end; "
                    "evaluation is excluded from utilization anyway)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads per node")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per mode")
    ap.add_argument("--keep-state", action="store_true")
    return ap.parse_args()


def analyse(nd, overlap):
    st = nd.stop_event()
    if st is None:
        raise nb.BenchError(f"{nd.name} wrote no stop event")
    rounds = nd.events("round")
    r = {"name": nd.name, "util": st["utilization"], "compute": st["compute_s"],
         "eval": st["eval_s"], "wall": st["wall_s"], "averaged": st["rounds_averaged"],
         "local": st["rounds_local"], "syncs": st["syncs"], "rounds": len(rounds),
         "sync_mean": sum(e["sync_ms"] for e in rounds) / len(rounds) / 1e3 if rounds else 0,
         "sync_max": max((e["sync_ms"] for e in rounds), default=0) / 1e3,
         "last_sync": rounds[-1]["sync_ms"] / 1e3 if rounds else 0,
         "bytes_sent": st["bytes_sent"]}
    if len(rounds) >= 3:
        a, b = rounds[0], rounds[-2]
        dw, dc, de = b["wall_s"] - a["wall_s"], b["compute_s"] - a["compute_s"], \
            b["eval_s"] - a["eval_s"]
        r["steady"] = dc / (dw - de) if dw - de > 0 else float("nan")
        n = len(rounds) - 2
        r["phase"] = dc / n
    else:
        r["steady"] = r["phase"] = float("nan")
    # With overlap a round whose result takes longer than an inner phase makes the node wait
    # before it submits the next one (the last round is always waited for).
    r["late"] = sum(1 for e in rounds[:-1] if e["sync_ms"] / 1e3 > r["phase"])
    # Time outside inner steps and evaluation between consecutive round events, less (without
    # overlap) the round itself.
    over = []
    for p, q in zip(rounds, rounds[1:-1] if len(rounds) > 2 else []):
        idle = (q["wall_s"] - p["wall_s"]) - (q["compute_s"] - p["compute_s"]) - \
            (q["eval_s"] - p["eval_s"])
        over.append(idle if overlap else idle - q["sync_ms"] / 1e3)
    r["idle_per_round"] = sum(over) / len(over) if over else float("nan")
    if rounds:
        last = rounds[-1]
        r["leave"] = (st["wall_s"] - last["wall_s"]) - (st["eval_s"] - last["eval_s"])
        r["first_round_wall"] = rounds[0]["wall_s"]
    else:
        r["leave"] = r["first_round_wall"] = float("nan")
    r["idle"] = st["wall_s"] - st["eval_s"] - st["compute_s"]
    return r


def run_mode(a, binary, overlap, logroot):
    name = "overlap" if overlap else "no-overlap"
    logdir = nb.fresh_dir(os.path.join(logroot, name))
    sd = nb.statedir(a.keep_state)
    run_args = ["--workload", a.workload, "--model-size", a.model_size, "--seed", str(a.seed),
                "--inner-steps", str(a.inner_steps), "--batch", str(a.batch),
                "--seq-len", str(a.seq_len), "--outer", a.outer,
                "--window-ms", str(a.window_ms),
                "--eval-every", str(a.eval_every or a.steps)]
    node_args = ["--max-steps", str(a.steps), "--threads", str(a.threads),
                 "--emulate-link", a.emulate_link] + (["--overlap"] if overlap else [])
    print(f"[{name}] {a.nodes} nodes x {a.steps} steps (H={a.inner_steps}, window "
          f"{a.window_ms} ms, links {a.emulate_link}); logs in {logdir}", flush=True)
    t0 = time.monotonic()
    swarm = nb.start_swarm(binary, a.nodes, run_args, node_args, logdir, sd)
    nb.wait_all(swarm, a.timeout)
    print(f"[{name}] done in {time.monotonic() - t0:.0f} s", flush=True)
    nb.print_log_digest(swarm, f"[{name}]")
    return [analyse(nd, overlap) for nd in swarm]


def main():
    a = parse_args()
    binary = nb.check_binary(a.binary)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("off", "on") for m in modes):
        raise nb.BenchError("--modes: expected off, on or off,on")
    os.makedirs(a.out, exist_ok=True)
    logroot = os.path.join(a.out, "utilization")
    results = {m: run_mode(a, binary, m == "on", logroot) for m in modes}

    print()
    print("Compute utilization = compute_s / (wall_s - eval_s), from each node's stop event")
    hdr = ["overlap", "node", "utilization", "steady", "compute s", "wall s", "idle s",
           "rounds avg/local", "phase s", "sync mean/max s", "late", "per-round idle s",
           "last round s",
           "leave s", "MB sent"]
    rows = []
    for m, rs in results.items():
        for r in rs:
            rows.append([m, r["name"], f"{r['util']:.4f}", f"{r['steady']:.4f}",
                         f"{r['compute']:.1f}", f"{r['wall']:.1f}", f"{r['idle']:.1f}",
                         f"{r['averaged']}/{r['local']}", f"{r['phase']:.2f}",
                         f"{r['sync_mean']:.2f}/{r['sync_max']:.2f}", str(r["late"]),
                         f"{r['idle_per_round']:.2f}", f"{r['last_sync']:.2f}",
                         f"{r['leave']:.2f}", f"{nb.mb(r['bytes_sent']):.1f}"])
    print(nb.table(rows, hdr))
    mean = {m: sum(r["util"] for r in rs) / len(rs) for m, rs in results.items()}
    steady = {m: sum(r["steady"] for r in rs) / len(rs) for m, rs in results.items()}
    print()
    for m in modes:
        print(f"mean utilization, overlap {m}: {mean[m]:.4f} (steady {steady[m]:.4f})")
    if "on" in mean and "off" in mean:
        print(f"ratio with/without overlap: {mean['on'] / mean['off']:.3f} "
              f"(steady {steady['on'] / steady['off']:.3f})")
    if "on" in mean:
        verdict = "met" if mean["on"] >= 0.98 else "NOT met"
        print(f"target >= 0.98 with overlap: {verdict} ({mean['on']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(nb.main_guard(main))
