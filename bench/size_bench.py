#!/usr/bin/python3
"""grove-node at real model sizes: memory, join time and transfer time against their bounds.

Three grove-node processes with --workload external, each driven by a PyTorch trainer (this file
run with --trainer) holding a float32 model of --params parameters, every node's link emulated
at --link (grove-node --emulate-link: it shapes what the node sends). The trainer's inner steps
are cheap (a small scaling of the weights): only the node is measured. Nodes a and b start
together (b joins a: a state sync of its own); c starts once both have ended round 2 and must
download the full state. Runs NoLoCo, then
DiLoCo, then NoLoCo with --overlap (--modes).

Per node it prints: peak RSS (getrusage, the node's stop event) / parameter bytes, and against
the bound 2 x parameter bytes + 200 MB; for c, the join / (state bytes / link rate), state bytes = 8 per parameter (its launch to its "start" metrics
event, written once the state is in hand); per round, the transfer time (the
exchange or all-reduce, start to outcome: "transfer_s") / (the larger of the bytes sent and
received per partner / link rate: every link is shaped on its own; a DiLoCo ring sends all to
one member); the rounds averaged (of those during which another node trained: a's first rounds,
while b fetches its state, have nobody to average with and are listed apart); the deadlines that fired (log lines of a request,
chunk or exchange deadline). Targets: peak <= 2x + 200 MB (never 3x), join <= 1.2 x bound + 10 s,
transfer <= 1.15 x bound, every round averaged, no deadline fired. Ends with one line:

size_bench: params P, peak RSS/params X, join Y x bound, transfer Z x bound, averaged A/B, deadlines fired D

(X, Y, Z the worst over nodes, rounds and modes). Usage (Debian's torch: /usr/bin/python3):
  bench/size_bench.py GROVE_NODE [--params 500e6] [--link 100mbit,50ms] [--rounds 4]
      [--inner-steps 20] [--modes noloco,diloco,overlap] [--out DIR]
Takes about 8 minutes per mode at 500M on 100 Mbit/s (about 2 at 100M).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "node", "python"))
sys.path.insert(0, HERE)
import nodebench as nb  # noqa: E402

# Log lines that say a deadline fired (gossip/exchange.cpp, gossip/allreduce.cpp,
# gossip/state_sync.cpp, node/controller.cpp).
DEADLINE = re.compile(r"past the chunk timeout|exchange timed out|timed out|not answered by its "
                      r"deadline|did not finish in|gave up waiting|could not get the swarm's state")


def trainer(argv):
    import torch

    sys.path.insert(0, PKG)
    import grove

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--params", type=float, required=True)
    ap.add_argument("--outer", default="noloco")
    ap.add_argument("--inner-steps", type=int, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # Tensors of at most 64M values (a model's layers), float32, that sum to --params.
    total, left, shapes = int(a.params), int(a.params), []
    while left > 0:
        shapes.append(min(left, 64 << 20))
        left -= shapes[-1]
    model = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.empty(n).uniform_(-0.05, 0.05)) for n in shapes])
    assert sum(p.numel() for p in model.parameters()) == total
    node = grove.attach(socket=a.socket, timeout=600)
    outer = (node.noloco(model, inner_steps=a.inner_steps) if a.outer == "noloco"
             else node.diloco(model, inner_steps=a.inner_steps))
    try:
        while True:
            time.sleep(0.05)  # a step's worth of work, without the CPU
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.9999)
            node.report(loss=1.0)
            outer.step()
    except grove.NodeStopped:
        pass
    except grove.NodeGone:
        pass
    node.close()
    return 0


def link_rate(link):
    """Bytes per second of an --emulate-link RATE[,...] (kbit, mbit, gbit)."""
    m = re.match(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", link.split(",")[0])
    if not m:
        raise SystemExit("size_bench: --link %r: want e.g. 100mbit,50ms" % link)
    scale = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    return float(m.group(1)) * scale / 8.0


def events(path):
    return nb.read_metrics(path)


def wait_for(cond, timeout, what, procs):
    deadline = time.monotonic() + timeout
    while not cond():
        for name, p in procs.items():
            if p.poll() not in (None, 0):
                raise RuntimeError("%s exited with %s while waiting for %s" % (name, p.returncode,
                                                                             what))
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(0.2)


def one_mode(binary, a, mode, work):
    rate = link_rate(a.link)
    outer = "diloco" if mode == "diloco" else "noloco"
    key = os.path.join(work, "key")
    steps = a.inner_steps * a.rounds
    common = ["--listen", "127.0.0.1:0", "--no-progress", "--no-upnp", "--no-relay",
              "--swarm-key-file", key, "--threads", "2",
              "--emulate-link", a.link] + (["--overlap"] if mode == "overlap" else []) + \
        a.node_args.split()
    procs, started, launched = {}, {}, {}
    rss = nb.RssSampler(0.1)

    def start(name, extra):
        sd = os.path.join(work, name)
        log = open(os.path.join(work, name + ".log"), "w")
        started[name] = time.monotonic()
        launched[name] = time.time()  # (the metrics lines' clock)
        procs[name] = subprocess.Popen(
            [binary] + common + extra + ["--state-dir", sd,
                                         "--metrics", os.path.join(work, name + ".jsonl")],
            stdout=log, stderr=subprocess.STDOUT)
        rss.watch(name, procs[name].pid)
        sock = os.path.join(sd, "trainer.sock")
        wait_for(lambda: os.path.exists(sock), 120, name + "'s trainer socket", procs)
        procs[name + "-trainer"] = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--trainer", "--socket", sock,
             "--params", str(a.params), "--outer", outer, "--inner-steps", str(a.inner_steps)],
            stdout=open(os.path.join(work, name + ".trainer.log"), "w"), stderr=subprocess.STDOUT)

    def address():
        with open(os.path.join(work, "a.log")) as f:
            m = re.search(r"listening (\S+)", f.read())
        return m.group(1) if m else None

    # a and b train until c has trained its rounds (then they are stopped, as a user would);
    # c trains --rounds inner phases after its join.
    start("a", ["--bootstrap", "--workload", "external", "--window-ms", str(a.window_ms)])
    wait_for(lambda: address() is not None, 300, "node a to listen", procs)
    peer = ["--peer", address()]
    start("b", peer)

    def round_of(name):
        r = [e["round"] for e in events(os.path.join(work, name + ".jsonl"))
             if e.get("event") == "round"]
        return max(r) if r else 0
    # b joins a (a full state sync of its own), then c once both have ended round 2.
    wait_for(lambda: round_of("a") >= 2 and round_of("b") >= 2, a.timeout, "round 2 of a and b",
             procs)
    start("c", peer + ["--max-steps", str(steps)])

    exited = {}  # nodes that exited with an error: reported, not fatal to the bench

    def finish(name):
        left = max(1.0, a.timeout - (time.monotonic() - started["a"]))
        try:
            rc = procs[name].wait(timeout=left)
        except subprocess.TimeoutExpired:
            # Reported with the rest (what the logs hold so far), and the next mode runs.
            procs[name].kill()
            procs[name].wait()
            rc = "did not finish within %d s" % a.timeout
        if rc != 0:
            exited[name] = rc
    finish("c")
    finish("c-trainer")
    for name in ("a", "b"):
        procs[name].send_signal(signal.SIGTERM)
    for name in ("a", "b", "a-trainer", "b-trainer"):
        finish(name)
    rss.stop()
    return report(work, a.params, rate, launched["c"], rss.peak, exited)


def report(work, params, rate, c_launched, sampled_peak=lambda name: None, exited=None):
    """Reads the nodes' metrics and logs in `work`, prints the rows, returns the worst figures."""
    rows, worst = [], {"peak": 0.0, "join": 0.0, "transfer": 0.0}
    averaged = total = fired = 0
    state_bytes = 8.0 * params
    # When each node trained: from its "start" event (the state in hand) to its "stop".
    spans, evs = {}, {}
    for name in ("a", "b", "c"):
        ev = evs[name] = events(os.path.join(work, name + ".jsonl"))
        t0 = [e["time"] for e in ev if e.get("event") == "start"]
        t1 = [e["time"] for e in ev if e.get("event") == "stop"]
        spans[name] = (t0[0] if t0 else float("inf"), t1[-1] if t1 else float("inf"))

    def alone(name, e):
        # No other node trained during any of this round (it began wall_s before its event):
        # nobody to average with (a's first rounds, while b fetches its state).
        begun = e["time"] - e.get("wall_s", 0)
        return not any(t0 < e["time"] and t1 > begun
                       for other, (t0, t1) in spans.items() if other != name)
    for name in ("a", "b", "c"):
        ev = evs[name]
        stop = [e for e in ev if e.get("event") == "stop"]
        if (exited or {}).get(name):
            with open(os.path.join(work, name + ".log")) as f:
                last = [l.strip() for l in f if "[error]" in l or "[warning]" in l]
            how = exited[name] if isinstance(exited[name], str) else \
                "exited with %d" % exited[name]
            rows.append("  %s %s%s" % (name, how, ": " + last[-1][:160] if last else ""))
        if stop:
            peak_bytes = stop[-1]["peak_rss_bytes"]
        else:  # (exited before training: its sampled peak, if any)
            p = sampled_peak(name)
            peak_bytes = p[0] if p else float("nan")
        peak = peak_bytes / (4.0 * params)
        bound_ok = peak_bytes <= 2 * 4.0 * params + 200e6
        every = [e for e in ev if e.get("event") == "round"]
        rounds = [e for e in every if not alone(name, e)]
        if len(rounds) < len(every):
            rows.append("  %s: %d round(s) alone (no other node trained yet), not counted" %
                        (name, len(every) - len(rounds)))
        averaged += sum(1 for e in rounds if not e.get("local_only"))
        total += len(rounds)
        for e in rounds:
            if e.get("local_only"):
                rows.append("  %s: round %d local-only: %s" % (name, e["round"], e.get("note")))
        ratios = []
        for e in rounds:
            # Every link is shaped on its own (--emulate-link): the bound is the bytes to and
            # from one partner. A ring all-reduce (DiLoCo) sends all of its bytes to one member
            # (its successor) and receives them from one (its predecessor).
            partners = 1 if e.get("mode") == "diloco" else max(1, len(e.get("partners") or []))
            wire = max(e.get("round_bytes_sent", 0), e.get("round_bytes_received", 0)) / partners
            if wire > 0 and e.get("transfer_s") and not e.get("local_only"):
                ratios.append(e["transfer_s"] / (wire / rate))
        transfer = max(ratios) if ratios else float("nan")
        join = float("nan")
        if name == "c":
            # From the process's launch to its first metrics line: the "start" event, written
            # once the swarm's state is in hand.
            start_ev = [e for e in ev if e.get("event") == "start"]
            if start_ev:
                join_s = start_ev[0]["time"] - c_launched
                join = join_s / (state_bytes / rate)
                rows.append("  c joined in %.1f s; bound %.1f s (+10 s allowed)" %
                            (join_s, state_bytes / rate))
            else:
                join = float("inf")
                rows.append("  c never joined")
        with open(os.path.join(work, name + ".log")) as f:
            hits = [l.strip() for l in f if DEADLINE.search(l)]
        fired += len(hits)
        for h in hits[:3]:
            rows.append("  %s: %s" % (name, h[:160]))
        if peak == peak:
            worst["peak"] = max(worst["peak"], peak)
        if ratios:
            worst["transfer"] = max(worst["transfer"], transfer)
        if join == join:
            worst["join"] = max(worst["join"], join)
        p = sampled_peak(name)
        if p:
            rows.append("  %s at its sampled peak: %.0f MB resident = %.0f anonymous + %.0f "
                        "file-backed + %.0f shared memory" % (name, p[0] / 1e6, p[1] / 1e6,
                                                               p[2] / 1e6, p[3] / 1e6))
        print("  %s  peak RSS %.2f x params (%s 2x + 200 MB)  rounds %d, averaged %d  transfer "
              "%.2f x bound (worst)%s" % (
                  name, peak, "unknown against" if peak != peak else "within" if bound_ok
                  else "OVER", len(rounds),
                  sum(1 for e in rounds if not e.get("local_only")), transfer,
                  "  join %.2f x bound" % join if join == join else ""))
    for r in rows:
        print(r)
    return worst, averaged, total, fired


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        return trainer(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--params", type=float, default=500e6)
    ap.add_argument("--link", default="100mbit,50ms")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of a and b (inner phases)")
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--window-ms", type=int, default=5000)
    ap.add_argument("--modes", default="noloco,diloco,overlap")
    ap.add_argument("--timeout", type=float,
                    help="seconds per mode (default: 12 x the state's bytes at the link rate, at "
                         "least an hour)")
    ap.add_argument("--node-args", default="", help="more grove-node arguments (space-separated)")
    ap.add_argument("--out", help="keep the logs here (default: a temporary directory, removed)")
    a = ap.parse_args()
    if a.timeout is None:
        a.timeout = max(3600.0, 12 * 8.0 * a.params / link_rate(a.link))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    totals = {"peak": 0.0, "join": 0.0, "transfer": 0.0}
    averaged = total = fired = 0
    for mode in a.modes.split(","):
        work = (os.path.join(a.out, mode) if a.out else tempfile.mkdtemp(prefix="grove-size."))
        if a.out:
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
        print("%s: %d parameters, links %s" % (mode, int(a.params), a.link), flush=True)
        try:
            worst, av, tot, fi = one_mode(os.path.abspath(a.binary), a, mode, work)
        finally:
            subprocess.run(["pkill", "-f", work], check=False)
            if not a.out:
                shutil.rmtree(work, ignore_errors=True)
            else:  # keep the logs and metrics; the state directories hold GBs of checkpoints
                for name in ("a", "b", "c"):
                    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
        for k in totals:
            totals[k] = max(totals[k], worst[k])
        averaged, total, fired = averaged + av, total + tot, fired + fi
    print("size_bench: params %d, peak RSS/params %.2f, join %.2f x bound, transfer %.2f x bound, "
          "averaged %d/%d, deadlines fired %d" % (int(a.params), totals["peak"], totals["join"],
                                                  totals["transfer"], averaged, total, fired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
