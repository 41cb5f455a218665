#!/usr/bin/python3
"""Design study for compressed NoLoCo (issue 25): which compressed pairwise rule keeps NoLoCo's
loss within 2% at <= 0.1 bytes a parameter a round? Plain PyTorch, no grove-node: R replicas of
a small MLP on non-identical data (each replica's inputs drawn around its own centre, one
teacher), AdamW inner steps, random pairs every round (a fresh permutation).

NoLoCo (β = γ form, dense): m = α·m + β·(mean_G(θ) − φ); φ += m; θ = φ. Splitting mean_G(θ) − φ_i
for a pair (i, j):  −(Δ_i + Δ_j)/2 + (φ_j − φ_i)/2 — a pseudo-gradient term and a consensus term.

Rules compared (bytes a member sends a round, per parameter):
  dense        θ in fp16 (2.0)
  cΔ/K         Δ as SparseLoCo's message (top-k of an error buffer e = decay·e + Δ, e −= sent) in
               every round, m = α·m − β·mean_G(Δ̂); every K-th round also φ in fp16 and the
               consensus term −γ·(φ_i − mean_G(φ)) (k/chunk·(2 + value bytes) + 2/K)
  cΔ only      the same without any consensus (the replicas drift apart)
  rand p%      no compression: a pair averages θ on a random p% of the values (a mask both draw
               from the round's seed, so no indices travel), fp16 values, NoLoCo's step there and
               the local-only step (m = α·m − β·Δ) elsewhere (p/100 · 2)
  rot p%       the same on a contiguous fragment, fragment r mod (100/p) in round r (grove-node's
               --fragments for NoLoCo draws the fragment from the pair's window instead)
  draw p%      as rot, but the fragment drawn at random for each pair and round (what grove-node
               does: from the pair's window)
  stream p%    as rot, but outside the fragment φ and m stay and θ goes on training (Streaming
               DiLoCo's rule for the fragments not synchronised)

Prints one line per rule: final mean held-out loss over the replicas, its gap to dense NoLoCo's,
the replicas' RMS spread, and the bytes; the last line
  noloco-compress: <rule> <bytes/param> <gap %> ...
"""
import argparse
import math

import torch


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--topk", default="16,8")
    ap.add_argument("--every", default="8,32,0", help="K values; 0: no consensus")
    ap.add_argument("--random", default="5,2,20",
                    help="rand rules: percent of the values a pair averages (a shared mask)")
    ap.add_argument("--rotate", default="5,20",
                    help="rot rules: percent of the values averaged, a contiguous fragment that "
                    "turns round by round (the same for every pair)")
    ap.add_argument("--draw", default="5,20",
                    help="draw rules: as rot, but the fragment drawn at random for each pair "
                    "and round (grove-node's --fragments for NoLoCo)")
    ap.add_argument("--stream", default="5,20",
                    help="stream rules: as rot, but φ and m stay and θ goes on outside the "
                    "fragment (Streaming DiLoCo's fragments)")
    return ap.parse_args()


D_IN = 16


def make_task(seed, replicas):
    g = torch.Generator().manual_seed(seed)
    teacher = [torch.randn(D_IN, 64, generator=g) / 4, torch.randn(64, 1, generator=g) / 8]
    centres = torch.randn(replicas, D_IN, generator=g) * 1.5
    return teacher, centres


def target(teacher, x):
    return torch.tanh(x @ teacher[0]) @ teacher[1]


def init_params(seed, hidden):
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.cat([(torch.randn(D_IN * hidden, generator=g) / math.sqrt(D_IN)),
                      torch.zeros(hidden), (torch.randn(hidden, generator=g) / math.sqrt(hidden)),
                      torch.zeros(1)])


def forward(p, x, hidden):
    w1 = p[:D_IN * hidden].view(D_IN, hidden)
    b1 = p[D_IN * hidden:D_IN * hidden + hidden]
    w2 = p[D_IN * hidden + hidden:D_IN * hidden + 2 * hidden].view(hidden, 1)
    b2 = p[-1:]
    return torch.tanh(x @ w1 + b1) @ w2 + b2


def topk_message(e, chunk, k):
    """SparseLoCo's message: the k largest |e| of every chunk (the last chunk padded)."""
    n = e.numel()
    pad = (-n) % chunk
    v = torch.cat([e, torch.zeros(pad)]).view(-1, chunk)
    idx = v.abs().topk(min(k, chunk), dim=1).indices
    out = torch.zeros_like(v)
    out.scatter_(1, idx, v.gather(1, idx))
    return out.view(-1)[:n]


def run(rule, seed, a):
    torch.manual_seed(seed)
    R, H, hid = a.replicas, a.inner_steps, a.hidden
    teacher, centres = make_task(seed, R)
    g = torch.Generator().manual_seed(seed + 7)
    x_eval = torch.randn(2048, D_IN, generator=g) * 1.5 + centres[torch.randint(R, (2048,), generator=g)]
    y_eval = target(teacher, x_eval)
    p0 = init_params(seed, hid)
    phi = [p0.clone() for _ in range(R)]
    m = [torch.zeros_like(p0) for _ in range(R)]
    e = [torch.zeros_like(p0) for _ in range(R)]
    opt_state = [None] * R
    theta_keep = [None] * R  # streaming rules: θ outside the synced fragment goes on
    alpha, beta, gamma = 0.5, 0.7, 0.7
    kind, k, every = rule
    for rnd in range(a.rounds):
        thetas = []
        for i in range(R):
            th = (phi[i] if theta_keep[i] is None else theta_keep[i]).clone().requires_grad_(True)
            opt = torch.optim.AdamW([th], lr=3e-3, weight_decay=0.0)
            if opt_state[i] is not None:
                opt.load_state_dict(opt_state[i])
            for _ in range(H):
                x = torch.randn(32, D_IN, generator=g) + centres[i]
                loss = torch.nn.functional.mse_loss(forward(th, x, hid), target(teacher, x))
                opt.zero_grad()
                loss.backward()
                opt.step()
            opt_state[i] = opt.state_dict()
            thetas.append(th.detach())
        perm = torch.randperm(R, generator=g).tolist()
        pairs = [perm[j:j + 2] for j in range(0, R, 2)]
        new_phi = [None] * R
        for pair in pairs:
            if kind == "dense":
                mean_theta = sum(thetas[i] for i in pair) / len(pair)
                for i in pair:
                    m[i] = alpha * m[i] + beta * (mean_theta - phi[i])
                    new_phi[i] = phi[i] + m[i]
                continue
            if kind in ("rand", "rot", "stream", "draw"):
                # The pair's shared mask (both draw it from the round's seed): NoLoCo's step on
                # the masked values (their θ sent in fp16), the local-only step elsewhere.
                if kind == "rand":
                    mg = torch.Generator().manual_seed(seed * 100003 + rnd * 1009 + pair[0])
                    mask = (torch.rand(p0.numel(), generator=mg) < k / 1000.0).float()
                elif kind == "draw":  # a contiguous fragment drawn per pair (grove-node's rule)
                    F = round(1000 / k)
                    n = p0.numel()
                    mg = torch.Generator().manual_seed(seed * 100003 + rnd * 1009 + pair[0])
                    f = int(torch.randint(F, (1,), generator=mg))
                    mask = torch.zeros(n)
                    mask[f * n // F:(f + 1) * n // F] = 1.0
                else:  # rot, stream: fragment rnd mod F of F contiguous ones, the same for every pair
                    F = round(1000 / k)
                    n = p0.numel()
                    f = rnd % F
                    mask = torch.zeros(n)
                    mask[f * n // F:(f + 1) * n // F] = 1.0
                mean_theta = sum(thetas[i] for i in pair) / len(pair)
                if kind == "stream":
                    # Streaming (as Streaming DiLoCo's fragments): NoLoCo's step on the fragment
                    # (its Δ gathered over F rounds), φ and m unchanged elsewhere, where θ goes on.
                    for i in pair:
                        m[i] = mask * (alpha * m[i] + beta * (mean_theta - phi[i])) + (1 - mask) * m[i]
                        new_phi[i] = phi[i] + mask * m[i]
                        theta_keep[i] = mask * new_phi[i] + (1 - mask) * thetas[i]
                    continue
                for i in pair:
                    avg = beta * (mean_theta - phi[i])
                    own = -beta * (phi[i] - thetas[i])
                    m[i] = alpha * m[i] + mask * avg + (1 - mask) * own
                    new_phi[i] = phi[i] + m[i]
                continue
            sent = {}
            for i in pair:
                delta = phi[i] - thetas[i]
                e[i] = 0.95 * e[i] + delta
                sent[i] = topk_message(e[i], a.chunk, k)
                e[i] = e[i] - sent[i]
            mean_sent = sum(sent[i] for i in pair) / len(pair)
            consensus = every > 0 and (rnd + 1) % every == 0
            mean_phi = sum(phi[i] for i in pair) / len(pair)
            for i in pair:
                step = -beta * mean_sent
                if consensus:
                    step = step - gamma * (phi[i] - mean_phi)
                m[i] = alpha * m[i] + step
                new_phi[i] = phi[i] + m[i]
        phi = new_phi
    losses = [torch.nn.functional.mse_loss(forward(p, x_eval, hid), y_eval).item() for p in phi]
    mean = torch.stack(phi).mean(0)
    spread = math.sqrt(sum(((p - mean) ** 2).mean().item() for p in phi) / R)
    return sum(losses) / R, spread


def bytes_per_param(rule, chunk):
    kind, k, every = rule
    if kind == "dense":
        return 2.0
    if kind in ("rand", "rot", "stream", "draw"):
        return k / 1000.0 * 2
    return k / chunk * 6 + (2.0 / every if every else 0.0)


def name(rule):
    kind, k, every = rule
    if kind == "dense":
        return "dense"
    if kind in ("rand", "rot", "stream", "draw"):
        return f"{kind}{k / 10:g}%"
    return f"cΔ{k}/" + (str(every) if every else "none")


def main():
    a = parse()
    rules = ([("dense", 0, 0)] + [("c", int(k), int(K)) for k in a.topk.split(",") if int(k)
                                  for K in a.every.split(",")] +
             [("rand", int(float(r) * 10), 0) for r in a.random.split(",") if r] +
             [("rot", int(float(r) * 10), 0) for r in a.rotate.split(",") if r] +
             [("stream", int(float(r) * 10), 0) for r in a.stream.split(",") if r] +
             [("draw", int(float(r) * 10), 0) for r in a.draw.split(",") if r])
    results = {}
    for rule in rules:
        ls, ss = [], []
        for s in range(a.seeds):
            loss, spread = run(rule, s + 1, a)
            ls.append(loss)
            ss.append(spread)
        results[name(rule)] = (sum(ls) / len(ls), sum(ss) / len(ss), bytes_per_param(rule, a.chunk))
    ref = results["dense"][0]
    print(f"{'rule':<12} {'loss':>8} {'gap':>8} {'spread':>8} {'B/param':>8}")
    last = []
    for n, (loss, spread, b) in results.items():
        gap = 100 * (loss / ref - 1)
        print(f"{n:<12} {loss:8.5f} {gap:+7.2f}% {spread:8.5f} {b:8.4f}")
        if n != "dense":
            last.append(f"{n} {b:.3f} {gap:+.2f}%")
    print("noloco-compress: " + " ".join(last))


if __name__ == "__main__":
    main()
