#!/usr/bin/python3
"""The grove package's hand-off of a GPU model's parameters through the node's shared memory:
the time to store θ (device → host, float32) and to load it back (host → device) whole, and to
load one streaming fragment's part only (what a trainer does after a round of one of F fragments).
No node: a pageable float32 host tensor stands for the shared-memory segment.

The baseline, measured in the same run: one pinned staging buffer, each chunk copied through it
synchronously (the dtype conversion left to copy_), as the package did before it double-buffered.

Usage: trainer_handoff_gpu.py [--params 1e9] [--dtype bf16] [--fragments 8]. Needs CUDA.
Last line: handoff-gpu: store <s> (<x> faster than baseline) load <s> (<x>) fragment-load <s>
(<x> less than whole)
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "node", "python")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=1e9)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--fragments", type=int, default=8)
    ap.add_argument("--tensors", type=int, default=32)
    a = ap.parse_args()
    import torch
    import grove
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 77
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    n = int(a.params) // a.tensors
    params = [torch.nn.Parameter(torch.randn(n, device="cuda").to(dt)) for _ in range(a.tensors)]
    total = n * a.tensors
    shm = torch.empty(total, dtype=torch.float32)
    shm.fill_(0.0)  # pages touched once, as the node's segment is
    outer = grove.Outer.__new__(grove.Outer)
    outer._staging = None
    outer._slots, outer._offsets = [], []
    for i, p in enumerate(params):
        outer._slots.append([p, shm[i * n:(i + 1) * n], False, False])
        outer._offsets.append(i * n)

    def timed(fn, *args):
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    chunk = grove.COPY_CHUNK
    single = torch.empty(chunk, dtype=torch.float32, pin_memory=True)

    def baseline(to_host):  # one pinned buffer, synchronous, conversion by copy_
        for i, p in enumerate(params):
            src, dst = p.data.reshape(-1), shm[i * n:(i + 1) * n]
            for j in range(0, n, chunk):
                k = min(chunk, n - j)
                if to_host:
                    single[:k].copy_(src[j:j + k])
                    dst[j:j + k].copy_(single[:k])
                else:
                    single[:k].copy_(dst[j:j + k])
                    src[j:j + k].copy_(single[:k])

    base_store = timed(baseline, True)
    base_load = timed(baseline, False)
    store = timed(outer._store)
    load = timed(outer._load)
    # The package's copies give the parameters' own values back (through float32).
    want = [p.data.clone() for p in params[:2]]
    outer._store()
    for p in params[:2]:
        p.data.zero_()
    outer._load()
    for p, w in zip(params[:2], want):
        if not torch.equal(p.data, w):
            raise SystemExit("the values did not survive a store and a load")
    f = a.fragments
    lo, hi = total * 3 // f, total * 4 // f  # one fragment, across tensors' boundaries
    part = timed(outer._load, lo, hi)
    gb = total * 4 / 1e9
    print(f"{torch.cuda.get_device_name()}: {total / 1e9:.2f}B parameters in {a.dtype}, "
          f"{gb:.1f} GB of float32 in host memory; best of 3")
    print(f"baseline: store {base_store:.3f} s ({gb / base_store:.1f} GB/s), load "
          f"{base_load:.3f} s ({gb / base_load:.1f} GB/s)")
    print(f"grove: store (device -> host) {store:.3f} s ({gb / store:.1f} GB/s), load (host -> "
          f"device) {load:.3f} s ({gb / load:.1f} GB/s), one of {f} fragments {part:.3f} s")
    print(f"handoff-gpu: store {store:.3f} ({base_store / store:.2f}x faster than baseline) "
          f"load {load:.3f} ({base_load / load:.2f}x) fragment-load {part:.3f} "
          f"({load / part:.1f}x less than whole)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
