#!/usr/bin/python3
"""Gloo's ring all-reduce timed the way bench/allreduce_bench times grove-node's.

usage: gloo_allreduce.py PROCS REPS PORT SIZE_BYTES...
       gloo_allreduce.py --rank R --world N --master ADDR:PORT REPS SIZE_BYTES...
The first form starts PROCS processes on this machine (torch.distributed, gloo backend, TCP on
127.0.0.1:PORT). The second runs one rank only, for ranks started separately (each in its own
network namespace, bench/netns_allreduce.sh; set GLOO_SOCKET_IFNAME to its interface); rank 0
listens on ADDR:PORT and prints the results.
For each size: one warm-up and REPS timed all_reduce(SUM) calls of a float32 tensor, each timed
as the slowest rank's wall time, then divided by PROCS (the mean, as grove-node's result is).
Prints one line per size: "gloo PROCS SIZE_BYTES MEDIAN_SECONDS".
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, procs, reps, port, sizes, queue, master="127.0.0.1"):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=procs)
    for size in sizes:
        t = torch.full((size // 4,), float(rank + 1), dtype=torch.float32)
        times = []
        for r in range(reps + 1):
            dist.barrier()
            a = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t.div_(procs)
            took = torch.tensor([time.perf_counter() - a], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if r > 0:
                times.append(took.item())
        if rank == 0:
            queue.put((size, statistics.median(times)))
    dist.destroy_process_group()


class PrintQueue:
    """Stands in for the result queue when this process is rank 0 of separately started ranks."""

    def __init__(self, procs):
        self.procs = procs

    def put(self, item):
        size, med = item
        print(f"gloo {self.procs} {size} {med:.6f}", flush=True)


def one_rank(argv):
    opts = dict(zip(argv[0:6:2], argv[1:6:2]))
    if sorted(opts) != ["--master", "--rank", "--world"] or len(argv) < 8:
        sys.exit(__doc__)
    rank, procs = int(opts["--rank"]), int(opts["--world"])
    master, port = opts["--master"].rsplit(":", 1)
    reps, sizes = int(argv[6]), [int(s) for s in argv[7:]]
    worker(rank, procs, reps, int(port), sizes, PrintQueue(procs), master)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return one_rank(sys.argv[1:])
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    procs, reps, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    sizes = [int(s) for s in sys.argv[4:]]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, procs, reps, port, sizes, queue))
          for r in range(procs)]
    for p in ps:
        p.start()
    for _ in sizes:
        size, med = queue.get(timeout=600)
        print(f"gloo {procs} {size} {med:.6f}", flush=True)
    for p in ps:
        p.join(timeout=60)
    sys.exit(0 if all(p.exitcode == 0 for p in ps) else 1)


if __name__ == "__main__":
    main()
