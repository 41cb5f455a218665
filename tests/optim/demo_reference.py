#!/usr/bin/python3
"""DeMo's step in plain PyTorch, for tests/optim/demo_test.cpp: the rule as the authors' code
(bloc97/DeMo) applies it, written here from docs/ALGORITHMS.md with torch.einsum, torch.topk and
scatter_reduce(mean), so that the C++ loops are checked against independent code.

Input (little-endian): int32 steps, members, tensors, topk, chunk; float32 lr, decay, wd; per
tensor int32 ndim and ndim int32 dims; then the tensors' initial values (concatenated), then per
step and member the gradients of every tensor (concatenated).
Output, per step: p (every tensor), member 0's delta, G (the pre-sign update), float32.
A tensor of one dimension is transformed in chunks of its length; of two as it is; of three or
more as shape[0] x the rest; a scalar as 1 x 1 (grove-node's extension of the reference).
"""
import math
import struct
import sys
import warnings

import numpy as np
import torch


def chunk_of(s, c):
    return max(d for d in range(1, min(s, c) + 1) if s % d == 0)


def dct_matrix(n):
    m = torch.zeros(n, n, dtype=torch.float64)
    for f in range(n):
        s = math.sqrt((1.0 if f == 0 else 2.0) / n)
        for t in range(n):
            m[f, t] = s * math.cos(math.pi * (2 * t + 1) * f / (2 * n))
    return m.float()


class Tensor:
    def __init__(self, shape, topk, chunk):
        if len(shape) == 0:
            self.rows, self.cols = 1, 1
        elif len(shape) == 1:
            self.rows, self.cols = 1, shape[0]
        else:
            self.rows, self.cols = shape[0], int(np.prod(shape[1:]))
        self.h, self.w = chunk_of(self.rows, chunk), chunk_of(self.cols, chunk)
        self.k = min(topk, self.h * self.w)
        self.mh, self.mw = dct_matrix(self.h), dct_matrix(self.w)
        self.n = self.rows * self.cols

    def encode(self, x):  # (rows*cols,) -> (Y, X, h*w)
        b = x.view(self.rows // self.h, self.h, self.cols // self.w, self.w)
        c = torch.einsum("yixj,ai,bj->yxab", b, self.mh, self.mw)
        return c.reshape(c.shape[0], c.shape[1], self.h * self.w)

    def decode(self, c):  # (Y, X, h*w) -> (rows*cols,)
        c = c.view(c.shape[0], c.shape[1], self.h, self.w)
        x = torch.einsum("yxab,ai,bj->yixj", c, self.mh, self.mw)
        return x.reshape(-1)

    def scatter_mean(self, idx, val):
        shape = (self.rows // self.h, self.cols // self.w, self.h * self.w)
        z = torch.zeros(shape, dtype=torch.float32)
        return z.scatter_reduce(-1, idx, val, reduce="mean", include_self=False)


def step(ts, p_all, deltas, grads, lr, decay, wd):
    """One DeMo step of every member on the flat parameters p_all (the tensors `ts` one after
    the other), in place: deltas[m] and grads[m] are member m's momentum and gradient. Returns
    G, the pre-sign update."""
    g_all = torch.zeros(p_all.numel())
    lo = 0
    for t in ts:
        sl = slice(lo, lo + t.n)
        idxs, vals = [], []
        for m in range(len(deltas)):
            d = deltas[m][sl]
            d.mul_(decay).add_(grads[m][sl], alpha=lr)
            c = t.encode(d)
            idx = torch.topk(c.abs(), t.k, dim=-1, largest=True, sorted=False).indices
            val = torch.gather(c, -1, idx)
            d.sub_(t.decode(t.scatter_mean(idx, val)))
            idxs.append(idx)
            vals.append(val)
        g = t.decode(t.scatter_mean(torch.cat(idxs, -1), torch.cat(vals, -1)))
        p = p_all[sl]
        if wd != 0:
            p.mul_(1 - lr * wd)
        p.add_(torch.sign(g), alpha=-lr)
        g_all[sl] = g
        lo += t.n
    return g_all


def main(inp, out):
    warnings.filterwarnings("ignore", message="scatter_reduce")
    raw = open(inp, "rb").read()
    steps, members, ntensors, topk, chunk = struct.unpack_from("<5i", raw, 0)
    lr, decay, wd = struct.unpack_from("<3f", raw, 20)
    at = 32
    shapes = []
    for _ in range(ntensors):
        (nd,) = struct.unpack_from("<i", raw, at)
        shapes.append(list(struct.unpack_from("<%di" % nd, raw, at + 4)))
        at += 4 + 4 * nd
    ts = [Tensor(s, topk, chunk) for s in shapes]
    total = sum(t.n for t in ts)
    data = torch.from_numpy(np.frombuffer(raw, dtype="<f4", offset=at).copy())
    p_all = data[:total].clone()
    grads = data[total:].view(steps, members, total)
    deltas = [torch.zeros(total) for _ in range(members)]
    results = []
    for s in range(steps):
        g_all = step(ts, p_all, deltas, grads[s], lr, decay, wd)
        results += [p_all.clone(), deltas[0].clone(), g_all]
    open(out, "wb").write(torch.cat(results).numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
