"""Small PyTorch language models on a real text corpus, for the convergence studies: a word-level
LSTM and a word-level Transformer, trained on the fortune cookies Debian ships (package
`fortunes`: /usr/share/games/fortunes, about 2.5 MB of English quotations, literature, jokes
and definitions).

The corpus is every fortune file concatenated in name order, split into lower-case words and
punctuation marks; the 4095 commonest tokens form the vocabulary (the rest map to <unk>). The
last 5% of the token stream is held out: evaluation reads fixed windows spread over it, so every
trainer and every configuration is evaluated on the same tokens. Training windows start at
random positions of the first 95%, drawn from a generator the caller seeds (one per trainer).
"""

import glob
import os
import re
from collections import Counter

import torch
import torch.nn as nn

FORTUNES = "/usr/share/games/fortunes"
VOCAB = 4096
_TOKEN = re.compile(r"[a-z']+|[0-9]+|[^\sa-z0-9]")


class Corpus:
    def __init__(self, root=FORTUNES, vocab=VOCAB):
        files = sorted(f for f in glob.glob(os.path.join(root, "*"))
                       if os.path.isfile(f) and "." not in os.path.basename(f))
        if not files:
            raise SystemExit(f"no corpus in {root}: apt-get install fortunes")
        text = []
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as h:
                text.append(h.read())
        words = _TOKEN.findall("\n".join(text).lower())
        common = [w for w, _ in Counter(words).most_common(vocab - 1)]
        index = {w: i + 1 for i, w in enumerate(common)}  # 0: <unk>
        self.vocab = vocab
        self.tokens = torch.tensor([index.get(w, 0) for w in words], dtype=torch.long)
        cut = int(len(self.tokens) * 0.95)
        self.train, self.held = self.tokens[:cut], self.tokens[cut:]

    def batch(self, gen, batch, seq):
        """`batch` windows of seq + 1 tokens at random positions of the training part."""
        starts = torch.randint(0, len(self.train) - seq - 1, (batch,), generator=gen)
        w = torch.stack([self.train[s:s + seq + 1] for s in starts.tolist()])
        return w[:, :-1], w[:, 1:]

    def eval_windows(self, seq, count=64):
        """`count` fixed windows spread evenly over the held-out part."""
        step = (len(self.held) - seq - 1) // count
        w = torch.stack([self.held[i * step:i * step + seq + 1] for i in range(count)])
        return w[:, :-1], w[:, 1:]


class LSTMModel(nn.Module):
    """Embedding, a 2-layer LSTM and a decoder tied to the embedding."""

    def __init__(self, vocab, dim=192, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, layers, batch_first=True)
        self.out = nn.Linear(dim, vocab)
        self.out.weight = self.emb.weight
        nn.init.uniform_(self.emb.weight, -0.1, 0.1)
        nn.init.zeros_(self.out.bias)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


class TransformerModel(nn.Module):
    """A small causal (GPT-style, pre-norm) Transformer with learned positions and a tied
    decoder."""

    def __init__(self, vocab, dim=128, layers=2, heads=4, seq=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)
        self.out.weight = self.emb.weight
        nn.init.normal_(self.emb.weight, std=0.02)
        nn.init.zeros_(self.out.bias)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, x):
        n = x.shape[1]
        h = self.emb(x) + self.pos[:n]
        h = self.body(h, mask=self.mask[:n, :n])
        return self.out(self.norm(h))


# Per model: the constructor and its batch shape (windows, tokens per window).
MODELS = {
    "lstm": (lambda v: LSTMModel(v), 20, 35),
    "transformer": (lambda v: TransformerModel(v), 16, 64),
}


def make_model(kind, vocab, seed=1234):
    """The same initial weights for every trainer of a run (`seed`)."""
    torch.manual_seed(seed)
    return MODELS[kind][0](vocab)


def shape(kind):
    return MODELS[kind][1], MODELS[kind][2]


def loss_of(model, x, y):
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model, windows, chunk=16):
    x, y = windows
    total = 0.0
    for i in range(0, len(x), chunk):
        total += loss_of(model, x[i:i + chunk], y[i:i + chunk]).item() * len(x[i:i + chunk])
    return total / len(x)


def lr_at(step, steps, lr, warmup):
    """Linear warm-up, then cosine decay to a tenth over the trainer's own steps."""
    import math
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))
