#!/usr/bin/python3
"""A small example trainer: an MLP learns a fixed random teacher; grove-node averages it with
the swarm. Start a node first, e.g.

    grove-node --bootstrap --workload external --window-ms 1000
    PYTHONPATH=node/python /usr/bin/python3 node/python/examples/train_mlp.py --steps 2000

and on other machines the join command the first node prints (`grove-node --peer HOST:PORT
--swarm-key KEY`) with this script next to each.
"""
import argparse
import sys

import torch

import grove


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="the node's trainer socket (default: its state dir's)")
    ap.add_argument("--steps", type=int, default=1000, help="inner steps, then stop")
    ap.add_argument("--outer", choices=["noloco", "diloco"], default="noloco")
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="this trainer's data stream")
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()

    torch.manual_seed(1234)  # the teacher and the initial model: the same in every trainer
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, a.hidden), torch.nn.Tanh(),
                                torch.nn.Linear(a.hidden, 1))
    gen = torch.Generator().manual_seed(a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)

    node = grove.attach(socket=a.socket)
    if a.outer == "noloco":
        outer = node.noloco(model, inner_steps=a.inner_steps)
    else:
        outer = node.diloco(model, inner_steps=a.inner_steps)
    print("attached: run %s, %s, %d inner steps" % (outer.run, outer.outer, outer.inner_steps),
          flush=True)
    try:
        for step in range(a.steps):
            x = torch.randn(64, 16, generator=gen)
            with torch.no_grad():
                y = teacher(x) + 0.1 * torch.randn(64, 1, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            node.report(loss=loss.item(), tokens=64)
            outer.step()
            if (step + 1) % 100 == 0:
                print("step %d loss %.4f" % (step + 1, loss.item()), flush=True)
    except grove.NodeStopped as e:
        print("the node stopped: %s" % e, flush=True)
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
