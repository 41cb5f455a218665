"""The examples' shared workload: a small character-level language model on a text that every
Debian system carries (the GPL's text, /usr/share/common-licenses/GPL-3, ~35 KB), each trainer
drawing its own random windows (--seed). Not part of the grove package."""
import os

import torch

TEXT = "/usr/share/common-licenses/GPL-3"
CONTEXT = 32


def load(path=TEXT):
    with open(path, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    cut = int(0.9 * len(data))
    return data[:cut], data[cut:]


class CharLM(torch.nn.Module):
    """Embeddings of the last CONTEXT bytes → an MLP → the next byte (~0.4M parameters)."""

    def __init__(self, dim=32, hidden=384):
        super().__init__()
        self.emb = torch.nn.Embedding(256, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(CONTEXT * dim, hidden), torch.nn.GELU(),
                                       torch.nn.Linear(hidden, 256))

    def forward(self, x):
        return self.mlp(self.emb(x).flatten(1))


def batch(data, size, gen):
    at = torch.randint(0, len(data) - CONTEXT - 1, (size,), generator=gen)
    x = torch.stack([data[i:i + CONTEXT] for i in at])
    return x, data[at + CONTEXT]


def loss_of(model, data, size, gen):
    x, y = batch(data, size, gen)
    return torch.nn.functional.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(model, data):
    gen = torch.Generator().manual_seed(12345)  # the same windows everywhere
    return loss_of(model, data, 512, gen).item()


def model(seed=0):
    torch.manual_seed(seed)  # every trainer starts from the same weights unless told otherwise
    return CharLM()


def args(doc, steps, **more):
    """The examples' command line: --socket, --steps, --seed and `more` (name → default)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--socket", default=os.environ.get("GROVE_SOCKET"),
                    help="the node's trainer socket (default: its state dir's, or $GROVE_SOCKET)")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--seed", type=int, default=0, help="this trainer's data windows")
    ap.add_argument("--wait-for", type=int, default=1,
                    help="wait (up to 5 min) until the group has this many members")
    for name, default in more.items():
        ap.add_argument("--" + name, type=type(default), default=default)
    return ap.parse_args()


def setup(a):
    """(train data, held-out data, the model, this trainer's generator)."""
    train, val = load()
    return train, val, model(), torch.Generator().manual_seed(a.seed)


def run(node, loop, wait_for=1):
    """Runs loop() (after a barrier of `wait_for` members, when more than one); a node that
    stops ends it quietly; the node is closed after."""
    import grove
    try:
        if wait_for > 1:
            grove.barrier(min_size=wait_for, timeout=300)
        loop()
    except grove.NodeStopped as e:
        print("the node stopped: %s" % e)
    finally:
        node.close()
    return 0
