#!/usr/bin/python3
"""What the trainer pays for grove-node: two grove-node processes (--workload external) on loopback,
each driven by a PyTorch trainer with a ~100M-parameter model (float32, CPU unless --device
cuda), NoLoCo, H inner steps a round. Run once without and once with the node's --overlap.
With --device cuda the model lives on the GPU and the hand-off goes through the grove package's
pinned staging chunk; --dtype bfloat16 (or float16) takes that chunked copy path on any device.

Prints, per run:
  - the time of H inner steps (the trainer's own forward, backward and optimiser steps);
  - the per-round overhead the trainer sees in step(): the mean time of the step() calls that end
    an inner phase minus that of the other calls, and its ratio to the time of H inner steps;
  - the hand-off through shared memory: the node taking θ (the trainer is asked to store it, then
    the node copies it out) against a memcpy of the same bytes measured by the node in the same
    run (target: memcpy time ÷ hand-off time >= 0.5).

Usage: bench/trainer_bench.py GROVE_NODE [--params 100e6] [--inner-steps 10] [--rounds 10]
       [--device auto|cpu|cuda] [--dtype float32|bfloat16|float16] [--modes no-overlap,overlap]
(run with /usr/bin/python3: Debian's torch; the trainers run under the same interpreter). Takes
about 3 minutes on 2 cores.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "node", "python"))


def trainer(argv):
    import torch

    sys.path.insert(0, PKG)
    import grove

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--params", type=float, required=True)
    ap.add_argument("--inner-steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    d = 4096
    layers = max(1, round(a.params / (d * d + d)))
    dtype = getattr(torch, a.dtype)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(layers)]).to(
        device=a.device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    node = grove.attach(socket=a.socket, timeout=120)
    outer = node.noloco(model, inner_steps=a.inner_steps)
    compute, calls = [], []
    x = torch.randn(2, d, device=a.device, dtype=dtype)
    cuda = a.device.startswith("cuda")
    try:
        while True:
            t0 = time.perf_counter()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            node.report(loss=loss.item())
            outer.step()
            t2 = time.perf_counter()
            compute.append(t1 - t0)
            calls.append(t2 - t1)
    except grove.NodeStopped:
        pass
    with open(a.out, "w") as f:
        json.dump({"params": sum(p.numel() for p in model.parameters()), "compute": compute,
                   "calls": calls}, f)
    node.close()
    return 0


def mean(v):
    return sum(v) / len(v) if v else float("nan")


def one_run(binary, args, overlap):
    work = tempfile.mkdtemp(prefix="grove-tbench.")
    procs = []
    try:
        key = os.path.join(work, "key")
        steps = args.inner_steps * args.rounds
        common = ["--listen", "127.0.0.1:0", "--no-progress", "--no-upnp", "--swarm-key-file", key,
                  "--max-steps", str(steps), "--threads", "1"] + (["--overlap"] if overlap else [])
        logs = {}
        for name in ("a", "b"):
            extra = (["--bootstrap", "--workload", "external", "--window-ms", "1000"]
                     if name == "a" else ["--peer", addr])
            logs[name] = os.path.join(work, name + ".log")
            procs.append(subprocess.Popen(
                [binary] + common + extra + ["--state-dir", os.path.join(work, name),
                                             "--metrics", os.path.join(work, name + ".jsonl")],
                stdout=open(logs[name], "w"), stderr=subprocess.STDOUT))
            sock = os.path.join(work, name, "trainer.sock")
            deadline = time.monotonic() + 60
            while not os.path.exists(sock):
                if time.monotonic() > deadline:
                    raise RuntimeError("node %s did not open its trainer socket" % name)
                time.sleep(0.1)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--trainer", "--socket", sock,
                 "--params", str(args.params), "--inner-steps", str(args.inner_steps),
                 "--device", args.device, "--dtype", args.dtype,
                 "--out", os.path.join(work, name + ".out.json")],
                stdout=open(os.path.join(work, name + ".trainer.log"), "w"),
                stderr=subprocess.STDOUT))
            if name == "a":
                deadline = time.monotonic() + 300
                addr = None
                while addr is None:
                    with open(logs["a"]) as f:
                        m = re.search(r"listening (\S+)", f.read())
                    addr = m.group(1) if m else None
                    if addr is None and time.monotonic() > deadline:
                        raise RuntimeError("node a did not start")
                    time.sleep(0.1)
        for p in procs:
            if p.wait(timeout=1800) != 0:
                raise RuntimeError("a process exited with %s (logs in %s)" % (p.returncode, work))
        out = {}
        for name in ("a", "b"):
            with open(os.path.join(work, name + ".out.json")) as f:
                r = json.load(f)
            h = args.inner_steps
            calls = r["calls"]
            with open(os.path.join(work, name + ".jsonl")) as f:
                events = [json.loads(l) for l in f if l.strip()]
            handoff = [e for e in events if e.get("event") == "handoff"]
            rounds = [e for e in events if e.get("event") == "round"]
            stop = ([e for e in events if e.get("event") == "stop"] or [{}])[-1]
            # Call k (1-based) with k % H == 0 ends inner phase k / H: the node's round j = k/H - 1
            # runs in it (without overlap). Counted: the rounds after the first that averaged
            # (before the other node trains, a node waits for partners that are not there yet).
            ends = [c for i, c in enumerate(calls) if (i + 1) % h == 0]
            ends = [c for j, c in enumerate(ends)
                    if 0 < j < len(rounds) and rounds[j].get("partners")]
            others = [c for i, c in enumerate(calls) if (i + 1) % h != 0][h:]
            syncs = [x["sync_ms"] for x in rounds[1:] if x.get("partners")]
            # The node logs every engine call that held its DHT strand >= 250 ms (while it
            # holds it, the node answers no DHT message).
            with open(logs[name]) as f:
                holds = [float(m.group(2)) for m in re.finditer(
                    r"round engine: (.+?) held the DHT strand for (\d+) ms", f.read())]
            out[name] = {
                "sync_ms": mean(syncs),
                "params": r["params"],
                "inner": mean(r["compute"][h:]) * h,
                "overhead": mean(ends) - mean(others),
                "plain_call_ms": 1e3 * mean(others),
                "handoff": handoff[-1] if handoff else {},
                "averaged": sum(1 for x in rounds if x.get("partners")),
                "rounds": len(rounds),
                "peak_rss": stop.get("peak_rss_bytes") or float("nan"),
                "checkpoint_s": stop.get("checkpoint_s") or float("nan"),
                "holds": holds,
            }
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if os.environ.get("GROVE_BENCH_KEEP"):
            print("logs kept in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--modes", default="no-overlap,overlap")
    args = ap.parse_args()
    if args.device == "auto":
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    where = args.device
    if where.startswith("cuda"):
        import torch
        where = "%s (%s)" % (where, torch.cuda.get_device_name(0))
    print("trainer_bench: 2 nodes + 2 PyTorch trainers on loopback, NoLoCo, H = %d, %d rounds, "
          "model in %s on %s" % (args.inner_steps, args.rounds, args.dtype, where))
    modes = args.modes.split(",")
    for m in modes:
        if m not in ("no-overlap", "overlap"):
            ap.error("--modes: unknown mode %r (no-overlap, overlap)" % m)
    for overlap in [m == "overlap" for m in modes]:
        res = one_run(args.binary, args, overlap)
        for name, r in res.items():
            h = r["handoff"]
            ratio = h.get("memcpy_ms", float("nan")) / h.get("get_ms", float("nan")) \
                if h.get("get_ms") else float("nan")
            print("%-10s node %s: %.1fM params; H inner steps %.2f s; per-round overhead in "
                  "step() %.3f s = %.3f x H inner steps (other step() calls %.2f ms); %d/%d rounds "
                  "averaged, mean round %.0f ms as the node sees it; hand-off %.1f ms for %.0f MB vs memcpy %.1f ms: memcpy / hand-off = "
                  "%.2f (target >= 0.5); hand-off %.2f GB/s"
                  % ("overlap" if overlap else "no overlap", name, r["params"] / 1e6, r["inner"],
                     r["overhead"], r["overhead"] / r["inner"], r["plain_call_ms"], r["averaged"],
                     r["rounds"], r["sync_ms"], h.get("get_ms", float("nan")), h.get("bytes", 0) / 1e6,
                     h.get("memcpy_ms", float("nan")), ratio,
                     h.get("bytes", 0) / 1e6 / h["get_ms"] if h.get("get_ms") else float("nan")),
                  flush=True)
            print("%-10s node %s: peak RSS %.2f GB = %.1f x the parameter bytes; checkpoint "
                  "(written in the background) %.2f s"
                  % ("", name, r["peak_rss"] / 1e9, r["peak_rss"] / (4 * r["params"]),
                     r["checkpoint_s"]), flush=True)
            holds = r["holds"]
            print("%-10s node %s: engine calls holding the DHT strand >= 250 ms: %d%s"
                  % ("", name, len(holds),
                     ", longest %.0f ms" % max(holds) if holds else ""), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        sys.exit(trainer(sys.argv[2:]))
    sys.exit(main())
