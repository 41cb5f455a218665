#!/usr/bin/python3
"""Draws the PNG of a grove-sim experiment from its CSV: plot.py KIND CSV PNG.

Called by grove-sim after it wrote the CSV; exits 3 (and grove-sim keeps the CSV) when
matplotlib is missing (apt-get install python3-matplotlib)."""

import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def sync_time(data, ax):
    n = [num(r["nodes"]) for r in data]
    series = [("noloco_s", "NoLoCo pair exchange (simulated)", "o-"),
              ("ring_s", "DiLoCo ring all-reduce (simulated)", "s-"),
              ("sparseloco_s", "SparseLoCo all-gather, top-64/4096 (simulated)", "^-"),
              ("e3m0_s", "E3M0 DiLoCo all-reduce, 4-bit partial sums (simulated)", "v-"),
              ("tree_pipelined_s", "tree all-reduce, pipelined (α–β model)", "--"),
              ("tree_store_forward_s", "tree all-reduce, store-and-forward (α–β model)", ":")]
    for key, label, style in series:
        if key in data[0]:
            ax.plot(n, [num(r.get(key)) for r in data], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes N")
    ax.set_ylabel("time of one averaging step (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def lines_by(data, ax, x, y, group, xlabel, ylabel, logy=False):
    groups = {}
    for r in data:
        groups.setdefault(r[group], []).append((num(r[x]), num(r[y])))
    for g, pts in groups.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=g)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    kind, src, png = sys.argv[1:]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: CSV only", file=sys.stderr)
        return 3
    data = rows(src)
    if kind == "sync-time":
        fig, ax = plt.subplots(figsize=(8, 5.5))
        sync_time(data, ax)
        ax.set_title("One averaging step vs swarm size")
    elif kind == "spread":
        fig, axes = plt.subplots(1, 2, figsize=(12, 5))
        lines_by(data, axes[0], "nodes", "final_loss", "series", "nodes N", "final loss", True)
        lines_by(data, axes[1], "nodes", "final_spread", "series", "nodes N",
                 "replica spread (RMS distance to the mean)", True)
        axes[0].set_xscale("log", base=2)
        axes[1].set_xscale("log", base=2)
    elif kind == "dht-churn":
        fig, axes = plt.subplots(1, 2, figsize=(12, 5))
        lines_by(data, axes[0], "minute", "success", "series", "minutes", "lookups that found the value")
        lines_by(data, axes[1], "minute", "latency_p50_ms", "series", "minutes",
                 "lookup latency, median (ms)")
    elif kind == "churn":
        fig, ax = plt.subplots(figsize=(8, 5.5))
        lines_by(data, ax, "minute", "mean_loss", "series", "minutes", "mean loss of live nodes",
                 True)
    elif kind == "scale":
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
        for col, label in (("dht_kBps_mean", "mean"), ("dht_kBps_p95", "p95"),
                           ("dht_kBps_max", "busiest node")):
            pts = sorted((num(r["nodes"]), num(r[col])) for r in data if col in r)
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        axes[0].set_xlabel("nodes N")
        axes[0].set_ylabel("DHT bytes sent per node (kB/s)")
        axes[0].set_yscale("log")
        axes[0].grid(True, alpha=0.3)
        axes[0].legend(fontsize=8)
        lines_by(data, axes[1], "nodes", "join_p95_s", "series", "nodes N",
                 "join to state, p95 (s)")
        lines_by(data, axes[2], "nodes", "averaged_share", "series", "nodes N",
                 "rounds averaged with a partner")
        for ax in axes:
            ax.set_xscale("log", base=2)
    elif kind == "noloco-sweep":
        fig, ax = plt.subplots(figsize=(10, max(4, 0.3 * len(data))))
        labels = [r["setting"] for r in data]
        vals = [num(r["final_loss"]) for r in data]
        ref = vals[0] if vals else 1.0
        cap = 3 * ref  # diverged settings are drawn at the cap and labelled
        for i, v in enumerate(vals):
            if not v < 10 * ref:
                labels[i] += "  (diverged)"
            elif not v < cap:
                labels[i] += f"  ({v / ref:.1f}x, bar cut)"
        vals = [min(v, cap) if v == v else cap for v in vals]
        ax.barh(range(len(vals)), vals)
        ax.axvline(ref, color="k", linestyle="--", linewidth=1, label="standard DiLoCo")
        ax.legend(fontsize=8)
        ax.set_yticks(range(len(vals)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("final loss (lower is better)")
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    else:
        print(f"unknown kind {kind}", file=sys.stderr)
        return 2
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
