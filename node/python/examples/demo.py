#!/usr/bin/python3
"""Grove's DeMo example in PyTorch on grove-node: no inner optimiser; every step DeMo adds the
gradient to its momentum, sends the top-k of each chunk's DCT to the group (one all-gather) and
steps by the sign of the group's mean (grove.demo(model, lr, decay, topk, chunk); the run is a
per-step one).

On one machine, two nodes:
    grove-node --bootstrap --workload external --outer none --state-dir /tmp/a
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/demo.py --socket /tmp/a/trainer.sock
    grove-node --peer HOST:PORT --swarm-key KEY --state-dir /tmp/b     # the printed join command
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/demo.py --socket /tmp/b/trainer.sock --seed 1
"""
import sys

import charlm
import grove


def main():
    a = charlm.args(__doc__, steps=300)
    train, val, model, gen = charlm.setup(a)
    world = grove.init(socket=a.socket)
    demo = grove.demo(model, lr=1e-3, decay=0.999, topk=32, chunk=64)

    def loop():
        for step in range(1, a.steps + 1):
            loss = charlm.loss_of(model, train, 64, gen)
            loss.backward()
            grove.report(loss.item())
            demo.step(model)  # exchange and step (a step of the per-step run)
            model.zero_grad()
            if step % 50 == 0:
                print("step %d: loss %.3f, val %.3f, group of %d, %d bytes sent a step"
                      % (step, loss.item(), charlm.evaluate(model, val), demo.last_size,
                         demo.bytes_sent // step), flush=True)
    return charlm.run(world.node, loop, a.wait_for)


if __name__ == "__main__":
    sys.exit(main())
