#!/usr/bin/python3
"""The PyTorch trainer soak.py attaches to each node of its trainer swarm (a small MLP through the
grove package, node/python): tests/node/trainer_test.py's trainer, smaller. It keeps its optimiser
and data position with the node's checkpoints (Node.keep) and logs its steps as JSON lines.

Usage (soak.py starts it): soak_trainer.py --socket SOCK --log FILE [--data-seed N]
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "node", "python"))
TRAINER_INNER_STEPS = 20


def trainer_main(argv):
    """A small PyTorch trainer attached to one node (tests/node/trainer_test.py's, smaller)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--inner-steps", type=int, default=TRAINER_INNER_STEPS)
    a = ap.parse_args(argv)
    import torch
    sys.path.insert(0, PKG)
    import grove
    torch.set_num_threads(1)
    torch.manual_seed(77)
    teacher = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    torch.manual_seed(1234)  # the same model in every trainer (the first one fixes the run's)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    gen = torch.Generator().manual_seed(a.data_seed)
    xs = torch.randn(256, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ys = teacher(xs)

    def held_out():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(xs), ys).item()

    class Position:  # the data position, kept with the optimiser's state
        def __init__(self):
            self.step = 0

        def state_dict(self):
            return {"step": self.step, "gen": gen.get_state()}

        def load_state_dict(self, d):
            self.step = int(d["step"])
            gen.set_state(d["gen"])

    log = open(a.log, "a", buffering=1)
    node = grove.attach(socket=a.socket, timeout=120)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    position = Position()
    node.keep(optimizer=opt, data=position)
    outer = node.noloco(model, inner_steps=a.inner_steps)
    log.write(json.dumps({"attached": outer.run, "pid": os.getpid(), "eval": held_out(),
                          "restored": node.restored and node.restored["steps"],
                          "momentum": bool(opt.state), "position": position.step}) + "\n")
    step = position.step
    try:
        while True:
            x = torch.randn(32, 8, generator=gen)
            with torch.no_grad():
                y = teacher(x) + 0.05 * torch.randn(32, 1, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            position.step = step
            ev = held_out() if step % a.inner_steps == 0 else None
            node.report(loss=loss.item(), eval_loss=ev, tokens=32)
            outer.step()
    except grove.NodeStopped as e:
        log.write(json.dumps({"stopped": str(e), "eval": held_out()}) + "\n")
        return 0
    except grove.NodeGone as e:
        log.write(json.dumps({"gone": str(e)}) + "\n")
        return 4
    finally:
        node.close()


if __name__ == "__main__":
    sys.exit(trainer_main(sys.argv[1:]))
