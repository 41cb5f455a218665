"""Drive grove-node from your own PyTorch training script.

grove-node runs the swarm (membership, matchmaking, NoLoCo pair averaging or DiLoCo all-reduce,
state sync, checkpoints); your script keeps its model, data, optimiser and loop::

    import grove

    node = grove.attach()                      # the local grove-node (--workload external)
    node.keep(optimizer=opt)                   # saved with the node's checkpoints, restored
    outer = node.noloco(model, inner_steps=50)  # or node.diloco(model, inner_steps=500, ...)
    for batch in loader:
        loss = loss_fn(model(batch)); loss.backward(); opt.step(); opt.zero_grad()
        outer.step()                           # the node's outer round every inner_steps calls
        node.report(loss=loss.item())          # shows in `grove-node status` and the metrics

Start the node first (``grove-node --bootstrap --workload external`` for a new swarm, or
the join command it prints, ``grove-node --peer HOST:PORT --swarm-key KEY``, to join one), or let :func:`attach` start it with ``start=[...]``.

How it works: the script and its node talk over a Unix socket (small msgpack messages) and share
the parameters through a shared-memory segment of the node, so a large model is never copied
through the socket. CPU float32 parameters are re-pointed into that segment (no copy at all);
others (GPU, half precision) are copied in and out of it when the node asks, a bounded chunk at
a time (:data:`COPY_CHUNK` values: a GPU's values pass through two pinned staging buffers of that
size, converted on the device, one chunk crossing the bus while the host copies the other; no
model-sized copy exists on the host beyond the segment). The node never
executes anything the script sends. Uses only Debian's python3-torch, python3-numpy and
python3-msgpack.
"""

import mmap
import os
import socket as _socket
import struct
import subprocess
import sys
import time

import msgpack
import numpy as np
import torch

__all__ = ["attach", "init", "Node", "Outer", "GroveError", "Refused", "NodeGone", "NodeStopped",
           "CollectiveError", "World", "all_sum", "average_gradients", "all_gather", "barrier",
           "send", "recv", "recv_like", "is_available", "rank", "world_size", "default_socket",
           "diloco", "sparseloco", "noloco", "demo", "report", "sync_parameters"]

PROTOCOL = 1
#: Values per chunk when parameters that cannot live in the shared memory (GPU, not float32) are
#: copied in and out of it: bounds the host staging buffer (pinned, for a GPU) and the temporary
#: a dtype conversion makes (16 Mi values: 64 MiB of float32).
COPY_CHUNK = 1 << 24
_MAX_FRAME = 8 << 20


class GroveError(RuntimeError):
    """A problem with the node this script is attached to."""


class Refused(GroveError):
    """The node refused this trainer (another model than the run's, another trainer attached)."""


class NodeGone(GroveError):
    """The node's process went away (it crashed or was killed); restart it and attach again."""


class NodeStopped(GroveError):
    """The node ended its run or was stopped; the training loop should end."""


def default_socket(state_dir=None):
    """The socket of the node using ``state_dir`` (grove-node's default state directory when None:
    $XDG_DATA_HOME/grove-node or ~/.local/share/grove-node)."""
    if state_dir is None:
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                               "share")
        state_dir = os.path.join(base, "grove-node")
    return os.path.join(state_dir, "trainer.sock")


def attach(socket=None, state_dir=None, start=None, node_binary=None, timeout=60.0):
    """Attach to the local grove-node and return a :class:`Node`.

    socket: the node's trainer socket (default: ``default_socket(state_dir)``, or $GROVE_SOCKET).
    start: grove-node arguments (e.g. ``["--peer", "203.0.113.5:7400", "--swarm-key", key]``
        or ``["--bootstrap", "--workload", "external"]``); when no node answers at the socket,
        one is started with them (and ``--state-dir``/``--trainer-socket`` set to match), and
        stopped when the returned node is closed.
    node_binary: the grove-node program (default: $GROVE_NODE, else ``grove-node`` on PATH).
    timeout: seconds to wait for the socket to answer.
    """
    path = socket or os.environ.get("GROVE_SOCKET") or default_socket(state_dir)
    process = None
    sock = _connect(path)
    if sock is None and start is not None:
        binary = node_binary or os.environ.get("GROVE_NODE") or "grove-node"
        args = [binary] + list(start) + ["--trainer-socket", path, "--no-progress"]
        if state_dir is not None:
            args += ["--state-dir", state_dir]
        process = subprocess.Popen(args)
    deadline = time.monotonic() + timeout
    while sock is None:
        if process is not None and process.poll() is not None:
            raise NodeGone("grove-node exited with status %d before it answered at %s"
                           % (process.returncode, path))
        if time.monotonic() > deadline:
            if process is not None:
                process.terminate()
            raise GroveError("no grove-node answers at %s (start one with --workload external, "
                             "or pass start=[...])" % path)
        time.sleep(0.1)
        sock = _connect(path)
    node = Node(sock, path, process)
    _set_current(node)
    return node


def init(model=None, socket=None, state_dir=None, start=None, node_binary=None, timeout=60.0):
    """Grove's entry point: the :class:`World` of the node this process is attached to,
    attaching first (as :func:`attach`, same arguments) when it is not. With ``model`` (and no
    algorithm chosen yet) the run is a per-step one (:meth:`Node.per_step`), as Grove's data
    parallel scripts are; else choose the algorithm (``grove.diloco(model, ...)``) before the
    first collective::

        world = grove.init(model)
        for batch in loader:
            loss_fn(model(batch)).backward()
            grove.average_gradients(model)        # every step, over the swarm's group
            opt.step(); opt.zero_grad()
    """
    from . import api
    node = api._current
    if node is None or node._sock is None:
        node = attach(socket=socket, state_dir=state_dir, start=start, node_binary=node_binary,
                      timeout=timeout)
    if model is not None and node._outer is None:
        node.per_step(model)
    return World(node)


def _connect(path):
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(path)
        return s
    except OSError:
        s.close()
        return None


class Node:
    """A grove-node this script is attached to. Choose the outer algorithm with
    :meth:`noloco` or :meth:`diloco` (once), call the returned :class:`Outer`'s ``step()`` after
    every optimiser step, and :meth:`report` what you want to see in status and metrics."""

    def __init__(self, sock, path, process=None):
        self._sock = sock
        self._path = path
        self._process = process
        self._ended = False  # the node said it ended its run (it is leaving by itself)
        self._outer = None
        self._loss = None
        self._eval_loss = None
        self._tokens = 0
        self._kept = {}  # name → an object with state_dict() / load_state_dict()
        self._state_file = None  # where the node has the trainer keep its state
        self._collectives = None
        self.run = None  #: the run's name, once attached
        #: After attaching: None, or what was restored from the trainer's saved state
        #: (``{"steps": N, "kept": [names]}``, N the step() calls made when it was saved).
        self.restored = None

    @property
    def collectives(self):
        """This node's per-step collectives (:class:`grove.collective.Collectives`)."""
        if self._collectives is None:
            self._collectives = Collectives(self)
        return self._collectives

    # ---- the algorithm -------------------------------------------------------------------
    def noloco(self, model, inner_steps=50, alpha=None, beta=None, gamma=None, fragments=None,
               group=None, lookahead=None, rule=None, warmup=None):
        """NoLoCo: random pairwise averaging with modified Nesterov momentum, no all-reduce.

        The defaults are the node's: grove-node's rule (``rule="nesterov"``: each member takes
        DiLoCo's Nesterov step on its own pseudo-gradient without applying it, and the pair
        averages the results and the momenta; ``alpha=0.9``, ``beta=0.7``, ``warmup=10`` rounds
        ramping from plain averaging; ``gamma`` is the paper rule's only). ``rule="paper"``
        with ``alpha=0.5, beta=0.7, gamma=0.7, warmup=0`` is the NoLoCo paper's.

        ``group=G``: average in random groups of G (default 2, pairs). ``lookahead=L``: each
        inner phase starts from the slow weights plus L times the outer momentum (default 0).

        ``fragments=F`` (dividing ``inner_steps``): compressed pairs — a round every
        ``inner_steps / F`` steps, in which a pair averages one F-th of the parameters (drawn
        at random, the same for both) and the rest takes the local-only step: 1/F of the bytes.

        The numbers are used when this trainer creates the run (the node was started with
        --bootstrap); a node that joins an existing run checks them against the run's."""
        if rule not in (None, "paper", "nesterov"):
            raise ValueError("noloco: rule is 'paper' or 'nesterov'")
        fields = {"outer": "noloco", "inner_steps": inner_steps}
        for key, v in (("noloco_alpha", alpha), ("noloco_beta", beta), ("noloco_gamma", gamma),
                       ("noloco_warmup", warmup)):
            if v is not None:
                fields[key] = v
        if rule is not None:
            fields["noloco_nesterov"] = 1 if rule == "nesterov" else 0
        if fragments is not None:
            fields["fragments"] = fragments
        if group is not None:
            fields["noloco_group"] = group
        if lookahead is not None:
            fields["noloco_lookahead"] = lookahead
        return self._hello(model, fields)

    def diloco(self, model, inner_steps=500, outer_lr=0.7, momentum=0.9, codec=None,
               fragments=None, warmup=None, overlap=None):
        """DiLoCo: all-reduce of the outer gradients within groups, Nesterov outer step.

        ``warmup=W``: over the first W rounds the outer step ramps from plain averaging (lr 1, no
        momentum) to ``outer_lr`` and ``momentum`` (default: the node's, 10 rounds; 0: the DiLoCo
        paper's step from the first round, which overshoots on short runs from scratch).

        ``codec="e3m0"``: the all-reduce carries 4-bit partial sums, each member keeping what its
        encodings left out for its next round (error feedback): about 4x fewer bytes than fp16
        at any group size.
        ``fragments=F`` (dividing ``inner_steps``): streaming fragments — a round every
        ``inner_steps / F`` steps synchronises one F-th of the parameters in turn."""
        fields = {"outer": "diloco", "inner_steps": inner_steps, "outer_lr": outer_lr,
                  "outer_momentum": momentum}
        if codec is not None:
            fields["codec"] = codec
        if fragments is not None:
            fields["fragments"] = fragments
        if warmup is not None:
            fields["outer_warmup"] = warmup
        if overlap is not None:
            fields["overlap"] = 1 if overlap else 0
        return self._hello(model, fields)

    def sparseloco(self, model, inner_steps=30, outer_lr=1.0, topk=64, chunk=4096, bits=32,
                   error_decay=0.95, momentum=0.0, fragments=None, overlap=None):
        """SparseLoCo: each member of a group sends the ``topk`` largest values of each ``chunk``
        of an error buffer (its outer gradients not sent yet), in 32 or 2 ``bits``; the group
        steps with their mean. Grove's defaults: H 30, lr 1.0, top-64 of 4096, decay 0.95.
        ``fragments``: as for :meth:`diloco`."""
        fields = {"outer": "sparseloco", "inner_steps": inner_steps,
                  "outer_lr": outer_lr, "outer_momentum": momentum,
                  "topk": topk, "topk_chunk": chunk, "topk_bits": bits,
                  "error_decay": error_decay}
        if fragments is not None:
            fields["fragments"] = fragments
        if overlap is not None:
            fields["overlap"] = 1 if overlap else 0
        return self._hello(model, fields)

    def per_step(self, model):
        """A per-step run (``outer none``): no outer rounds; the trainers keep in step with
        per-step collectives (``grove.average_gradients`` every step, DeMo's exchange). Fixes
        the run's model (and that it is per-step) when this trainer starts the run. Returns the
        :class:`Outer`: call its ``step()`` once a step (it reports the loss; the node never
        changes the weights)."""
        return self._hello(model, {"outer": "none"})

    def keep(self, **objects):
        """Make objects part of this trainer's state: the inner optimiser, a learning-rate
        scheduler, the data position — anything with ``state_dict()`` and ``load_state_dict()``
        whose state ``torch.save`` can write. After each of its checkpoints the node asks the
        trainer to save them (with the count of ``step()`` calls) in a file of its state
        directory; a trainer that attaches later to that node (after the trainer crashed, or the
        node was restarted on its state directory) gets them back when it chooses its
        algorithm. Call before :meth:`noloco` / :meth:`diloco`::

            node.keep(optimizer=opt, scheduler=sched, data=position)
        """
        if self._outer is not None:
            raise GroveError("keep() goes before noloco() or diloco()")
        for name, obj in objects.items():
            if not (callable(getattr(obj, "state_dict", None))
                    and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError("%s: keep() needs an object with state_dict() and "
                                "load_state_dict()" % name)
            self._kept[name] = obj

    def report(self, loss=None, eval_loss=None, tokens=None):
        """Numbers sent with the next step: the training loss (status and metrics show it), an
        evaluation loss, tokens (or samples) of this step."""
        if loss is not None:
            self._loss = float(loss)
        if eval_loss is not None:
            self._eval_loss = float(eval_loss)
        if tokens is not None:
            self._tokens = int(tokens)

    def close(self):
        """Detach (the node stays in the swarm and waits for a trainer); stops a node that
        :func:`attach` started."""
        if self._outer is not None:
            self._outer._release()
        if self._collectives is not None:
            self._collectives.close()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._process is not None and self._process.poll() is None:
            if self._ended:  # it is leaving (last round, checkpoint): let it finish
                try:
                    self._process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    pass
            if self._process.poll() is None:
                self._process.terminate()
                self._process.wait()

    @property
    def process(self):
        """The grove-node process that :func:`attach` started (a ``subprocess.Popen``; its
        ``returncode`` once :meth:`close` stopped it), or None when the node was running."""
        return self._process

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the link ------------------------------------------------------------------------
    def _hello(self, model, algorithm):
        if self._outer is not None:
            raise GroveError("an algorithm was already chosen for this node")
        params = [(name, p) for name, p in model.named_parameters()]
        if not params:
            raise GroveError("the model has no parameters")
        tensors = [[name, list(p.shape), str(p.dtype).replace("torch.", "")]
                   for name, p in params]
        hello = {"op": "hello", "version": PROTOCOL, "tensors": tensors, "pid": os.getpid()}
        hello.update(algorithm)
        self._send(hello)
        msg = self._recv()
        if msg.get("op") == "refused":
            raise Refused(msg.get("why", "refused"))
        if msg.get("op") != "welcome":
            raise GroveError("unexpected message from the node: %r" % (msg.get("op"),))
        self.run = msg.get("run")
        self._outer = Outer(self, params, msg)
        self._state_file = msg.get("state_file") or None
        self._restore()
        self._outer._serve()  # the node hands over the swarm's weights, or takes ours
        return self._outer

    # ---- the trainer's own state -----------------------------------------------------------
    def _restore(self):
        path = self._state_file
        if not path or not os.path.exists(path):
            return
        # The file is this trainer's own (written by _save, mode 0600, in the node's state
        # directory): unpickled in full only when nobody else could have written it, as ssh
        # treats its keys. (Debian's torch reads optimiser states, which hold Python floats, only
        # that way: its weights_only reader refuses them.)
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            sys.stderr.write("grove: %s is not this user's alone (owner or mode): not restored\n"
                             % path)
            return
        try:
            saved = torch.load(path, map_location="cpu")
        except Exception as e:  # a cut or foreign file: start afresh, and say so
            sys.stderr.write("grove: cannot read the trainer state in %s (%s): not restored\n"
                             % (path, e))
            return
        if not isinstance(saved, dict) or saved.get("version") != 1 or \
                saved.get("run") != self.run:
            return  # another run's (a state directory used again): not ours
        objects = saved.get("objects") or {}
        for name, obj in self._kept.items():
            if name in objects:
                obj.load_state_dict(objects[name])
        self._outer.steps = int(saved.get("steps", 0))
        self.restored = {"steps": self._outer.steps,
                         "kept": sorted(n for n in self._kept if n in objects)}
        sys.stderr.write("grove: restored %s from %s (saved after %d steps)\n"
                         % (", ".join(self.restored["kept"]) or "the step count", path,
                            self._outer.steps))

    def _save(self):
        """Saves the kept objects where the node said; returns "" or why it could not."""
        path = self._state_file
        if not path:
            return "the node named no file for the trainer's state"
        tmp = path + ".tmp"
        try:
            state = {"version": 1, "run": self.run, "steps": self._outer.steps,
                     "objects": {n: o.state_dict() for n, o in self._kept.items()}}
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # whole or not at all
            dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            return ""
        except Exception as e:
            return "%s: %s" % (type(e).__name__, e)

    def _send(self, obj):
        body = msgpack.packb(obj, use_bin_type=True)
        try:
            self._sock.sendall(struct.pack(">I", len(body)) + body)
        except OSError as e:
            raise NodeGone("the grove-node at %s has gone away (%s)" % (self._path, e)) from None

    def _recv(self):
        head = self._read(4)
        (n,) = struct.unpack(">I", head)
        if n > _MAX_FRAME:
            raise GroveError("the node sent a message of %d bytes" % n)
        msg = msgpack.unpackb(self._read(n), raw=False, max_str_len=1 << 16, max_bin_len=0,
                              max_array_len=64, max_map_len=16, max_ext_len=0)
        if not isinstance(msg, dict):
            raise GroveError("the node sent something other than a message")
        return msg

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            try:
                chunk = self._sock.recv(n - len(buf))
            except OSError as e:
                raise NodeGone("the grove-node at %s has gone away (%s)" % (self._path, e)) from None
            if not chunk:
                raise NodeGone("the grove-node at %s has gone away (connection closed); restart "
                               "it and attach again" % self._path)
            buf += chunk
        return buf


class Outer:
    """The outer optimiser as the training loop sees it: call :meth:`step` once after every
    inner optimiser step. Every ``inner_steps`` calls (``inner_steps / fragments`` with streaming
    fragments) the node runs an outer round; without the
    node's --overlap the call returns when the round has ended (the model then holds the new
    weights), with it at once (the new weights are mixed in at a later step)."""

    def __init__(self, node, params, welcome):
        self._node = node
        self.run = welcome.get("run")
        self.outer = welcome.get("outer")
        self.inner_steps = welcome.get("inner_steps")
        #: Streaming fragments: a round every inner_steps / fragments calls of step().
        self.fragments = welcome.get("fragments") or 1
        nbytes = int(welcome["bytes"])
        total = sum(p.numel() for _, p in params)
        if nbytes != 4 * total:
            raise GroveError("the node's shared memory holds %d bytes, the model needs %d"
                             % (nbytes, 4 * total))
        fd = os.open("/dev/shm/" + welcome["shm"].lstrip("/"), os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        flat = torch.from_numpy(np.frombuffer(self._mm, dtype=np.float32, count=total))
        self._slots = []  # (parameter, its view in shared memory, zero-copy)
        self._staging = None  # two pinned float32 chunks for GPU parameters (made when needed)
        offset = 0
        self._offsets = []  # where each parameter starts in the flat θ
        for _, p in params:
            view = flat[offset:offset + p.numel()].view(p.shape)
            self._offsets.append(offset)
            offset += p.numel()
            zero_copy = p.device.type == "cpu" and p.dtype == torch.float32
            self._slots.append([p, view, zero_copy, False])  # last: re-pointed already
        self.steps = 0

    def step(self, model=None):
        """One inner step done: tell the node, then do what it asks (store or load the weights)
        until it says go on. Returns True when this call ended an inner phase (the node ran an
        outer round: Grove's ``step(model)`` returns True at a sync; ``model`` is accepted for
        Grove's signature and not needed: the node has the model since :meth:`Node.diloco`).
        Raises NodeStopped when the node has ended its run, NodeGone when it died."""
        n = self._node
        msg = {"op": "step", "loss": n._loss, "tokens": n._tokens, "eval_loss": n._eval_loss}
        n._eval_loss = None
        n._send(msg)
        self.steps += 1
        self._serve()
        if self.outer == "none":
            return False  # (a per-step run has no rounds)
        phase = max(1, int(self.inner_steps or 1) // max(1, int(self.fragments or 1)))
        return self.steps % phase == 0

    @property
    def inner_step(self):
        """Grove's name: the step() calls made (in this run, restored ones included)."""
        return self.steps

    @property
    def outer_step(self):
        """Grove's name: the inner phases ended (outer rounds this trainer took part in or
        skipped alone)."""
        phase = max(1, int(self.inner_steps or 1) // max(1, int(self.fragments or 1)))
        return self.steps // phase

    def _serve(self):
        n = self._node
        while True:
            msg = n._recv()
            op = msg.get("op")
            if op == "store":
                self._store()
                n._send({"op": "stored"})
            elif op == "save":
                n._send({"op": "saved", "why": n._save()})
            elif op == "go":
                if msg.get("load"):
                    self._load(msg.get("lo", 0), msg.get("hi"))
                else:
                    self._adopt()
                return
            elif op == "bye":
                n._ended = True
                raise NodeStopped(msg.get("why", "the node left"))
            elif op == "refused":
                raise Refused(msg.get("why", "refused"))
            else:
                raise GroveError("unexpected message from the node: %r" % (op,))

    def _chunks(self, p, view, lo=0, hi=None):
        """(parameter part, shared-memory part) per chunk of a parameter's values [lo, hi) (all
        of them by default)."""
        src = p.data.reshape(-1)
        dst = view.reshape(-1)
        if lo or hi is not None:
            src = src[lo:hi]
            dst = dst[lo:hi]
        for i in range(0, dst.numel(), COPY_CHUNK):
            n = min(COPY_CHUNK, dst.numel() - i)
            yield src[i:i + n], dst[i:i + n]

    def _buffers(self, n):
        """Two pinned float32 staging buffers of up to COPY_CHUNK values (a GPU's copies
        alternate between them: one crosses the bus while the host copies the other)."""
        n = min(COPY_CHUNK, max(1, n))
        if self._staging is None or self._staging[0].numel() < n:
            pin = torch.cuda.is_available()
            self._staging = [torch.empty(n, dtype=torch.float32, pin_memory=pin)
                             for _ in range(2)]
        return self._staging

    def _copy_in(self, p, view):  # shared memory := the parameter, chunk by chunk
        if p.device.type == "cpu":
            for part, shared in self._chunks(p, view):
                shared.copy_(part)  # (a CPU dtype conversion of one chunk)
            return
        # A GPU: each chunk converted to float32 on the device, copied to a pinned buffer
        # without waiting, and copied on into shared memory by the host once it has arrived —
        # while the next chunk crosses the bus into the other buffer.
        bufs = self._buffers(view.numel())
        pending = [None, None]  # per buffer: (its copy's event, shared part, staged part)

        def flush(b):
            if pending[b] is not None:
                event, shared, staged = pending[b]
                event.synchronize()
                shared.copy_(staged)
                pending[b] = None

        for k, (part, shared) in enumerate(self._chunks(p, view)):
            b = k % 2
            flush(b)
            staged = bufs[b][:part.numel()]
            staged.copy_(part if part.dtype == torch.float32 else part.float(), non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            pending[b] = (event, shared, staged)
        flush(0)
        flush(1)

    def _copy_out(self, p, view, lo=0, hi=None):  # the parameter := shared memory, by chunks
        if not p.data.is_contiguous():  # (reshape would copy: write through the parameter)
            p.data.copy_(view)
            return
        if p.device.type == "cpu":
            for part, shared in self._chunks(p, view, lo, hi):
                part.copy_(shared)
            return
        # A GPU: the host copies a chunk into one pinned buffer while the previous one crosses
        # the bus from the other; each is converted to the parameter's dtype on the device.
        bufs = self._buffers(view.numel() if hi is None else hi - lo)
        events = [None, None]
        for k, (part, shared) in enumerate(self._chunks(p, view, lo, hi)):
            b = k % 2
            if events[b] is not None:
                events[b].synchronize()  # its last copy to the device is done: reusable
            staged = bufs[b][:part.numel()]
            staged.copy_(shared)
            if part.dtype == torch.float32:
                part.copy_(staged, non_blocking=True)
            else:
                part.copy_(staged.to(part.device, non_blocking=True))
            events[b] = torch.cuda.Event()
            events[b].record()
        for e in events:
            if e is not None:
                e.synchronize()

    @torch.no_grad()
    def _store(self):  # shared memory := the model
        for slot in self._slots:
            p, view, zero_copy, pointed = slot
            if zero_copy:
                if not pointed:
                    view.copy_(p.data)
                    p.data = view
                    slot[3] = True
            else:
                self._copy_in(p, view)

    @torch.no_grad()
    def _load(self, lo=0, hi=None):
        """The model := shared memory; only the flat values [lo, hi) when the node says so (a
        round of one streaming fragment: the rest is the model's already)."""
        for slot, at in zip(self._slots, self._offsets):
            p, view, zero_copy, pointed = slot
            if zero_copy:
                if not pointed:
                    p.data = view
                    slot[3] = True
                continue
            a = max(lo, at) - at
            b = p.numel() if hi is None else min(hi, at + p.numel()) - at
            if a < b:
                self._copy_out(p, view, a, b)

    @torch.no_grad()
    def _adopt(self):  # no new weights: CPU float32 parameters move into shared memory
        for slot in self._slots:
            p, view, zero_copy, pointed = slot
            if zero_copy and not pointed:
                view.copy_(p.data)
                p.data = view
                slot[3] = True

    def _release(self):
        """Moves re-pointed parameters back into private memory (before the segment goes)."""
        with torch.no_grad():
            for slot in self._slots:
                p, view, zero_copy, pointed = slot
                if pointed:
                    p.data = view.clone()
                    slot[3] = False


# Grove's per-step collectives and module-level API (after the names they use are defined).
from .collective import Collectives, CollectiveError  # noqa: E402
from .api import (World, _set_current, all_gather, all_sum, average_gradients, barrier,  # noqa
                  demo, diloco, is_available, noloco, rank, recv, recv_like, report, send,
                  sparseloco, sync_parameters, world_size)
