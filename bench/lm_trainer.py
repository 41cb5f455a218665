#!/usr/bin/python3
"""A PyTorch trainer of one of bench/lm_models.py's language models (an LSTM or a Transformer on
Debian's fortunes corpus), attached to a grove-node through the grove package: what a user's
script does. AdamW inner steps with a linear warm-up and a cosine decay over --steps; after every
outer round it evaluates the model it was handed on the held-out windows and writes a JSON line
{"step", "round", "eval_loss", "time"} to --log; when the node stops (its --max-steps) it
evaluates once more and writes {"final": true, ...}.

    grove-node --bootstrap --workload external --max-steps 600 ...
    bench/lm_trainer.py --socket STATE_DIR/trainer.sock --model lstm --outer diloco --log t.jsonl

Algorithm options are used when this trainer creates the run (its node was started with
--bootstrap); a trainer of a joining node takes the run's.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "node", "python")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--model", default="lstm")
    ap.add_argument("--steps", type=int, default=600, help="the schedule's length")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--data-seed", type=int, default=0, help="this trainer's data stream")
    ap.add_argument("--init-seed", type=int, default=1001, help="the run's initial weights")
    ap.add_argument("--outer", default="noloco", choices=["noloco", "diloco"])
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--outer-args", default="",
                    help="more keyword arguments of grove's noloco()/diloco(), k=v,k=v")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch
    import grove
    import lm_models as lm
    torch.set_num_threads(a.threads)
    corpus = lm.Corpus()
    batch, seq = lm.shape(a.model)
    windows = corpus.eval_windows(seq)
    model = lm.make_model(a.model, corpus.vocab, seed=a.init_seed)
    gen = torch.Generator().manual_seed(a.data_seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    kw = {}
    for part in filter(None, a.outer_args.split(",")):
        k, _, v = part.partition("=")
        for kind in (int, float, str):
            try:
                kw[k] = kind(v)
                break
            except ValueError:
                pass
    node = grove.attach(socket=a.socket, timeout=120)
    node.keep(optimizer=opt)
    if a.outer == "noloco":
        outer = node.noloco(model, inner_steps=a.inner_steps, **kw)
    else:
        outer = node.diloco(model, inner_steps=a.inner_steps, **kw)
    log = open(a.log, "a", buffering=1)
    t0 = time.monotonic()

    def write(**kv):
        kv.update(time=round(time.monotonic() - t0, 3),
                  eval_loss=lm.evaluate(model, windows))
        log.write(json.dumps(kv) + "\n")
        return kv["eval_loss"]

    step = outer.steps
    try:
        while True:
            for g in opt.param_groups:
                g["lr"] = lm.lr_at(step, a.steps, a.lr, a.warmup)
            x, y = corpus.batch(gen, batch, seq)
            loss = lm.loss_of(model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            node.report(loss=loss.item(), tokens=batch * seq)
            outer.step()
            step += 1
            if step % outer.inner_steps == 0:
                ev = write(step=step, round=step // outer.inner_steps)
                node.report(eval_loss=ev)
    except grove.NodeStopped:
        write(step=step, final=True)
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
