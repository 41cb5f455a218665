"""Per-step collectives over the swarm, with Grove's names: ``grove.init()``, ``all_sum``,
``average_gradients``, ``all_gather``, ``barrier``, ``send``, ``recv``, ``grove.rank`` and
``grove.world_size``.

A swarm has no fixed ranks. Every call is numbered; the members that make call number k form its
group (the node's step group: a member that dies during a call is dropped and the others finish
it with identical results; a node that joins enters at a later call). Ranks order a call's group
by node id, so ``rank()`` and ``size()`` describe the group of this trainer's last call, and may
change from one call to the next. Before the first call they are 0 and 1.

The tensors cross between this process and its node through a second shared-memory segment (the
"collective segment", grown on demand): the input at its start, the result after it. Nothing is
pickled, and the socket carries only small messages. Each call has a deadline (``timeout``
seconds, else the node's: from the call's bytes and the rate earlier calls measured); a call
that fails or runs out of time raises :class:`CollectiveError`, and the next call starts afresh.

The trainer must have chosen its algorithm (``node.noloco(...)``, ``node.diloco(...)``, ...)
before its first collective: the node serves collectives between two ``step()`` calls.
"""

import mmap
import os
import sys

import numpy as np
import torch

from . import GroveError, NodeStopped, Refused

class CollectiveError(GroveError):
    """A collective could not complete: its group failed, or it ran past its deadline. The
    tensors passed in are unchanged; the next call starts afresh."""


class _Segment:
    """The node's collective segment as this process maps it."""

    def __init__(self):
        self.name = None
        self.nbytes = 0
        self._mm = None
        self.flat = None

    def map(self, name, nbytes):
        self.close()
        fd = os.open("/dev/shm/" + name.lstrip("/"), os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, nbytes) if nbytes > 0 else None
        finally:
            os.close(fd)
        self.name, self.nbytes = name, nbytes
        self.flat = (torch.from_numpy(np.frombuffer(self._mm, dtype=np.float32))
                     if self._mm is not None else torch.empty(0))

    def close(self):
        self.flat = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
        self._mm = None


class Collectives:
    """A node's collectives (``node.collectives``); the module-level functions use the node this
    process attached last."""

    def __init__(self, node):
        self._node = node
        self._seg = _Segment()
        self.call = 0  #: the number of the last call (the swarm's count)
        self.rank = 0
        self.size = 1
        #: The last call's group has a member this trainer's previous call did not (a joiner;
        #: for a joiner, its first call with others): time to align weights (sync_parameters).
        self.joined = False
        self._stepped_in_group = False  # a step taken with others: this trainer's weights count
        self.syncs = 0  #: sync_parameters calls completed

    # ---- Grove's calls ---------------------------------------------------------------------
    def all_sum(self, x, timeout=None):
        """The sum of ``x`` over the group (float32 on the wire, every member the same bits);
        a new tensor of ``x``'s shape, dtype and device."""
        return self._reduce([x], mean=False, wire="fp32", timeout=timeout)[0]

    def average_gradients(self, grads, wire="fp32", timeout=None):
        """The mean over the group of each tensor in ``grads``: a tensor, a list or tuple, a
        (nested) dict of tensors, or a ``torch.nn.Module`` (the mean of each parameter's
        ``.grad``, written back into it). Returns the same structure with new tensors (the
        module itself for a module). ``wire="fp16"`` halves the bytes (the sum is still taken
        in float32). Entries that are not tensors pass through unchanged; all tensors travel as
        one call."""
        if isinstance(grads, torch.nn.Module):
            ps = [p for p in grads.parameters() if p.grad is not None]
            self._reduce([p.grad for p in ps], mean=True, wire=wire, timeout=timeout,
                         into=[p.grad for p in ps])
            if self.joined:  # someone new: everyone takes the same weights first
                self.sync_parameters(grads, timeout=timeout)
            self._count_step()
            return grads
        leaves = []
        _flatten(grads, leaves)
        out = iter(self._reduce(leaves, mean=True, wire=wire, timeout=timeout))
        self._count_step()
        return _rebuild(grads, out)

    def _count_step(self):
        """In a per-step run a call of average_gradients is the trainer's step: the node counts
        it and takes what grove.report() gave (status, metrics)."""
        if self.size > 1:
            self._stepped_in_group = True
        outer = self._node._outer
        if outer is not None and outer.outer == "none":
            outer.step()

    def sync_parameters(self, model, fresh=None, timeout=None):
        """Every member of the group ends with the same parameters: the mean of those of the
        members that have trained together (a trainer that has not yet stepped in a group — it
        just joined, or restarted — contributes nothing and takes theirs), or of everyone's when
        none has. A collective: every member calls it at the same point (average_gradients on a
        module does, after a call whose group gained a member: ``joined``). ``fresh``
        overrides whether this trainer counts as new."""
        if fresh is None:
            fresh = not self._stepped_in_group
        ps = [p for p in model.parameters()]
        one = torch.ones(1)
        w = 0.0 if fresh else 1.0
        out = self._reduce(ps + [one], mean=False, wire="fp32", timeout=timeout, scale=w)
        count = out[-1].item()
        if count == 0:  # nobody has trained: the mean of everyone's
            out = self._reduce(ps + [one], mean=False, wire="fp32", timeout=timeout)
            count = out[-1].item()
        with torch.no_grad():
            for p, s in zip(ps, out[:-1]):
                p.copy_(s / count)
        self.syncs += 1
        return int(count)

    def all_gather(self, x, timeout=None):
        """Every member's ``x``, flattened and concatenated in rank order: a 1-D tensor of
        ``size() * x.numel()`` values of ``x``'s dtype, on its device (Grove's layout). All
        members must pass the same number of values."""
        t = _check(x)
        n = t.numel()
        done = self._run("all_gather", [t], guess=n * max(2, self.size))
        flat = self._seg.flat[done["at"]:done["at"] + done["n"]]
        return _copy_of(flat, t.dtype, t.device)

    def send(self, x, dst, timeout=None):
        """Sends ``x`` (as float32) to the member of rank ``dst`` in the last collective's group;
        returns once that member has received it whole (its :meth:`recv` with the same number
        of values). Ranks come from the last collective: make one (e.g. :meth:`barrier`) first."""
        self._run("send", [_check(x)], guess=0, peer=int(dst), timeout=timeout)

    def recv(self, shape, dtype=torch.float32, src=0, timeout=None, device=None):
        """Receives a tensor of ``shape`` from the member of rank ``src`` (its :meth:`send`);
        returned with ``dtype`` on ``device`` (the CPU by default). It travels as float32:
        integers above 2^24 lose precision, as in Grove."""
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list, torch.Size))
                                       else (shape,)))
        n = 1
        for d in shape:
            n *= d
        done = self._run("recv", [], guess=0, peer=int(src), n=n, timeout=timeout)
        flat = self._seg.flat[done["at"]:done["at"] + n]
        return _copy_of(flat.view(shape), dtype, device or "cpu")

    def recv_like(self, x, src, timeout=None):
        """:meth:`recv` of ``x``'s shape and dtype, onto its device."""
        return self.recv(x.shape, x.dtype, src, timeout=timeout, device=x.device)

    def barrier(self, min_size=0, timeout=None):
        """Returns when the group's members have all reached it; with ``min_size``, once the
        group has at least that many members (it repeats until then, or until its deadline)."""
        self._run("barrier", [], guess=0, min_size=int(min_size), timeout=timeout)

    # ---- the call ----------------------------------------------------------------------------
    def _reduce(self, tensors, mean, wire, timeout, scale=1.0, into=None):
        """The sum or mean of `tensors` (each scaled by `scale` first); new tensors, or written
        into the tensors of `into` when given."""
        ts = [_check(t) for t in tensors]
        n = sum(t.numel() for t in ts)
        done = self._run("all_reduce", ts, guess=n, mean=mean, wire=wire, timeout=timeout,
                         scale=scale)
        out, at = [], done["at"]
        with torch.no_grad():
            for k, t in enumerate(ts):
                shared = self._seg.flat[at:at + t.numel()].view(t.shape)
                if into is not None:
                    into[k].copy_(shared)
                    out.append(into[k])
                else:
                    out.append(_copy_of(shared, t.dtype, t.device))
                at += t.numel()
        return out

    def _run(self, kind, tensors, guess, mean=False, wire="fp32", min_size=0, timeout=None,
             peer=0, n=None, scale=1.0):
        node = self._node
        if node._outer is None:
            raise GroveError("choose the algorithm (node.noloco(...), node.diloco(...), ...) "
                             "before the first collective: the node serves them between steps")
        if n is None:
            n = sum(t.numel() for t in tensors)
        need = 4 * (n + guess)
        if self._seg.flat is None or self._seg.nbytes < need:
            # A quarter more than asked (a group that grows by a member does not regrow it), in
            # whole pages.
            node._send({"op": "buffer", "bytes": (need + need // 4 + 4095) // 4096 * 4096})
            self._await(want="segment")
        if self._seg.nbytes < 4 * n:
            raise CollectiveError("the node could not make a collective segment of %d bytes"
                                  % (4 * n))
        at = 0
        with torch.no_grad():
            for t in tensors:
                part = self._seg.flat[at:at + t.numel()]
                part.copy_(t.detach().reshape(-1))
                if scale != 1.0:
                    part.mul_(scale)
                at += t.numel()
        msg = {"op": "collective", "kind": kind, "mean": bool(mean), "wire": wire, "n": n,
               "min_size": min_size, "peer": peer}
        if timeout is not None:
            msg["timeout"] = float(timeout)
        node._send(msg)
        done = self._await(want="done")
        self.call = int(done.get("call", 0))
        if not done.get("ok"):
            raise CollectiveError("%s failed: %s" % (kind, done.get("why") or "no reason given"))
        self.rank = int(done.get("rank", 0))
        self.size = int(done.get("size", 1))
        self.joined = bool(done.get("joined", False))
        pkg = sys.modules[__package__]  # Grove's module attributes grove.rank, grove.world_size
        pkg.rank, pkg.world_size = self.rank, self.size
        end = int(done.get("at", 0)) + int(done.get("n", 0))
        if end * 4 > self._seg.nbytes:
            raise GroveError("the node's result lies outside the collective segment")
        return done

    def _await(self, want):
        """Reads the node's messages until `want` ("segment" or "done"), mapping new segments."""
        node = self._node
        while True:
            msg = node._recv()
            op = msg.get("op")
            if op == "segment":
                name, nbytes = msg.get("shm") or "", int(msg.get("bytes", 0))
                if name and (name != self._seg.name or nbytes != self._seg.nbytes):
                    self._seg.map(name, nbytes)
                if want == "segment":
                    return msg
            elif op == "done":
                return msg
            elif op == "bye":
                node._ended = True
                raise NodeStopped(msg.get("why", "the node left"))
            elif op == "refused":
                raise Refused(msg.get("why", "refused"))
            else:
                raise GroveError("unexpected message from the node during a collective: %r"
                                 % (op,))

    def close(self):
        self._seg.close()


def _check(t):
    if not isinstance(t, torch.Tensor):
        raise TypeError("a collective takes tensors, not %s" % type(t).__name__)
    if t.is_complex():
        raise TypeError("complex tensors are not supported by collectives")
    return t


def _copy_of(shared, dtype, device):
    """A tensor of its own (the segment is reused by the next call)."""
    out = torch.empty(shared.shape, dtype=dtype, device=device)
    out.copy_(shared)
    return out


def _flatten(obj, leaves):
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _flatten(v, leaves)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _flatten(v, leaves)


def _rebuild(obj, it):
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, dict):
        return type(obj)((k, _rebuild(v, it)) for k, v in obj.items())
    if isinstance(obj, tuple):
        return type(obj)(*(_rebuild(v, it) for v in obj)) if hasattr(obj, "_fields") \
            else tuple(_rebuild(v, it) for v in obj)
    if isinstance(obj, list):
        return [_rebuild(v, it) for v in obj]
    return obj
