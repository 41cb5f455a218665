#!/usr/bin/python3
"""Peak memory of a grove-node against the model's parameter bytes.

For each --model-sizes preset: the workload alone (bench/gpt_bench: the same preset, batch,
sequence length and threads, training and evaluating, no networking; its getrusage peak RSS),
then one node running a few rounds alone, then two nodes averaging (so exchange buffers exist).
Each node's peak is peak_rss_bytes of its stop event (getrusage maxrss); the bound is
  workload alone + 3 x parameter bytes (fp32) + 100 MB   (MB = 10^6 bytes)
and the script prints node peak / bound (target <= 1) and the node's excess over the workload
alone in multiples of the parameter bytes. It also samples each node's RSS every 50 ms and says
how high it was while the node only trained (up to its first round) and in what it peaked.
Logs, metrics and the RSS samples go to --out/memory/<preset>-<scenario>/.
"""

import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nodebench as nb  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--binary", default=nb.DEFAULT_BINARY, help="grove-node executable")
    ap.add_argument("--gpt-bench", default=nb.DEFAULT_GPT_BENCH,
                    help="gpt_bench executable (the workload alone)")
    ap.add_argument("--out", default="bench-out", help="output directory")
    ap.add_argument("--model-sizes", default="small", help="gpt presets, comma-separated")
    ap.add_argument("--scenarios", default="alone,pair", help="alone and/or pair")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="compute threads (node and gpt_bench)")
    ap.add_argument("--inner-steps", type=int, default=10, help="H, inner steps per round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per node")
    ap.add_argument("--outer", default="noloco", choices=["noloco", "diloco"])
    ap.add_argument("--window-ms", type=int, default=1000, help="matchmaking window")
    ap.add_argument("--overhead-mb", type=float, default=100.0, help="the bound's constant")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    ap.add_argument("--keep-state", action="store_true")
    return ap.parse_args()


def workload_alone(a, gpt_bench, model, steps, logdir):
    argv = [gpt_bench, "--model", model, "--batch", str(a.batch), "--seq", str(a.seq_len),
            "--threads", str(a.threads), "--steps", str(steps),
            "--eval-every", str(a.inner_steps)]
    print(f"[{model}] workload alone: {' '.join(argv)}", flush=True)
    p = nb.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 stdin=subprocess.DEVNULL)
    try:
        out, _ = p.communicate(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise nb.BenchError(f"gpt_bench did not finish within {a.timeout:.0f} s")
    with open(os.path.join(logdir, "gpt_bench.out"), "w") as f:
        f.write(out)
    m = re.search(r"peak RSS (\d+) bytes", out)
    if p.returncode != 0 or not m:
        raise nb.BenchError(f"gpt_bench failed (exit {p.returncode}) or printed no peak RSS "
                            f"(rebuild it):\n{out[-2000:]}")
    return int(m.group(1))


def run_nodes(a, binary, model, n, steps, logdir):
    sd = nb.statedir(a.keep_state)
    run_args = ["--model-size", model, "--inner-steps", str(a.inner_steps), "--batch",
                str(a.batch), "--seq-len", str(a.seq_len), "--outer", a.outer,
                "--window-ms", str(a.window_ms), "--eval-every", str(a.inner_steps)]
    node_args = ["--max-steps", str(steps), "--threads", str(a.threads)]
    t0 = time.monotonic()
    sampler = nb.RssSampler()
    swarm = nb.start_swarm(binary, n, run_args, node_args, logdir, sd)
    for nd in swarm:
        sampler.watch(nd.name, nd.proc.pid)
    try:
        nb.wait_all(swarm, a.timeout)
    finally:
        sampler.stop()
    print(f"[{model}] {n} node(s) done in {time.monotonic() - t0:.0f} s", flush=True)
    out = []
    for nd in swarm:
        st = nd.stop_event()
        if st is None:
            raise nb.BenchError(f"{nd.name} wrote no stop event")
        samples = sampler.samples.get(nd.name, [])
        with open(os.path.join(logdir, nd.name + ".rss.csv"), "w") as f:
            f.write("unix_time,rss_bytes\n")
            f.writelines(f"{t:.3f},{b}\n" for t, b in samples)
        out.append((nd.name, st, rss_story(nd.events(), samples)))
    nb.print_log_digest(swarm, f"[{model} x{n}]")
    return out


def rss_story(events, samples):
    """From the sampled RSS: the highest sample while the node only trained and evaluated (up
    to the evaluation that ends its first inner phase, or its first round's submission), the
    highest overall, and what the node was doing then (the first event after it)."""
    if not samples:
        return {"before_round": None, "sampled_peak": None, "peak_in": "-"}
    rounds = [e for e in events if e["event"] in ("round", "synced")]
    cut = None
    if rounds:
        first = rounds[0]
        evals = [e for e in events if e["event"] == "eval" and e["time"] <= first["time"]]
        cut = evals[-1]["time"] if evals else first["time"] - first.get("sync_ms", 0) / 1e3
    before = [b for t, b in samples if cut is None or t <= cut]
    t_peak, peak = max(samples, key=lambda x: x[1])
    nxt = next((e for e in events if e["time"] >= t_peak), None)
    if nxt is None or nxt["event"] == "stop":
        where = "the run's end (last round, leaving checkpoint, final evaluation)"
    elif nxt["event"] in ("round", "synced"):
        where = f"its round {nxt['round']} (submission to report: exchange, outer step, " \
                "apply and checkpoint)"
    else:
        where = f"the inner steps before step {nxt['step']}"
    return {"before_round": max(before) if before else None, "sampled_peak": peak,
            "peak_in": where}


def main():
    a = parse_args()
    binary = nb.check_binary(a.binary)
    gpt_bench = nb.check_binary(a.gpt_bench)
    scenarios = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    if not scenarios or any(s not in ("alone", "pair") for s in scenarios):
        raise nb.BenchError("--scenarios: expected alone, pair or alone,pair")
    steps = a.inner_steps * a.rounds
    rows, notes = [], []
    for model in [m.strip() for m in a.model_sizes.split(",") if m.strip()]:
        logdir = nb.fresh_dir(os.path.join(a.out, "memory", model + "-workload"))
        base = workload_alone(a, gpt_bench, model, steps, logdir)
        print(f"[{model}] workload alone: peak RSS {nb.mb(base):.1f} MB", flush=True)
        rows.append([model, "workload alone (gpt_bench)", "-", f"{nb.mb(base):.1f}", "-", "-",
                     "-", "-", "-"])
        for sc in scenarios:
            n = 1 if sc == "alone" else 2
            logdir = nb.fresh_dir(os.path.join(a.out, "memory", f"{model}-{sc}"))
            for name, st, story in run_nodes(a, binary, model, n, steps, logdir):
                peak, pb = st["peak_rss_bytes"], st["param_bytes"]
                bound = base + 3 * pb + a.overhead_mb * 1e6
                rows.append([model, f"node, {sc}", name, f"{nb.mb(peak):.1f}",
                             f"{nb.mb(pb):.1f}", f"{nb.mb(bound):.1f}",
                             f"{peak / bound:.3f}", f"{nb.mb(peak - base):+.1f}",
                             f"{(peak - base) / pb:.1f}x"])
                notes.append(f"  {model} {sc} {name}: sampled RSS {fmt_mb(story['before_round'])}"
                             f" MB while only training (to the end of its first inner phase); "
                             f"highest {fmt_mb(story['sampled_peak'])} MB, in "
                             f"{story['peak_in']}")
    print()
    print(f"Peak RSS against the bound = workload alone + 3 x parameter bytes + "
          f"{a.overhead_mb:.0f} MB ({a.rounds} rounds of {a.inner_steps} steps, batch "
          f"{a.batch} x {a.seq_len}, {a.threads} thread(s))")
    print(nb.table(rows, ["preset", "what", "node", "peak MB", "param MB", "bound MB",
                          "peak/bound", "over workload MB", "over / param bytes"]))
    print("\n".join(notes))
    return 0


def fmt_mb(x):
    return "-" if x is None else f"{nb.mb(x):.1f}"


if __name__ == "__main__":
    sys.exit(nb.main_guard(main))
