#!/usr/bin/python3
"""Grove's SparseLoCo example in PyTorch on grove-node: every H steps each member sends the
top-k of every chunk of its error buffer; the group steps with their mean
(grove.sparseloco(model, H, outer_lr, topk, chunk, error_decay)).

On one machine, two nodes:
    grove-node --bootstrap --workload external --state-dir /tmp/a
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/sparseloco.py --socket /tmp/a/trainer.sock
    grove-node --peer HOST:PORT --swarm-key KEY --state-dir /tmp/b     # the printed join command
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/sparseloco.py --socket /tmp/b/trainer.sock --seed 1
"""
import sys

import torch

import charlm
import grove


def main():
    a = charlm.args(__doc__, steps=300, H=30)
    train, val, model, gen = charlm.setup(a)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    world = grove.init(socket=a.socket)
    sloco = grove.sparseloco(model, H=a.H, outer_lr=1.0, topk=64, chunk=4096, error_decay=0.95,
                             overlap=False)

    def loop():
        for step in range(1, a.steps + 1):
            loss = charlm.loss_of(model, train, 64, gen)
            loss.backward()
            opt.step()
            opt.zero_grad()
            grove.report(loss.item())
            if sloco.step(model):
                print("sync %d (step %d): loss %.3f, val %.3f"
                      % (sloco.outer_step, step, loss.item(), charlm.evaluate(model, val)),
                      flush=True)
    return charlm.run(world.node, loop, a.wait_for)


if __name__ == "__main__":
    sys.exit(main())
