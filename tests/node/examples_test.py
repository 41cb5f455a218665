#!/usr/bin/python3
"""Grove's examples for PyTorch (node/python/examples) on a local two-node swarm, as their
docstrings tell a user to run them: a bootstrap node and its trainer, a second node started with
the join command the first prints, and its trainer with another data seed.

Per example: both trainers end with 0 after their steps, and
  - ddp, demo: both members print the same validation loss at every step they print (one set of
    weights: average_gradients and DeMo's sign step give every member the same bits), in a group
    of two;
  - diloco, sparseloco: both print sync lines (their outer steps).
The last printed validation loss is below the fresh model's (ln 256 = 5.55 for bytes).

Usage: examples_test.py GROVE_NODE [ddp|diloco|sparseloco|demo ...] (default: all four).
Exit 77 (skipped) without torch/msgpack. Waits on conditions with deadlines, never on sleeps.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "..", "node", "python"))
EXAMPLES = os.path.join(PKG, "examples")
sys.path.insert(0, HERE)
from trainer_test import Fail, wait_until  # noqa: E402

ALL = ("ddp", "diloco", "sparseloco", "demo")
FRESH = 5.545  # ln 256: a byte model that knows nothing
STEP = re.compile(r"step (\d+): loss [0-9.]+, val ([0-9.]+)(.*)")
SYNC = re.compile(r"sync (\d+) \(step (\d+)\): loss [0-9.]+, val ([0-9.]+)")


def run_example(binary, name, work):
    env = dict(os.environ, PYTHONPATH=PKG)
    procs = []

    def node(tag, extra):
        log = open(os.path.join(work, tag + ".log"), "w")
        p = subprocess.Popen([binary, "--listen", "127.0.0.1:0",
                              "--no-upnp", "--no-progress", "--state-dir",
                              os.path.join(work, tag)] + extra,
                             stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    def trainer(tag, seed):
        sock = os.path.join(work, tag, "trainer.sock")
        wait_until(tag + "'s trainer socket", lambda: os.path.exists(sock), 60)
        out = open(os.path.join(work, "t" + tag + ".log"), "w")
        more = ["--H", "20"] if name in ("diloco", "sparseloco") else []
        p = subprocess.Popen(["/usr/bin/python3", os.path.join(EXAMPLES, name + ".py"),
                              "--socket", sock, "--steps", "100", "--wait-for", "2",
                              "--seed", str(seed)] + more,
                             stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        return p

    try:
        node("a", ["--bootstrap", "--workload", "external", "--window-ms", "1000"])
        ta = trainer("a", 0)
        join = []

        def joined():
            with open(os.path.join(work, "a.log")) as f:
                m = re.search(r"--peer (\S+) --swarm-key ([0-9a-f]+)", f.read())
            if m:
                join[:] = ["--peer", m.group(1), "--swarm-key", m.group(2)]
            return bool(m)
        wait_until("a's join command", joined, 60)
        node("b", join)
        tb = trainer("b", 1)
        for tag, t in (("a", ta), ("b", tb)):
            try:
                rc = t.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise Fail("%s: trainer %s did not end within 300 s" % (name, tag))
            if rc != 0:
                raise Fail("%s: trainer %s ended with %d" % (name, tag, rc))
        out = {}
        for tag in ("a", "b"):
            with open(os.path.join(work, "t" + tag + ".log")) as f:
                out[tag] = f.read()
        check(name, out)
        print("%s: ok (%s)" % (name, "; ".join(
            "%s: %s" % (tag, out[tag].strip().splitlines()[-1]) for tag in ("a", "b"))))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def check(name, out):
    if name in ("ddp", "demo"):
        steps = {tag: {int(m.group(1)): (float(m.group(2)), m.group(3))
                       for m in STEP.finditer(out[tag])} for tag in out}
        if not steps["a"] or set(steps["a"]) != set(steps["b"]):
            raise Fail("%s: the trainers printed different steps: %s" % (name, out))
        for s in sorted(steps["a"]):
            va, vb = steps["a"][s][0], steps["b"][s][0]
            if va != vb:
                raise Fail("%s: step %d: val %.3f on a, %.3f on b (the members' weights "
                           "differ)" % (name, s, va, vb))
            for tag in out:
                if not re.search(r"of 2\b", steps[tag][s][1]):
                    raise Fail("%s: step %d of %s not in a group of two: %s"
                               % (name, s, tag, steps[tag][s][1]))
        last = steps["a"][max(steps["a"])][0]
    else:
        syncs = {tag: [float(m.group(3)) for m in SYNC.finditer(out[tag])] for tag in out}
        for tag in out:
            if len(syncs[tag]) < 2:
                raise Fail("%s: trainer %s printed %d sync lines: %s"
                           % (name, tag, len(syncs[tag]), out[tag]))
        last = syncs["a"][-1]
    if not last < FRESH - 1.0:
        raise Fail("%s: the last val %.3f is not below the fresh model's %.3f by 1"
                   % (name, last, FRESH))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    try:
        import torch  # noqa: F401
        import msgpack  # noqa: F401
    except ImportError as e:
        print("skipped: %s" % e)
        return 77
    binary = os.path.abspath(sys.argv[1])
    names = sys.argv[2:] or list(ALL)
    for n in names:
        if n not in ALL:
            print("unknown example %r (one of %s)" % (n, ", ".join(ALL)))
            return 2
    work = tempfile.mkdtemp(prefix="grove-examples.")
    try:
        for n in names:
            d = os.path.join(work, n)
            os.makedirs(d)
            run_example(binary, n, d)
    except Fail as e:
        print("FAIL: %s" % e)
        for root, _, files in os.walk(work):
            for f in sorted(files):
                if f.endswith(".log"):
                    with open(os.path.join(root, f), errors="replace") as fh:
                        print("---- %s\n%s" % (os.path.join(root, f), fh.read()[-3000:]))
        return 1
    finally:
        if os.environ.get("GROVE_TEST_KEEP"):
            print("logs kept in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
