#!/usr/bin/python3
"""Grove's per-step data parallel, in PyTorch on grove-node: every step the gradients are
averaged over the swarm's group (grove.average_gradients), as torch's DDP or Grove's
distributed_train do. The run is a per-step one (no outer rounds). A trainer that joins later
takes the group's weights at its first call (average_gradients on a module does it).

On one machine, two nodes (each prints where its trainer attaches):
    grove-node --bootstrap --workload external --outer none --state-dir /tmp/a
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/ddp.py --socket /tmp/a/trainer.sock
    grove-node --peer HOST:PORT --swarm-key KEY --state-dir /tmp/b     # the printed join command
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/ddp.py --socket /tmp/b/trainer.sock --seed 1
(--outer none can be left out: the first trainer's grove.init(model) makes the run per-step.)
"""
import sys

import torch

import charlm
import grove


def main():
    a = charlm.args(__doc__, steps=300)
    train, val, model, gen = charlm.setup(a)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    world = grove.init(model, socket=a.socket)

    def loop():
        for step in range(1, a.steps + 1):
            loss = charlm.loss_of(model, train, 64, gen)
            loss.backward()
            grove.report(loss.item())
            grove.average_gradients(model)  # the mean over the group, in place (and a step)
            opt.step()
            opt.zero_grad()
            if step % 50 == 0:
                print("step %d: loss %.3f, val %.3f, rank %d of %d"
                      % (step, loss.item(), charlm.evaluate(model, val), world.rank(),
                         world.size()), flush=True)
    return charlm.run(world.node, loop, a.wait_for)


if __name__ == "__main__":
    sys.exit(main())
