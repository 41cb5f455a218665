"""DeMo (decoupled momentum: Peng, Quesnelle, Kingma, arXiv 2411.19870), Grove's
``grove.demo(model, lr=1e-3, decay=0.999, topk=32, chunk=64)``: every step each member adds its
gradient to a momentum δ, sends the largest coefficients of δ's chunked DCT and removes what it
sent from δ; every member then steps by the sign of the group's mean of what was sent. The rule
is grove-node's optim/demo.hpp (docs/ALGORITHMS.md "DeMo"), here in PyTorch on the parameters'
own device, the messages exchanged with one all-gather a step.

Per tensor (viewed as rows × cols: a 1-D one as 1 × L, one of three or more dimensions as
shape[0] × the rest), blocks of h × w values, h and w the largest divisors of rows and cols not
above ``chunk``; ``topk`` coefficients a block (indices and values travel as float32).
"""

import math
import warnings

import torch

warnings.filterwarnings("ignore", message="scatter_reduce")  # (torch 1.13's "beta" notice)


def _side(s, c):
    return max(d for d in range(1, min(s, c) + 1) if s % d == 0)


def _dct(n, device):
    m = torch.zeros(n, n, dtype=torch.float64)
    for f in range(n):
        s = math.sqrt((1.0 if f == 0 else 2.0) / n)
        for t in range(n):
            m[f, t] = s * math.cos(math.pi * (2 * t + 1) * f / (2 * n))
    return m.float().to(device)


class _Blocks:
    def __init__(self, shape, topk, chunk, device):
        if len(shape) == 0:
            self.rows, self.cols = 1, 1
        elif len(shape) == 1:
            self.rows, self.cols = 1, shape[0]
        else:
            self.rows = shape[0]
            self.cols = 1
            for d in shape[1:]:
                self.cols *= d
        self.h, self.w = _side(self.rows, chunk), _side(self.cols, chunk)
        self.k = min(topk, self.h * self.w)
        self.mh, self.mw = _dct(self.h, device), _dct(self.w, device)
        self.nb = (self.rows // self.h) * (self.cols // self.w)

    def encode(self, x):  # values → (Y, X, h·w) coefficients
        b = x.reshape(self.rows // self.h, self.h, self.cols // self.w, self.w)
        c = torch.einsum("yixj,ai,bj->yxab", b, self.mh, self.mw)
        return c.reshape(c.shape[0], c.shape[1], self.h * self.w)

    def decode(self, c):  # (Y, X, h·w) → values (rows·cols)
        c = c.reshape(c.shape[0], c.shape[1], self.h, self.w)
        return torch.einsum("yxab,ai,bj->yixj", c, self.mh, self.mw).reshape(-1)

    def scatter_mean(self, idx, val):
        z = torch.zeros(self.rows // self.h, self.cols // self.w, self.h * self.w,
                        dtype=torch.float32, device=val.device)
        return z.scatter_reduce(-1, idx, val, reduce="mean", include_self=False)


class DeMo:
    """Call :meth:`step` once a step, after ``backward()``, instead of the optimiser's step.
    ``gather`` is the all-gather over the group (default: grove.all_gather on the node this
    process is attached to)."""

    def __init__(self, model, lr=1e-3, decay=0.999, topk=32, chunk=64, weight_decay=0.0,
                 gather=None):
        if not 0 <= decay < 1 or topk < 1 or not 1 <= chunk <= 256:
            raise ValueError("demo: 0 <= decay < 1, topk >= 1, chunk 1 to 256")
        self.lr, self.decay, self.weight_decay = lr, decay, weight_decay
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.blocks = [_Blocks(tuple(p.shape), topk, chunk, p.device) for p in self.params]
        self.deltas = [torch.zeros(p.numel(), dtype=torch.float32, device=p.device)
                       for p in self.params]
        self._gather = gather
        self.steps = 0
        self.last_size = 1  #: the group of the last step's exchange
        self.bytes_sent = 0  #: this member's message bytes over all steps

    def _all_gather(self, flat):
        if self._gather is not None:
            return self._gather(flat)
        from . import api
        return api.all_gather(flat)

    @torch.no_grad()
    def step(self, model=None, grads=None):
        """One DeMo step on the model's parameters. ``grads``: None (each parameter's
        ``.grad``), a list in ``model.parameters()`` order, or a dict name → gradient (Grove's
        form; names as ``model.named_parameters()`` gives them). Returns the size of the group
        that took the step."""
        gs = self._grads(model, grads)
        parts = []
        for p, b, d, g in zip(self.params, self.blocks, self.deltas, gs):
            d.mul_(self.decay).add_(g.reshape(-1).float(), alpha=self.lr)
            c = b.encode(d)
            idx = torch.topk(c.abs(), b.k, dim=-1, largest=True, sorted=False).indices
            val = torch.gather(c, -1, idx)
            d.sub_(b.decode(b.scatter_mean(idx, val)))
            parts += [idx.reshape(-1).float(), val.reshape(-1)]
        mine = torch.cat(parts)
        self.bytes_sent += mine.numel() * 4
        everyone = self._all_gather(mine.cpu()).to(mine.device)
        size = everyone.numel() // max(1, mine.numel())
        msgs = everyone.view(size, -1)
        at = 0
        for p, b in zip(self.params, self.blocks):
            n = b.nb * b.k
            shape = (b.rows // b.h, b.cols // b.w, b.k)
            idx = msgs[:, at:at + n].long().reshape(size, *shape)
            val = msgs[:, at + n:at + 2 * n].reshape(size, *shape)
            at += 2 * n
            # Members side by side along the block's coefficients: the mean per coefficient
            # over the members that sent it.
            g = b.decode(b.scatter_mean(idx.permute(1, 2, 0, 3).reshape(*shape[:2], -1),
                                        val.permute(1, 2, 0, 3).reshape(*shape[:2], -1)))
            if self.weight_decay:
                p.mul_(1 - self.lr * self.weight_decay)
            p.add_(torch.sign(g).view(p.shape).to(p.dtype), alpha=-self.lr)
        self.steps += 1
        self.last_size = size
        if self._gather is None:  # (on a node: in a per-step run this is the trainer's step)
            from . import api
            outer = api._current._outer if api._current is not None else None
            if outer is not None and outer.outer == "none":
                outer.step()
        return size

    def _grads(self, model, grads):
        if grads is None:
            out = []
            for p in self.params:
                if p.grad is None:
                    raise ValueError("demo: a parameter has no gradient (call backward() first)")
                out.append(p.grad)
            return out
        if isinstance(grads, dict):
            if model is None:
                raise ValueError("demo: gradients by name need the model")
            named = dict(model.named_parameters())
            ids = {id(p): name for name, p in named.items()}
            return [grads[ids[id(p)]] for p in self.params]
        grads = list(grads)
        if len(grads) != len(self.params):
            raise ValueError("demo: %d gradients for %d parameters" % (len(grads),
                                                                      len(self.params)))
        return grads
