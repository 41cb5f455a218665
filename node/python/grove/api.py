"""Grove's module-level API over the node this process attached last: ``grove.init()``,
``grove.rank``/``grove.world_size``, the collectives (``all_sum``, ``average_gradients``,
``all_gather``, ``barrier``, ``send``, ``recv``), the algorithms (``grove.diloco(model, ...)``,
``grove.sparseloco``, ``grove.noloco``) and ``grove.report(loss)``, with Grove's names and
defaults. Differences from Grove, which has fixed ranks on one LAN: see README ("Grove's calls").
"""

import torch

from . import GroveError

#: The rank and size of the group of this process's last collective (0 and 1 before it); the
#: package's attributes of the same names follow them.
rank = 0
world_size = 1

_current = None  # the node this process attached last (grove.init / grove.attach)


def _set_current(node):
    global _current
    _current = node


class World:
    """Grove's handle: ``rank()`` and ``size()`` of the group of this process's last collective
    (0 and 1 before the first), and the node it is attached to (``node``)."""

    def __init__(self, node):
        self.node = node

    def rank(self):
        return self.node.collectives.rank

    def size(self):
        return self.node.collectives.size

    def joined(self):
        """Whether the last collective's group gained a member (see sync_parameters)."""
        return self.node.collectives.joined


def _node():
    if _current is None or _current._sock is None:
        raise GroveError("not attached to a grove-node: call grove.init() (or grove.attach()) "
                         "and choose the algorithm first")
    return _current


def _attached():
    """The node this process is attached to, attaching to the default socket when none is."""
    if _current is None or _current._sock is None:
        from . import attach
        attach()
    return _current


# ---- collectives ---------------------------------------------------------------------------------
def all_sum(x, timeout=None):
    """grove.all_sum: see :meth:`grove.collective.Collectives.all_sum`."""
    return _node().collectives.all_sum(x, timeout=timeout)


def average_gradients(grads, wire="fp32", timeout=None):
    """grove.average_gradients: see :meth:`grove.collective.Collectives.average_gradients`."""
    return _node().collectives.average_gradients(grads, wire=wire, timeout=timeout)


def all_gather(x, timeout=None):
    """grove.all_gather: see :meth:`grove.collective.Collectives.all_gather`."""
    return _node().collectives.all_gather(x, timeout=timeout)


def barrier(min_size=0, timeout=None):
    """grove.barrier: see :meth:`grove.collective.Collectives.barrier`."""
    _node().collectives.barrier(min_size=min_size, timeout=timeout)


def send(x, dst, timeout=None):
    """grove.send: see :meth:`grove.collective.Collectives.send`."""
    _node().collectives.send(x, dst, timeout=timeout)


def recv(shape, dtype=torch.float32, src=0, timeout=None, device=None):
    """grove.recv: see :meth:`grove.collective.Collectives.recv`."""
    return _node().collectives.recv(shape, dtype, src, timeout=timeout, device=device)


def recv_like(x, src, timeout=None):
    """grove.recv_like: see :meth:`grove.collective.Collectives.recv_like`."""
    return _node().collectives.recv_like(x, src, timeout=timeout)


def sync_parameters(model, fresh=None, timeout=None):
    """grove.sync_parameters: see :meth:`grove.collective.Collectives.sync_parameters`."""
    return _node().collectives.sync_parameters(model, fresh=fresh, timeout=timeout)


def is_available():
    """Whether the last collective had a group of more than one member."""
    return _current is not None and _current.collectives.size > 1


# ---- the algorithms, as Grove names them ---------------------------------------------------------
def diloco(model, H=500, outer_lr=0.7, outer_momentum=0.9, overlap=False, quantize=False,
           **kw):
    """Grove's ``grove.diloco``: DiLoCo every ``H`` steps on the node this process is attached
    to (attaching first when it is not). ``quantize=True``: E3M0 (4-bit) partial sums with error
    feedback; ``overlap=True``: the round runs while the next inner steps do. These fix the run
    when this trainer starts it (its node was started with --bootstrap) and are checked against
    it otherwise. Returns the :class:`grove.Outer`; call its ``step()`` after every optimiser
    step (it returns True at a sync). More of :meth:`grove.Node.diloco`'s arguments pass
    through ``kw``."""
    return _attached().diloco(model, inner_steps=H, outer_lr=outer_lr, momentum=outer_momentum,
                              codec="e3m0" if quantize else None,
                              overlap=True if overlap else None, **kw)


def sparseloco(model, H=30, outer_lr=1.0, topk=64, chunk=4096, error_decay=0.95, overlap=True,
               **kw):
    """Grove's ``grove.sparseloco``: each member sends the ``topk`` largest of every ``chunk``
    values of its error buffer every ``H`` steps; the group steps with their mean (outer lr
    ``outer_lr``, no momentum). Grove's default ``overlap=True`` carries over."""
    return _attached().sparseloco(model, inner_steps=H, outer_lr=outer_lr, topk=topk, chunk=chunk,
                                  error_decay=error_decay, overlap=True if overlap else None,
                                  **kw)


def noloco(model, H=50, **kw):
    """grove-node's default: NoLoCo pair (or group) averaging every ``H`` steps, no all-reduce
    (see :meth:`grove.Node.noloco`)."""
    return _attached().noloco(model, inner_steps=H, **kw)


def demo(model, lr=1e-3, decay=0.999, topk=32, chunk=64, weight_decay=0.0):
    """Grove's ``grove.demo``: DeMo, a step every call of its ``step(model, grads)`` (instead of
    the optimiser's step), its DCT-compressed momentum exchanged with the group each step (one
    all-gather). See :class:`grove.demo.DeMo`."""
    from .demo import DeMo
    node = _attached()
    if node._outer is None:
        node.per_step(model)  # (no outer rounds: DeMo's exchange is the synchronisation)
    return DeMo(model, lr=lr, decay=decay, topk=topk, chunk=chunk, weight_decay=weight_decay)


def report(loss=None, step=None, eval_loss=None, tokens=None):
    """Grove's ``grove.report(loss)``: the loss (and an evaluation loss, the tokens of the step)
    sent with this trainer's next step, shown by ``grove-node status`` and in the metrics.
    ``step`` is accepted for Grove's signature (the node counts steps itself)."""
    if _current is not None:
        _current.report(loss=loss, eval_loss=eval_loss, tokens=tokens)
