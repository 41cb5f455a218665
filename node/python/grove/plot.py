"""Plots of a run from grove-node's metrics files (``--metrics FILE``, JSON lines): loss and eval
loss against steps and against time for every node (the loss floor dashed, where the workload
knows it), the sync time of every round, and the bytes every round moved.

    grove-node plot a.jsonl b.jsonl c.jsonl -o run.png
    /usr/bin/python3 -m grove.plot a.jsonl b.jsonl -o run.png

Needs Debian's python3-matplotlib. It reads the files only (nothing of the package's own: it
runs without torch too, and grove-node carries a copy of it for ``grove-node plot``). Lines that
do not parse, and values that are not finite numbers, are left out.
"""
import argparse
import json
import math
import os
import sys

MAX_LINE = 1 << 20  # a metrics line is a few hundred bytes; anything longer is not one


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and \
        math.isfinite(v) else None


def read(path):
    """The events of one metrics file, as dicts (bad lines skipped)."""
    out = []
    with open(path, "rb") as f:
        for raw in f:
            if len(raw) > MAX_LINE:
                continue
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if isinstance(e, dict) and isinstance(e.get("event"), str):
                out.append(e)
    return out


def series(events):
    """Per node id: steps, times, losses, evals, the rounds' sync and bytes."""
    nodes = {}
    for e in events:
        node = str(e.get("node", "?"))[:16]
        n = nodes.setdefault(node, {"loss": [], "eval": [], "sync": [], "bytes": [],
                                    "floor": None, "t0": None})
        t = _num(e.get("time"))
        step = _num(e.get("step"))
        if t is not None and (n["t0"] is None or t < n["t0"]):
            n["t0"] = t
        floor = _num(e.get("loss_floor"))
        if floor is not None:
            n["floor"] = floor
        loss, ev = _num(e.get("loss")), _num(e.get("eval_loss"))
        if step is not None and t is not None:
            if loss is not None and e["event"] == "round":
                n["loss"].append((step, t, loss))
            if ev is not None and e["event"] in ("eval", "start", "stop", "synced"):
                n["eval"].append((step, t, ev))
        if e["event"] == "round":
            r = _num(e.get("round"))
            sync = _num(e.get("sync_ms"))
            sent, recv = _num(e.get("round_bytes_sent")), _num(e.get("round_bytes_received"))
            if r is not None and sync is not None:
                n["sync"].append((r, sync / 1000.0))
            if r is not None and sent is not None and recv is not None:
                n["bytes"].append((r, (sent + recv) / 1e6))
    return nodes


def plot(paths, out, title=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("grove plot: matplotlib is missing (Debian: apt-get install "
                         "python3-matplotlib)\n")
        return 1
    events = []
    for p in paths:
        try:
            events += read(p)
        except OSError as e:
            sys.stderr.write("grove plot: %s: %s\n" % (p, e.strerror))
            return 1
    nodes = series(events)
    if not nodes:
        sys.stderr.write("grove plot: no events in %s\n" % ", ".join(paths))
        return 1
    t0 = min(n["t0"] for n in nodes.values() if n["t0"] is not None)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    (a_step, a_time), (a_sync, a_bytes) = ax
    floor = None
    for i, (node, n) in enumerate(sorted(nodes.items())):
        c = "C%d" % (i % 10)
        label = node[:8]
        if n["loss"]:
            a_step.plot([s for s, _, _ in n["loss"]], [v for _, _, v in n["loss"]], color=c,
                        alpha=0.35, lw=1, label=None if n["eval"] else label)
        if n["eval"]:
            a_step.plot([s for s, _, _ in n["eval"]], [v for _, _, v in n["eval"]], color=c,
                        marker=".", lw=1.5, label=label)
            a_time.plot([(t - t0) / 60 for _, t, _ in n["eval"]], [v for _, _, v in n["eval"]],
                        color=c, marker=".", lw=1.5, label=label)
        elif n["loss"]:
            a_time.plot([(t - t0) / 60 for _, t, _ in n["loss"]], [v for _, _, v in n["loss"]],
                        color=c, lw=1, label=label)
        if n["sync"]:
            a_sync.plot([r for r, _ in n["sync"]], [v for _, v in n["sync"]], color=c, marker=".",
                        lw=1, label=label)
        if n["bytes"]:
            a_bytes.plot([r for r, _ in n["bytes"]], [v for _, v in n["bytes"]], color=c,
                         marker=".", lw=1, label=label)
        floor = n["floor"] if n["floor"] is not None else floor
    for a in (a_step, a_time):
        if floor is not None:
            a.axhline(floor, color="k", ls="--", lw=1, label="floor")
        a.set_ylabel("loss (thin) and eval loss (dots)" if a is a_step else "eval loss")
        a.grid(alpha=0.3)
    a_step.set_xlabel("inner steps")
    a_time.set_xlabel("minutes since the first start")
    a_sync.set_xlabel("round")
    a_sync.set_ylabel("sync time (s): submit to new weights")
    a_bytes.set_xlabel("round")
    a_bytes.set_ylabel("MB sent + received in the round")
    for a in (a_sync, a_bytes):
        a.grid(alpha=0.3)
    a_step.legend(fontsize=8)
    if any(n["sync"] for n in nodes.values()):
        a_sync.legend(fontsize=8)
    fig.suptitle(title or "grove-node: %d nodes (%s)" % (
        len(nodes), ", ".join(os.path.basename(p) for p in paths[:4]) +
        (", ..." if len(paths) > 4 else "")))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("grove plot: wrote %s (%d nodes, %d events)" % (out, len(nodes), len(events)))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="grove-node plot",
                                 description="Plots a run from grove-node --metrics files.")
    ap.add_argument("metrics", nargs="+", help="JSON-lines metrics files, one per node")
    ap.add_argument("-o", "--out", default="run.png", help="PNG to write (default run.png)")
    ap.add_argument("--title", help="the figure's title")
    a = ap.parse_args(argv)
    return plot(a.metrics, a.out, a.title)


if __name__ == "__main__":
    sys.exit(main())
