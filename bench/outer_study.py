#!/usr/bin/python3
"""Outer-step study in plain PyTorch: K replicas of a language model (bench/lm_models.py: an
LSTM or a Transformer on Debian's fortunes corpus) trained in one process, each with its own
AdamW and data stream, averaged every H inner steps by an outer rule, against one trainer alone.
It mirrors grove-node's rules (optim/outer.hpp) without the network, to choose defaults from
evidence before they are confirmed with real processes (bench/convergence.py).

Rules (name:key=value,..., separated by ';'):
  single                 one trainer, the same inner steps as each replica (no outer step)
  single-all             one trainer, K x the steps
  diloco:lr=,mu=,warm=,sched=   Nesterov on the mean pseudo-gradient; warm > 0 ramps the step
                         over the first `warm` rounds (sched=mu: momentum 0 -> mu; sched=both:
                         lr 1 -> lr and momentum 0 -> mu); restart=1: the momentum restarts
                         from zero whenever the new mean pseudo-gradient points against it
  noloco:a=,b=,g=,group=,look=  modified Nesterov with the consensus term over random groups;
                         look > 0 starts each inner phase from phi + look * m
  gossip:lr=,mu=,g=,group=,warm=  DiLoCo's Nesterov step on the group's mean pseudo-gradient, each
                         member with its own momentum, plus a pull of g toward the group's
                         mean slow weights (two tensors travel)
  mix:lr=,mu=,warm=,group=      grove-node's NoLoCo rule: each replica takes DiLoCo's
                         Nesterov step on its own pseudo-gradient without applying it; the group
                         averages the results and the new momenta (two tensors travel)
  avg                    plain averaging (diloco lr 1, mu 0)
Prints per rule the final eval loss of the replicas' slow weights (mean over replicas and its
spread), its gap to `single` and to the first diloco rule, and the eval loss after every round.
"""

import argparse
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm_models as lm  # noqa: E402

vec = torch.nn.utils.parameters_to_vector


def load(model, v):
    torch.nn.utils.vector_to_parameters(v, model.parameters())


def parse_rule(text):
    name, _, rest = text.partition(":")
    kv = {}
    for part in filter(None, rest.split(",")):
        k, _, v = part.partition("=")
        kv[k] = v
    return name, kv


def groups_of(k, size, rng):
    """Random groups of `size` (at most k) over k replicas, a remainder joining the last."""
    size = min(k, size)
    order = list(range(k))
    rng.shuffle(order)
    groups = [order[j:j + size] for j in range(0, k - k % size, size)]
    for j in order[k - k % size:]:
        groups[-1].append(j)
    return groups


def run(a, corpus, rule, seed):
    name, kv = parse_rule(rule)
    k = 1 if name.startswith("single") else a.replicas
    steps = a.steps * (a.replicas if name == "single-all" else 1)
    batch, seq = lm.shape(a.model)
    windows = corpus.eval_windows(seq)
    models = [lm.make_model(a.model, corpus.vocab, seed=1000 + seed) for _ in range(k)]
    opts = [torch.optim.AdamW(m.parameters(), lr=a.lr, weight_decay=0.01) for m in models]
    gens = [torch.Generator().manual_seed(seed * 100 + i) for i in range(k)]
    rng = random.Random(seed)
    phi = [vec(models[0].parameters()).detach().clone() for _ in range(k)]
    mom = [torch.zeros_like(phi[0]) for _ in range(k)]
    curve = []
    H = a.inner_steps
    for step in range(steps):
        lr = lm.lr_at(step, steps, a.lr, a.warmup)
        for i in range(k):
            for g in opts[i].param_groups:
                g["lr"] = lr
            x, y = corpus.batch(gens[i], batch, seq)
            loss = lm.loss_of(models[i], x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(models[i].parameters(), 1.0)
            opts[i].step()
            opts[i].zero_grad()
        if (step + 1) % H and step + 1 != steps:
            continue
        t = (step + 1) // H - 1  # the round
        theta = [vec(m.parameters()).detach() for m in models]
        if name.startswith("single"):
            phi = [th.clone() for th in theta]
        elif name in ("diloco", "avg"):
            lr_o = float(kv.get("lr", 0.7 if name == "diloco" else 1.0))
            mu = float(kv.get("mu", 0.9 if name == "diloco" else 0.0))
            warm = int(kv.get("warm", 0))
            if warm and t < warm:
                s = t / warm
                if kv.get("sched", "mu") == "both":
                    lr_o = 1.0 + (lr_o - 1.0) * s
                mu = mu * s
            d = sum(phi[0] - th for th in theta) / k
            if kv.get("restart") and torch.dot(d, mom[0]) < 0:
                mom[0].zero_()  # adaptive restart: the new Δ turns against the momentum
            mom[0] = mu * mom[0] + d
            new = phi[0] - lr_o * (d + mu * mom[0])
            phi = [new.clone() for _ in range(k)]
        elif name == "noloco":
            al, be = float(kv.get("a", 0.5)), float(kv.get("b", 0.7))
            ga = float(kv.get("g", be))
            new_phi = list(phi)
            for gr in groups_of(k, int(kv.get("group", 2)), rng):
                md = sum(phi[i] - theta[i] for i in gr) / len(gr)
                mp = sum(phi[i] for i in gr) / len(gr)
                for i in gr:
                    mom[i] = al * mom[i] - be * md - ga * (phi[i] - mp)
                    new_phi[i] = phi[i] + mom[i]
            phi = new_phi
        elif name == "gossip":
            lr_o, mu = float(kv.get("lr", 0.7)), float(kv.get("mu", 0.9))
            ga = float(kv.get("g", 0.5))
            warm = int(kv.get("warm", 0))
            if warm and t < warm:
                lr_o, mu = 1.0 + (lr_o - 1.0) * t / warm, mu * t / warm
            new_phi = list(phi)
            for gr in groups_of(k, int(kv.get("group", 2)), rng):
                md = sum(phi[i] - theta[i] for i in gr) / len(gr)
                mp = sum(phi[i] for i in gr) / len(gr)
                for i in gr:
                    mom[i] = mu * mom[i] + md
                    new_phi[i] = phi[i] - lr_o * (md + mu * mom[i]) - ga * (phi[i] - mp)
            phi = new_phi
        elif name == "mix":
            lr_o, mu = float(kv.get("lr", 0.7)), float(kv.get("mu", 0.9))
            warm = int(kv.get("warm", 0))
            if warm and t < warm:
                lr_o, mu = 1.0 + (lr_o - 1.0) * t / warm, mu * t / warm
            prop = []
            for i in range(k):
                d = phi[i] - theta[i]
                mom[i] = mu * mom[i] + d
                prop.append(phi[i] - lr_o * (d + mu * mom[i]))
            new_phi = list(phi)
            for gr in groups_of(k, int(kv.get("group", 2)), rng):
                mp = sum(prop[i] for i in gr) / len(gr)
                mm = sum(mom[i] for i in gr) / len(gr)
                for i in gr:
                    new_phi[i] = mp.clone()
                    mom[i] = mm.clone()
            phi = new_phi
        else:
            raise SystemExit("unknown rule " + rule)
        # Each replica's slow weights are evaluated; its next phase starts from them, or with a
        # look-ahead from phi + look * m.
        look = float(kv.get("look", 0)) if name == "noloco" else 0.0
        ev = []
        for i in range(k):
            load(models[i], phi[i])
            ev.append(lm.evaluate(models[i], windows))
            if look:
                load(models[i], phi[i] + look * mom[i])
        curve.append(sum(ev) / len(ev))
        if not all(math.isfinite(e) for e in ev):
            break
    spread = 0.0
    if k > 1:
        mean = sum(phi) / k
        spread = math.sqrt(sum(((p - mean) ** 2).mean().item() for p in phi) / k)
    return curve, spread


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="lstm", choices=sorted(lm.MODELS))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--steps", type=int, default=600, help="inner steps per replica")
    ap.add_argument("--inner-steps", type=int, default=50, help="H")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--rules", default="single;diloco;avg;noloco", help="rules, separated by ;")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    corpus = lm.Corpus()
    rules = a.rules.split(";")
    seeds = [int(s) for s in a.seeds.split(",")]
    final = {}
    for rule in rules:
        for s in seeds:
            t0 = time.monotonic()
            curve, spread = run(a, corpus, rule, s)
            final.setdefault(rule, []).append(curve[-1])
            print(f"{rule} seed {s}: final {curve[-1]:.4f} spread {spread:.2e} "
                  f"({time.monotonic() - t0:.0f} s); per round "
                  + " ".join(f"{c:.3f}" for c in curve), flush=True)
    base = final.get("single")
    ref = next((final[r] for r in rules if r.startswith("diloco")), None)
    print(f"\n{a.model}, {a.replicas} replicas x {a.steps} steps, H {a.inner_steps}, lr {a.lr}, "
          f"seeds {a.seeds}")
    for rule in rules:
        v = final[rule]
        m = sum(v) / len(v)
        line = f"  {rule:40s} {m:.4f} [{min(v):.4f}, {max(v):.4f}]"
        if base:
            line += f"  vs single {100 * (m / (sum(base) / len(base)) - 1):+.1f}%"
        if ref:
            line += f"  vs diloco {100 * (m / (sum(ref) / len(ref)) - 1):+.1f}%"
        print(line)


if __name__ == "__main__":
    main()
