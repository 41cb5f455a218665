#!/usr/bin/python3
"""Grove's DiLoCo example in PyTorch on grove-node: inner AdamW steps, and every H steps the
node averages the pseudo-gradients over its group and takes the outer Nesterov step
(grove.diloco(model, H, outer_lr, outer_momentum, overlap, quantize)).

On one machine, two nodes:
    grove-node --bootstrap --workload external --state-dir /tmp/a
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/diloco.py --socket /tmp/a/trainer.sock
    grove-node --peer HOST:PORT --swarm-key KEY --state-dir /tmp/b     # the printed join command
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/diloco.py --socket /tmp/b/trainer.sock --seed 1
"""
import sys

import torch

import charlm
import grove


def main():
    a = charlm.args(__doc__, steps=400, H=50, quantize=0)
    train, val, model, gen = charlm.setup(a)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    world = grove.init(socket=a.socket)
    # (Grove's default H is 500; --quantize 1: E3M0 4-bit partial sums.)
    diloco = grove.diloco(model, H=a.H, outer_lr=0.7, outer_momentum=0.9,
                          quantize=bool(a.quantize))

    def loop():
        for step in range(1, a.steps + 1):
            loss = charlm.loss_of(model, train, 64, gen)
            loss.backward()
            opt.step()
            opt.zero_grad()
            grove.report(loss.item())
            if diloco.step(model):  # True at a sync
                print("sync %d (step %d): loss %.3f, val %.3f"
                      % (diloco.outer_step, step, loss.item(), charlm.evaluate(model, val)),
                      flush=True)
    return charlm.run(world.node, loop, a.wait_for)


if __name__ == "__main__":
    sys.exit(main())
