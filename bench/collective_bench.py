#!/usr/bin/python3
"""Per-step grove.average_gradients between grove-node processes against torch.distributed's Gloo
all-reduce of the same tensors, in the same run, on this machine's loopback.

For each group size N (--nodes, default 2,4): N nodes (--workload external, encryption on as
always) each with a trainer process that meets the others at a barrier of N and then times
--reps calls of grove.average_gradients on a model's gradients (--params values in the tensor
shapes of a small transformer: embeddings, attention and MLP matrices, biases); and N Gloo ranks
(torch.distributed, TCP on 127.0.0.1) that time all_reduce(SUM) and a division on the same
tensors flattened into one buffer (as DDP's buckets do). Every call is timed as the slowest
member's wall time after a barrier; the figure is the median over the calls.

The last line:
  collective_bench: 25000000 params, loopback, fp32: N=2 grove/gloo 1.21x, N=4 grove/gloo 1.38x

usage: collective_bench.py GROVE_NODE [--params 25e6] [--nodes 2,4] [--reps 10] [--wire fp32]
Run with /usr/bin/python3 (Debian's torch).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "node", "python"))


def shapes(params):
    """Tensor shapes of a small transformer's gradients with about `params` values."""
    d = 512
    out, total = [], 0
    out.append((8192, d))  # embeddings
    total += 8192 * d
    while total < params:
        for s in ((3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,),
                  (d,), (d,)):
            n = 1
            for x in s:
                n *= x
            out.append(s)
            total += n
    return out, total


def grads(params, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    shp, total = shapes(params)
    return [torch.randn(s, generator=g) for s in shp], total


# ---- grove: one trainer (this file run with --trainer) -----------------------------------------
def trainer(argv):
    import torch
    sys.path.insert(0, PKG)
    import grove

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--params", type=float, required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--wire", default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    gs, _ = grads(int(a.params), a.seed)
    node = grove.attach(socket=a.socket, timeout=120)
    node.per_step(torch.nn.Linear(4, 1))  # (a per-step run: no rounds, collectives only)
    times = []
    try:
        grove.barrier(min_size=a.nodes, timeout=300)
        for r in range(a.reps + 1):
            grove.barrier(min_size=a.nodes, timeout=120)
            t0 = time.perf_counter()
            out = grove.average_gradients(gs, wire=a.wire, timeout=600)
            took = time.perf_counter() - t0
            if grove.world_size != a.nodes:
                raise SystemExit("a call among %d, not %d" % (grove.world_size, a.nodes))
            del out
            if r > 0:
                times.append(took)
    finally:
        node.close()
    with open(a.out, "w") as f:
        json.dump({"times": times}, f)
    return 0


def run_grove(binary, params, nodes, reps, wire, work):
    procs = []
    key = os.path.join(work, "key")
    addr = None
    outs = []
    try:
        for i in range(nodes):
            name = "n%d" % i
            sd = os.path.join(work, name)
            args = [binary, "--listen", "127.0.0.1:0", "--no-progress", "--no-upnp", "--no-relay",
                    "--swarm-key-file", key, "--state-dir", sd]
            args += (["--bootstrap", "--workload", "external", "--window-ms", "1000"] if i == 0
                     else ["--peer", addr])
            log = os.path.join(work, name + ".log")
            procs.append(subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT))
            sock = os.path.join(sd, "trainer.sock")
            deadline = time.monotonic() + 120
            while not os.path.exists(sock):
                if time.monotonic() > deadline or procs[-1].poll() is not None:
                    raise RuntimeError("node %s did not open its trainer socket" % name)
                time.sleep(0.1)
            out = os.path.join(work, name + ".json")
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--trainer", "--socket", sock,
                 "--params", str(params), "--nodes", str(nodes), "--reps", str(reps),
                 "--wire", wire, "--seed", str(i), "--out", out],
                stdout=open(os.path.join(work, name + ".trainer.log"), "w"),
                stderr=subprocess.STDOUT))
            if i == 0:
                deadline = time.monotonic() + 120
                while addr is None:
                    m = re.search(r"listening (\S+)", open(log).read())
                    addr = m.group(1) if m else None
                    if addr is None and time.monotonic() > deadline:
                        raise RuntimeError("the first node did not print its address")
                    time.sleep(0.1)
        for p in procs[1::2]:
            if p.wait(timeout=1800) != 0:
                raise RuntimeError("a trainer failed; see %s" % work)
        per_rank = [json.load(open(o))["times"] for o in outs]
        # Each call: the slowest member's time.
        return statistics.median(max(ts) for ts in zip(*per_rank))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


# ---- Gloo ----------------------------------------------------------------------------------------
def gloo_worker(rank, nodes, reps, port, params, queue):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=nodes)
    gs, total = grads(params, rank)
    flat = torch.cat([g.reshape(-1) for g in gs])
    times = []
    for r in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        buf = flat.clone()  # (as grove's call, which leaves the gradients unchanged)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        buf.div_(nodes)
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if r > 0:
            times.append(took.item())
    if rank == 0:
        queue.put(statistics.median(times))
    dist.destroy_process_group()


def run_gloo(params, nodes, reps, port):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=gloo_worker, args=(r, nodes, reps, port, params, q))
          for r in range(nodes)]
    for p in ps:
        p.start()
    med = q.get(timeout=1800)
    for p in ps:
        p.join(timeout=120)
    return med


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        return trainer(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--params", type=float, default=25e6)
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--wire", default="fp32", choices=("fp32", "fp16"))
    ap.add_argument("--port", type=int, default=29613)
    ap.add_argument("--out", help="keep the nodes' logs here")
    a = ap.parse_args()
    params = int(a.params)
    _, total = shapes(params)
    mb = total * 4 / 1e6
    ratios = []
    for n in [int(x) for x in a.nodes.split(",")]:
        gloo = run_gloo(params, n, a.reps, a.port + n)
        print("gloo  N=%d: %.3f s a call (%.0f MB of gradients, %.0f MB/s)"
              % (n, gloo, mb, mb / gloo), flush=True)
        work = os.path.join(a.out, "n%d" % n) if a.out else tempfile.mkdtemp(prefix="grove-coll.")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        try:
            grove_t = run_grove(os.path.abspath(a.binary), params, n, a.reps, a.wire, work)
        finally:
            if not a.out:
                shutil.rmtree(work, ignore_errors=True)
        print("grove N=%d: %.3f s a call (%s on the wire, %.0f MB/s); grove/gloo %.2fx"
              % (n, grove_t, a.wire, mb / grove_t, grove_t / gloo), flush=True)
        ratios.append("N=%d grove/gloo %.2fx" % (n, grove_t / gloo))
    print("collective_bench: %d params, loopback, %s: %s" % (total, a.wire, ", ".join(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
