#!/usr/bin/python3
"""The grove package's copy path (node/python/grove): parameters that cannot live in the node's
shared memory (not float32, or not on the CPU) are copied in and out of it a bounded chunk at a
time. Checked here on CPU tensors of float16, bfloat16 and float64 (a GPU's parameters take the
double-buffered pinned path: checked on a GPU when one is there), with a chunk far smaller
than the parameters so that every parameter spans several chunks and a ragged last one: the
values that arrive in shared memory and come back are the parameters' own, converted; a load of
part of θ (a round of one streaming fragment) takes those values only.

Usage: grove_copy_test.py. Exit 77 (skipped) without Debian's torch. Run with /usr/bin/python3.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "node", "python")))


def check(grove, torch, dtype, device):
    torch.manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(1000, 7).to(dtype=dtype, device=device)),
              torch.nn.Parameter(torch.randn(3).to(dtype=dtype, device=device))]
    total = sum(p.numel() for p in params)
    shm = torch.zeros(total, dtype=torch.float32)  # stands for the node's segment
    outer = grove.Outer.__new__(grove.Outer)  # only the copy path: no node behind it
    outer._staging = None
    views, off = [], 0
    for p in params:
        views.append(shm[off:off + p.numel()].view(p.shape))
        off += p.numel()
    with torch.no_grad():
        for p, v in zip(params, views):
            outer._copy_in(p, v)
            want = p.data.float().cpu()
            if not torch.equal(v, want):
                raise AssertionError("%s on %s: shared memory differs from the parameter"
                                     % (dtype, device))
            v.mul_(2)  # the node's new weights
            outer._copy_out(p, v)
            if not torch.equal(p.data.float().cpu(), (want * 2).to(dtype).float()):
                raise AssertionError("%s on %s: the parameter did not take the new weights"
                                     % (dtype, device))
    staging = outer._staging
    if device != "cpu":
        if staging is None or len(staging) != 2 or staging[0].numel() > grove.COPY_CHUNK:
            raise AssertionError("a GPU's values pass through two chunk-sized staging buffers")
    elif staging is not None:
        raise AssertionError("CPU parameters need no staging buffer")


def check_part(grove, torch, dtype, device):
    """A load of part of the flat θ (a round of one streaming fragment): only the parameters'
    values in [lo, hi) take shared memory's, across a parameter boundary; the rest stay."""
    torch.manual_seed(4)
    params = [torch.nn.Parameter(torch.randn(1000, 7).to(dtype=dtype, device=device)),
              torch.nn.Parameter(torch.randn(3).to(dtype=dtype, device=device))]
    total = sum(p.numel() for p in params)
    shm = torch.randn(total, dtype=torch.float32)  # the node's new weights
    outer = grove.Outer.__new__(grove.Outer)
    outer._staging = None
    outer._slots, outer._offsets, off = [], [], 0
    for p in params:
        outer._slots.append([p, shm[off:off + p.numel()].view(p.shape), False, False])
        outer._offsets.append(off)
        off += p.numel()
    before = torch.cat([p.data.reshape(-1).float().cpu() for p in params])
    lo, hi = 2500, 7002  # most of the first parameter's chunks, two values of the second
    outer._load(lo, hi)
    after = torch.cat([p.data.reshape(-1).float().cpu() for p in params])
    want = before.clone()
    want[lo:hi] = shm[lo:hi].to(dtype).float()
    if not torch.equal(after, want):
        bad = (after != want).nonzero().reshape(-1)
        raise AssertionError("%s on %s: a part load changed the wrong values (first at %d)"
                             % (dtype, device, int(bad[0])))


def main():
    try:
        import torch
        import grove
    except ImportError as e:
        print("skipped: %s" % e)
        return 77
    grove.COPY_CHUNK = 1024  # parameters of 7000 values: 7 chunks; 3 values: 1
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            check(grove, torch, dtype, device)
            check_part(grove, torch, dtype, device)
            print("ok: %s on %s" % (dtype, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
