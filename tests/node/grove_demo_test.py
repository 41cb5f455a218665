#!/usr/bin/python3
"""grove.demo (node/python/grove/demo.py) against the plain-PyTorch DeMo reference of the optim
tests (tests/optim/demo_reference.py): three members, each with its own gradients, exchange
through an in-process all-gather; after every step each member's parameters equal the
reference's within 1e-5, and member 0's momentum too. Tensors of one, two and three dimensions,
and block sides that do not divide evenly into chunk.

Exit 77 (skipped) without torch. Run with /usr/bin/python3 (Debian's torch).
"""
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "node", "python")))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "optim")))


class Group:
    """An all-gather among `n` threads: each call returns every member's tensor, in member
    order, once all have called."""

    def __init__(self, n):
        self.n, self.msgs, self.cv, self.round = n, {}, threading.Condition(), 0

    def gather_for(self, member):
        import torch

        def gather(flat):
            with self.cv:
                r = self.round
                self.msgs[member] = flat.clone()
                if len(self.msgs) == self.n:
                    self.out = torch.cat([self.msgs[m] for m in range(self.n)])
                    self.msgs = {}
                    self.round += 1
                    self.cv.notify_all()
                else:
                    self.cv.wait_for(lambda: self.round != r, timeout=30)
                return self.out
        return gather


def main():
    try:
        import torch
    except ImportError as e:
        print("SKIP: %s" % e)
        return 77
    import demo_reference as ref
    from grove.demo import DeMo

    torch.manual_seed(0)
    torch.set_num_threads(1)
    members, steps, lr, decay, topk, chunk, wd = 3, 6, 0.01, 0.9, 4, 8, 0.1
    shapes = [(37,), (12, 20), (6, 4, 5), ()]

    class Model(torch.nn.Module):
        def __init__(self, init):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for t in init])

    init = [torch.randn(s) for s in shapes]
    models = [Model(init) for _ in range(members)]
    grads = [[[torch.randn(s) for s in shapes] for _ in range(members)] for _ in range(steps)]
    group = Group(members)
    opts = [DeMo(models[m], lr=lr, decay=decay, topk=topk, chunk=chunk, weight_decay=wd,
                 gather=group.gather_for(m)) for m in range(members)]

    # The reference, step by step (flat parameters and momenta).
    ts = [ref.Tensor(list(s), topk, chunk) for s in shapes]
    p_ref = torch.cat([t.clone().reshape(-1) for t in init])
    d_ref = [torch.zeros(p_ref.numel()) for _ in range(members)]
    worst = 0.0
    for s in range(steps):
        ref.step(ts, p_ref, d_ref,
                 [torch.cat([g.reshape(-1) for g in grads[s][m]]) for m in range(members)],
                 lr, decay, wd)
        sizes = [None] * members

        def run(m):
            sizes[m] = opts[m].step(models[m], [g for g in grads[s][m]])
        th = [threading.Thread(target=run, args=(m,)) for m in range(members)]
        for x in th:
            x.start()
        for x in th:
            x.join(timeout=60)
        if sizes != [members] * members:
            print("FAIL: step %d: group sizes %r" % (s, sizes))
            return 1
        for m in range(members):
            got = torch.cat([p.detach().reshape(-1) for p in models[m].ps])
            err = (got - p_ref).abs().max().item()
            worst = max(worst, err)
            if err > 1e-5:
                print("FAIL: step %d member %d: off by %g" % (s, m, err))
                return 1
        err = (torch.cat(opts[0].deltas) - d_ref[0]).abs().max().item()
        if err > 1e-5:
            print("FAIL: step %d: member 0's momentum off by %g" % (s, err))
            return 1
    print("grove.demo: %d members x %d steps equal the reference (worst %.2g); %d bytes a "
          "member a step" % (members, steps, worst, opts[0].bytes_sent // steps))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
