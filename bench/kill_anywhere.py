#!/usr/bin/python3
"""kill -9 at random instants of a node's life; every restart must resume and rejoin.

A swarm of `--nodes` grove-node processes (mlp tiny, 20 inner steps a round, 1 s windows, a
checkpoint every round) trains on loopback. Then, `--kills` times, one node drawn at random is
killed with SIGKILL at a random instant of its life and restarted on its state directory with
neither --peer nor the swarm key (both are in the state directory: the restart must find its
swarm through its saved contacts):

  - three kills in four come at a time drawn from [0, --window] s after the victim's last start:
    while it loads its checkpoint, dials its contacts, fetches the swarm's state, trains, averages,
    writes a checkpoint or serves a joiner — wherever that instant falls;
  - every fourth waits until the victim has averaged with the swarm since its restart (it has
    rejoined), then kills it within two rounds.

Each restart is checked: it loads a valid checkpoint (its `resumed` or `synced` line: a node
restarted without --peer and without a checkpoint could not find its run), and it rejoins (a round
averaged with a partner) — within 120 s when it was given the time (every fourth, and the last of
each node), or before its kill when the kill came later. A node exiting by itself is a crash.

Last line:
  kill_anywhere: K kills (E early, L late), R/S restarts resumed from a valid checkpoint,
  J/G rejoined, torn checkpoints skipped T, crashes C

Standard library only; the nodes' logs stay in --out (default: a temporary directory, removed).
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nodebench as nb  # noqa: E402

RUN = ["--workload", "mlp", "--model-size", "tiny", "--inner-steps", "20", "--lr", "0.01",
       "--warmup", "10", "--schedule-steps", "100000", "--eval-every", "20", "--window-ms", "1000"]
STARTED = re.compile(r"^\s*(resumed|synced)\s+round (\d+)")


class Life:
    """One incarnation of a node: its process, stdout and metrics files."""

    def __init__(self, binary, work, name, k, args):
        self.name, self.k = name, k
        self.state_dir = os.path.join(work, name)
        base = os.path.join(work, "%s.%d" % (name, k))
        self.out, self.metrics = base + ".out", base + ".jsonl"
        argv = [binary, "--listen", "127.0.0.1:0", "--state-dir", self.state_dir,
                "--metrics", self.metrics, "--no-progress", "--threads", "1"] + args
        self.f = open(self.out, "w")
        self.proc = nb.spawn(argv, stdout=self.f, stderr=subprocess.STDOUT)
        self.started_at = time.monotonic()
        self.killed = self.crashed = False

    def text(self):
        try:
            with open(self.out) as f:
                return f.read()
        except OSError:
            return ""

    def started(self):
        return any(STARTED.match(l) for l in self.text().splitlines())

    def averaged(self):
        return any(e.get("event") == "round" and e.get("partners")
                   for e in nb.read_metrics(self.metrics))

    def address(self):
        m = re.search(r"^\s*listening (\S+)", self.text(), re.M)
        return m.group(1) if m else None

    def kill(self):
        self.killed = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.f.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--window", type=float, default=30.0,
                    help="early kills come within this many seconds of a start")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="keep the logs here")
    a = ap.parse_args()
    binary = nb.check_binary(a.binary)
    rng = random.Random(a.seed)
    work = nb.fresh_dir(a.out) if a.out else tempfile.mkdtemp(prefix="grove-kill.")
    lives, crashes, torn = {}, [], 0
    early = late = early_averaged = 0
    resumed = restarts_seen = 0
    rejoined = given = 0
    try:
        boot = Life(binary, work, "n0", 0, ["--bootstrap", "--checkpoint-every", "1"] + RUN)
        addr = nb.wait_until("n0's address", boot.address, 60)
        lives["n0"] = boot
        key = ["--swarm-key-file", os.path.join(work, "n0", "swarm.key")]
        for i in range(1, a.nodes):
            n = "n%d" % i
            lives[n] = Life(binary, work, n, 0, ["--peer", addr] + key + ["--checkpoint-every", "1"])
        for n, l in lives.items():
            nb.wait_until(n + " averaging", l.averaged, 180)
            nb.wait_until(n + "'s first checkpoint",
                     lambda l=l: os.path.exists(os.path.join(l.state_dir, "checkpoint.bin")), 60)
        t0 = time.monotonic()
        for kill in range(1, a.kills + 1):
            for n, l in lives.items():  # a node that exited by itself
                if l.proc.poll() is not None and not l.killed and not l.crashed:
                    l.crashed = True
                    crashes.append("%s.%d exited %s" % (n, l.k, l.proc.returncode))
            victim = rng.choice(sorted(lives))
            l = lives[victim]
            if kill % 4 == 0:
                try:
                    nb.wait_until("%s.%d to average again" % (victim, l.k), l.averaged, 120)
                    rejoined += l.k > 0
                except nb.BenchError as e:
                    print("  %s\n%s" % (e, "\n".join(l.text().splitlines()[-15:])))
                given += l.k > 0
                time.sleep(rng.uniform(0, 2 * 2.0))  # within two rounds of that
                late += 1
                phase = "late"
            else:
                at = l.started_at + rng.uniform(0, a.window)
                while time.monotonic() < at and l.proc.poll() is None:
                    time.sleep(0.05)
                early += 1
                phase = "early"
            age = time.monotonic() - l.started_at
            if l.k > 0:  # (the first incarnations started fresh)
                # A restart killed within its first 20 s may not have loaded anything yet.
                if l.started() or age >= 20:
                    restarts_seen += 1
                    resumed += l.started()
                if phase == "early":
                    early_averaged += l.averaged()
            l.kill()
            if l.proc.returncode != -signal.SIGKILL and not l.crashed:
                crashes.append("%s.%d exited %s before its kill" % (victim, l.k, l.proc.returncode))
            torn += len(re.findall(r"\] checkpoint: checkpoint", l.text()))
            lives[victim] = Life(binary, work, victim, l.k + 1, [])
            if kill % 10 == 0 or kill == a.kills:
                print("%4d kills in %4.0f s: last %s at %.1f s of its life (%s); restarts "
                      "resumed %d/%d, rejoined %d/%d (given 120 s), crashes %d"
                      % (kill, time.monotonic() - t0, victim, age, phase, resumed, restarts_seen,
                         rejoined, given, len(crashes)), flush=True)
        # The last incarnations: each must resume and rejoin.
        for n, l in lives.items():
            if l.k == 0:
                continue
            restarts_seen += 1
            given += 1
            try:
                nb.wait_until(n + " to start", l.started, 90)
                resumed += 1
                nb.wait_until(n + " to average", l.averaged, 120)
                rejoined += 1
            except nb.BenchError as e:
                print("  %s\n%s" % (e, "\n".join(l.text().splitlines()[-15:])))
        for n, l in lives.items():
            if l.proc.poll() is not None and not l.killed and not l.crashed:
                crashes.append("%s.%d exited %s" % (n, l.k, l.proc.returncode))
            torn += len(re.findall(r"\] checkpoint: checkpoint", l.text()))
        for c in crashes:
            print("  crash: %s" % c)
        print("(early kills that came after the restart had averaged again: %d of %d)"
              % (early_averaged, early))
        print("kill_anywhere: %d kills (%d early, %d late), %d/%d restarts resumed from a valid "
              "checkpoint, %d/%d rejoined, torn checkpoints skipped %d, crashes %d"
              % (a.kills, early, late, resumed, restarts_seen, rejoined, given, torn,
                 len(crashes)))
        return 0 if not crashes else 1
    finally:
        for l in lives.values():
            if l.proc.poll() is None:
                l.proc.send_signal(signal.SIGTERM)
        for l in lives.values():
            try:
                l.proc.wait(timeout=60)
            except Exception:
                l.proc.kill()
        if not a.out:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
