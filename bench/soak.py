#!/usr/bin/python3
"""Soak and chaos: a swarm on flaky links, killed, stopped, restarted and joined for --minutes.

Usage: soak.py GROVE_NODE [--minutes 60] [--nodes 8] [--seed 1] [--out DIR] ...

The swarm. `--nodes` grove-node processes (default 8) on loopback, `--threads 1` each:
  - the main swarm, N - T nodes of a fast workload (mlp tiny, 20 inner steps a round, 1 s
    windows: kill_anywhere.py's run), bootstrapped by m0, the others joining with --peer and the
    bootstrap's swarm key;
  - the trainer swarm, T = --trainer-nodes nodes (default 2, 0 without torch) of --workload
    external, each driven by a PyTorch trainer (the grove package, node/python, run by
    /usr/bin/python3: bench/soak_trainer.py). The workload is part of the run config fixed at
    bootstrap, so external nodes cannot join the mlp run: they are a swarm of their own.
Every node runs with `--emulate-link RATE,RTT,LOSS` (default 100mbit,RTT,0.01: 1% of the frames
it sends vanish; RTT drawn per node from --rtt-ms, default 20-80 ms, which stands in for jitter
across links: the option has no jitter or stall knob, SIGSTOP gives the stalls).
The main swarm switches between NoLoCo and DiLoCo every --mode-minutes (default minutes/3, 1 to
5): `grove-node request diloco|noloco --state-dir DIR` against a live member.

The chaos schedule. Every 5-20 s (random, --seed), one of (weights 3:2:2:2:1 among those
possible then), on a node drawn among the idle ones:
  - kill: SIGKILL, then after 0.5-5 s a restart on the same state directory with neither --peer
    nor the swarm key (kill_anywhere.py's restart: both are in the state directory);
  - term: SIGTERM (the node must finish its round and exit 0 within 120 s), then the same restart;
  - stop: SIGSTOP for 5-60 s, then SIGCONT;
  - join: a fresh node (new state dir, --peer a live member, --swarm-key-file the bootstrap's
    key; that member is held until the joiner has synced); while the main swarm is above N - T
    nodes, a random idle member is retired (SIGTERM, exit 0, not restarted);
  - trainer: the trainer of a trainer-swarm node is killed (SIGKILL) and started again after
    0.5-5 s: the node must stay up, the new trainer attach with its own state restored
    (`Node.restored`: optimiser and data position saved after the node's last checkpoint) and
    the node end a round after it.
A node is the target of one event at a time: from the first signal until its restart has been
checked (or the stop has ended) it is busy and drawn for nothing else. kill, term, stop and the
retirement of a join take a node away only while more than half of its swarm's members stay up
(running, not stopped, not busy); the trainer swarm (two nodes) only gets trainer kills.

The checks, all the time:
  - crash: a node process that exits while we did not signal it, or exits non-zero after our
    SIGTERM; a trainer that exits by itself.
  - hang: a node that is up (running, not stopped by us, not stopping after our SIGTERM) and has
    ended no round (no `round` event in its --metrics) for --hang-seconds (default 180 s: a
    DiLoCo member may wait 120 s for its group, then run an all-reduce whose deadline is at
    least 60 s; gaps of up to 121 s were seen in runs that were fine, and NoLoCo rounds come
    every 1-3 s), counted from the later of its last round and the end of its grace: --grace
    seconds (default 90) after a start, a restart, a SIGCONT or a new trainer. A node still
    running 120 s after our SIGTERM is a hang too. Each hang is counted once, then the node is
    watched anew.
  - progress: more than 0 `round` events across all nodes in every minute.
  - DiLoCo rounds bit-identical: a DiLoCo `round` event that is not local_only names its ring's
    other survivors in `partners`; the `round` field is the round the node's state is at after
    it. For every such event of X naming Y, Y's DiLoCo event of the same round naming X (the
    nearest in time, within 60 s) must carry the same `param_hash` (16 hex digits of φ's
    BLAKE2b). A member left out or excluded (a failed all-reduce), one that re-synced or caught
    up, writes a `synced` event, not a `round`, so it is never compared; a group whose members
    entered with different φ averages φ first (the round's note says so) and must still end
    identical. "divergent rounds D" counts the (round, ring) pairs that broke this, and only D
    fails the run. Printed besides, not failed (the protocol allows them and repairs them):
    "one-sided ends", X's averaged round names Y while Y's round of that number names no X and
    has another hash (Y excluded X after X had all it needed: a lost last frame; X's judge then
    re-syncs it); "rounds ended with several hashes", rounds the swarm ended in disjoint rings
    (e.g. a ring that went on with a majority of its group while others were stopped, then a
    pair a window later), which the catch-up repairs; and the nodes' ConsistencyJudge lines
    ("slow weights differ": a member record's hash of the round differs from ours) and repairs
    (re-syncs it ordered).
  - restarts: each restart prints `resumed round R` (its checkpoint) or `synced round R` (the
    swarm's state) within 90 s and averages a round (a `round` event with partners) within 300 s
    after that (PCCL's harness fails after 5 minutes without a reduce); a joiner likewise. The
    time each took is printed (how many within 120 s, kill_anywhere.py's bound without chaos,
    and the slowest): a DiLoCo member that syncs into a round may wait up to 120 s for its group,
    and a group split by different reads of its ready records costs its outsider 10 s per
    member it suspects before it re-syncs. A trainer must attach again with its state restored
    within 90 s and its node end a round within 300 s after that.
  - loss: a baseline runs first: the same nodes, run config, link emulation and mode schedule,
    no chaos, for --baseline-minutes (default min(minutes, 10)). L and L0 are the medians of the
    live main-swarm nodes' last eval losses at the end of each run (mlp: MSE, floor 0.010).
    "Close" means L <= L0 * (1 + --loss-tolerance) (default 1.0: at most twice L0). Runs
    without chaos differ by up to 3x at 1-3 minutes (0.054-0.166 at 1 minute: the loss falls
    from 0.5-1.0, and how many rounds a node ends in DiLoCo under packet loss varies), and chaos
    costs averaged rounds; a model poisoned by a fault ends far above (NaN, or the first eval's
    0.5-1.0). It may end better. Compare like with like: at 3 minutes the loss is still falling
    fast (every round is 20 steps), so a baseline shorter than the soak gives a higher L0; with
    the default baseline (min(minutes, 10)) both runs are equally long up to 10 minutes.
    --baseline-minutes 0 skips it (L0 is then nan and the loss is not judged).
At the end, chaos stops, stopped nodes get SIGCONT and restarts under way are finished and
checked, the losses are taken, and every node gets SIGTERM and must exit 0.

Output: one row per minute (minute, live nodes, rounds ended that minute, the modes of those
rounds, kills (SIGKILL and SIGTERM restarts), stops, restarts, joins and trainer kills of that
minute, median eval loss of the live main-swarm nodes), the baseline's rows first; then the
failures, the judge's figures, and last:

  soak: M min, K kills, S stops, R restarts, J joins, crashes C, hangs H, divergent rounds D,
  loss L vs L0 without chaos

Exit status 1 when C, H or D is not 0 (in the soak or the baseline), a restart, join or trainer
failed to resume or rejoin, a minute ended no round, or L is not close to L0; 130 on Ctrl-C.
The nodes' logs (<name>.<incarnation>.out/.jsonl, <name>.trainer.*) stay in --out (default a
temporary directory, removed unless the run failed). Standard library only (the trainer
processes use torch), with nodebench.py's helpers; every child is stopped on exit and Ctrl-C.
Wall time: about 2 x --minutes + 1.5 minutes with the default baseline (3 min: 7.4-8.9 min on
the 2-core build machine, where 8 mlp nodes and 2 trainers keep the load under 1).
"""

import argparse
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nodebench as nb  # noqa: E402
from soak_swarm import (  # noqa: E402
    tail,
    Slot,
    Restart,
    Stop,
    Join,
    Retire,
    TrainerKill,
    PYTHON,
    REJOIN_S,
    RUN,
    EXT_RUN,
    WEIGHTS,
    START_S,
    REJOIN_S,
    TERM_S,
)


# ---- the harness --------------------------------------------------------------------------------
HARNESSES = []  # (stopped nodes get SIGCONT before the cleanup's SIGTERM)


class Harness:
    def __init__(self, a, binary, work, label, chaos):
        HARNESSES.append(self)
        self.a, self.binary, self.work, self.label, self.chaos = a, binary, work, label, chaos
        self.rng = random.Random("%s/%d" % (label, a.seed))
        self.rtt = {}
        self.slots = {}
        self.events = []
        self.failures = []  # restart/join/trainer checks that failed, and start-up failures
        self.crashes, self.hangs = [], []
        self.counts = {}  # (minute, what) -> n
        self.tallies = {}
        self.rejoin_s = []  # from a restart's or joiner's start line to its averaged round (s)
        self.rounds_min = {}  # minute -> rounds ended (all nodes)
        self.modes_min = {}  # minute -> {mode: n} (main swarm)
        self.rounds_total = {}  # slot name -> rounds seen
        self.diloco = {}  # (node id, round) -> [(time, hash, partners, slot, life, note)]
        self.all_rounds = {}  # (node id, round) -> [(time, hash)] of every DiLoCo round event
        self.ending = False
        self.pending_retire = 0
        self.t0 = None
        self.t0_unix = time.time()
        self.key_file = None
        self.mode = "noloco"
        self.mode_requests = []

    # -- bookkeeping
    def say(self, text):
        print("  [%s %6.1f s] %s" % (self.label, time.monotonic() - (self.t0 or time.monotonic()),
                                     text), flush=True)

    def minute(self, unix=None):
        return int(((unix if unix is not None else time.time()) - self.t0_unix) // 60)

    def count(self, what):
        k = (self.minute(), what)
        self.counts[k] = self.counts.get(k, 0) + 1

    def total(self, what):
        return sum(n for (m, w), n in self.counts.items() if w == what)

    def tally(self, what):
        self.tallies[what] = self.tallies.get(what, 0) + 1

    def rejoined(self, seconds):
        self.tally("rejoined")
        self.rejoin_s.append(seconds)

    def link_of(self, name):
        if name not in self.rtt:
            lo, hi = self.a.rtt_ms
            self.rtt[name] = self.rng.randint(lo, hi)
        return "%s,%dms,%s" % (self.a.rate, self.rtt[name], self.a.loss)

    def rounds_of(self, slot):
        return self.rounds_total.get(slot.name, 0)

    def main(self):
        return [s for s in self.slots.values() if s.swarm == "main" and not s.retired]

    def hang(self, slot, what, life=None):
        life = life or slot.life
        self.hangs.append("%s.%d: %s\n%s" % (slot.name, life.k, what, tail(life.out)))
        self.say("HANG: %s.%d %s" % (slot.name, life.k, what))

    # -- start-up
    def new_slot(self, swarm):
        n = sum(1 for s in self.slots.values() if s.swarm == swarm)
        name = ("m%d" if swarm == "main" else "e%d") % n
        s = Slot(self, name, swarm)
        self.slots[name] = s
        return s

    def start(self):
        a = self.a
        self.t0 = time.monotonic()
        boot = self.new_slot("main")
        boot.start(["--bootstrap"] + RUN)
        addr = nb.wait_until("m0's address", lambda: boot.life.listening() or
                             (boot.life.proc.poll() is not None and "exited"), 60)
        if addr == "exited":
            raise nb.BenchError("m0 exited at start:\n" + tail(boot.life.out))
        self.key_file = os.path.join(boot.state_dir, "swarm.key")
        self.boot_addr = addr
        for _ in range(1, a.nodes - a.trainer_nodes):
            self.new_slot("main").start(["--peer", addr, "--swarm-key-file", self.key_file])
        if a.trainer_nodes:
            eboot = self.new_slot("ext")
            eboot.start(["--bootstrap"] + EXT_RUN)
            nb.wait_until("e's trainer socket", lambda: "grove.attach" in eboot.life.text(), 60)
            eboot.start_trainer(1)
            eaddr = nb.wait_until("e's address", eboot.life.listening, 120)
            ekey = os.path.join(eboot.state_dir, "swarm.key")
            for i in range(1, a.trainer_nodes):
                s = self.new_slot("ext")
                s.start(["--peer", eaddr, "--swarm-key-file", ekey])
                s.start_trainer(1 + i)
        self.t0 = time.monotonic()
        self.t0_unix = time.time()
        # Everyone averaging before the clock starts.
        for s in list(self.slots.values()):
            nb.wait_until(s.name + " averaging", lambda s=s: (self.poll(), s.life.averaged)[1], 180)
        for s in self.slots.values():
            s.regrace()
        self.t0 = time.monotonic()
        self.t0_unix = time.time()

    # -- watching
    def poll(self):
        now = time.monotonic()
        for s in self.slots.values():
            for life in s.lives:
                for e in life.tail.read():
                    self.on_event(s, life, e, now)
                if not life.reported and life.proc.poll() is not None:
                    life.reported = True
                    rc = life.proc.returncode
                    if life.signalled is None:
                        self.crashes.append("%s.%d exited with %s by itself\n%s"
                                            % (s.name, life.k, rc, tail(life.out)))
                        self.say("CRASH: %s.%d exited with %s by itself" % (s.name, life.k, rc))
                    elif life.signalled == signal.SIGTERM and rc != 0:
                        self.crashes.append("%s.%d exited with %s after SIGTERM\n%s"
                                            % (s.name, life.k, rc, tail(life.out)))
                        self.say("CRASH: %s.%d exited with %s after SIGTERM" % (s.name, life.k, rc))
            if s.trainer and not s.trainer_killed and not self.ending:
                p, _ = s.trainer
                if p.poll() is not None and not getattr(p, "judged", False):
                    p.judged = True
                    self.crashes.append("%s's trainer exited with %s by itself\n%s" % (
                        s.name, p.returncode,
                        tail(os.path.join(self.work, "%s.trainer.%d.out" % (s.name, s.trainer_k)))))
                    self.say("CRASH: %s's trainer exited with %s" % (s.name, p.returncode))
            # Hang: up, past its grace, no round for hang_seconds.
            if (s.life is not None and s.life.alive() and not s.stopped and not s.retired
                    and s.life.signalled is None and not s.trainer_killed):
                if now - max(s.last_round, s.watch_from) > self.a.hang_seconds:
                    self.hang(s, "no round for %.0f s (last round %s)" % (
                        self.a.hang_seconds, "%.0f s ago" % (now - s.last_round)
                        if s.last_round else "none since its (re)start or SIGCONT"))
                    s.watch_from, s.last_round = now, 0.0

    def on_event(self, s, life, e, now):
        kind = e.get("event")
        ev = e.get("eval_loss")
        if isinstance(ev, (int, float)) and math.isfinite(ev) and kind in ("eval", "round"):
            s.last_eval = ev
        s.node_id = e.get("node") or s.node_id
        if kind != "round":
            return
        if life is s.life:
            s.last_round = now
        self.rounds_total[s.name] = self.rounds_total.get(s.name, 0) + 1
        if e.get("partners"):
            life.averaged = True
        t = e.get("time", time.time())
        m = int((t - self.t0_unix) // 60)
        self.rounds_min[m] = self.rounds_min.get(m, 0) + 1
        if s.swarm == "main":
            d = self.modes_min.setdefault(m, {})
            d[e.get("mode")] = d.get(e.get("mode"), 0) + 1
        if e.get("mode") == "diloco":
            self.all_rounds.setdefault((e["node"], e["round"]), []).append(
                (t, e.get("param_hash")))
        if e.get("mode") == "diloco" and not e.get("local_only") and e.get("partners"):
            self.diloco.setdefault((e["node"], e["round"]), []).append(
                (t, e.get("param_hash"), set(e["partners"]), s.name, life.k, e.get("note", "")))

    def divergent(self):
        """({(round, ring): [what]} where two members that name each other reported different
        param_hash, the number of one-sided partners: X's averaged DiLoCo round names Y, but Y's
        events of that round name no X (Y excluded X, or X was excluded and the ring's outcome
        reached only one side), with another hash: the case the nodes' judge repairs)."""
        bad, one_sided = {}, 0
        rounds = {}
        for (node, rnd), evs in self.diloco.items():
            rounds.setdefault(rnd, set()).add(node)
        for (node, rnd), evs in self.diloco.items():
            for (t, h, partners, name, k, note) in evs:
                for p in partners:
                    near = [x for x in self.diloco.get((p, rnd), []) if abs(x[0] - t) < 60]
                    cands = [x for x in near if node in x[2]]
                    if not cands:
                        one_sided += 1 if self.any_other_hash(p, rnd, t, h) else 0
                        continue
                    o = min(cands, key=lambda x: abs(x[0] - t))
                    if o[1] != h:
                        ring = frozenset(partners | {node})
                        bad.setdefault((rnd, ring), []).append(
                            "%s.%d %s vs %s.%d %s (round %d, note %r)"
                            % (name, k, h, o[3], o[4], o[1], rnd, note))
        return bad, one_sided

    def splits(self):
        """DiLoCo rounds whose averaged ends (by any rings) carry more than one hash: the swarm
        ended the round in parts (a one-sided end, or two rings), which re-syncs repair."""
        hashes = {}
        for (node, rnd), evs in self.diloco.items():
            for x in evs:
                hashes.setdefault(rnd, set()).add(x[1])
        return sorted(r for r, h in hashes.items() if len(h) > 1)

    def any_other_hash(self, node, rnd, t, h):
        """Whether `node` ended round `rnd` near time t with a hash other than h (averaged or
        not)."""
        return any(abs(x[0] - t) < 60 and x[1] != h for x in self.all_rounds.get((node, rnd), []))

    # -- chaos
    def idle_up(self, swarm="main"):
        return [s for s in self.slots.values() if s.swarm == swarm and s.up()]

    def can_take(self, swarm="main"):
        members = [s for s in self.slots.values() if s.swarm == swarm and not s.retired]
        return len(self.idle_up(swarm)) - 1 > len(members) / 2

    def chaos_step(self, now):
        target = self.a.nodes - self.a.trainer_nodes
        if self.pending_retire and len(self.main()) > target and self.can_take():
            victim = self.rng.choice(self.idle_up())
            self.say("retire %s (SIGTERM): the main swarm is above %d nodes"
                     % (victim.name, target))
            self.events.append(Retire(self, "retire", victim))
            self.pending_retire -= 1
        elif self.pending_retire and len(self.main()) <= target:
            self.pending_retire = 0
        if now < self.next_chaos:
            return
        kinds = []
        if self.can_take():
            kinds += ["kill", "term", "stop"]
        if self.idle_up() and len(self.main()) <= target and not self.pending_retire:
            kinds.append("join")
        if any(s.up() for s in self.slots.values() if s.swarm == "ext" and s.trainer):
            kinds.append("trainer")
        if not kinds:
            self.next_chaos = now + 1.0
            return
        kind = self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        if kind == "join":
            via = self.rng.choice([s for s in self.idle_up() if s.life.listening()] or [None])
            if via is None:
                self.next_chaos = now + 1.0
                return
            s = self.new_slot("main")
            self.say("join %s through %s (%s)" % (s.name, via.name, via.life.listening()))
            self.events.append(Join(self, s, via))
        elif kind == "trainer":
            s = self.rng.choice([s for s in self.slots.values() if s.swarm == "ext" and s.up()])
            self.say("kill %s's trainer (SIGKILL) and start it again" % s.name)
            self.events.append(TrainerKill(self, "trainer", s))
        else:
            s = self.rng.choice(self.idle_up())
            self.say({"kill": "SIGKILL %s.%d, then restart it",
                      "term": "SIGTERM %s.%d, then restart it",
                      "stop": "SIGSTOP %s.%d"}[kind] % (s.name, s.life.k))
            self.events.append((Restart if kind in ("kill", "term") else Stop)(self, kind, s))
        self.next_chaos = now + self.rng.uniform(5.0, 20.0)

    def switch_mode(self):
        self.mode = "diloco" if self.mode == "noloco" else "noloco"
        cands = self.idle_up() or [s for s in self.main() if s.life and s.life.alive()]
        for s in self.rng.sample(cands, min(3, len(cands))):
            try:
                r = subprocess.run([self.binary, "request", self.mode, "--state-dir", s.state_dir],
                                   capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                self.say("request %s through %s: no answer in 30 s" % (self.mode, s.name))
                continue
            text = (r.stdout + r.stderr).strip()
            self.say("request %s through %s: %s" % (self.mode, s.name, text))
            if r.returncode == 0:
                self.mode_requests.append((time.monotonic() - self.t0, self.mode, text))
                return
        self.failures.append("request %s: no member accepted it" % self.mode)

    # -- the run
    def row(self, m):
        live = sum(1 for s in self.slots.values() if s.life and s.life.alive() and not s.stopped)
        modes = self.modes_min.get(m, {})
        mode = "+".join(k for k in ("noloco", "diloco") if modes.get(k)) or "-"
        losses = [s.last_eval for s in self.main() if s.life and s.life.alive()
                  and s.last_eval is not None]
        loss = "%.4f" % statistics.median(losses) if losses else "-"
        c = lambda w: self.counts.get((m, w), 0)
        return [self.label, str(m + 1), str(live), str(self.rounds_min.get(m, 0)), mode,
                str(c("kills")), str(c("stops")), str(c("restarts")), str(c("joins")),
                str(c("trainer kills")), loss]

    def run(self, minutes, mode_minutes):
        self.start()
        self.say("%d nodes up and averaging (%d main, %d with trainers); %s for %.1f min"
                 % (len(self.slots), len(self.main()), self.a.trainer_nodes,
                    "chaos" if self.chaos else "no chaos", minutes))
        end = self.t0 + 60 * minutes
        next_mode = self.t0 + 60 * mode_minutes
        next_row = 0
        self.next_chaos = self.t0 + self.rng.uniform(5.0, 20.0)
        rows = []
        while True:
            now = time.monotonic()
            self.poll()
            if now >= end:
                break
            if now >= next_mode:
                self.switch_mode()
                next_mode += 60 * mode_minutes
            if self.chaos:
                self.chaos_step(now)
            for e in self.events:
                if not e.done:
                    e.step(now)
            self.events = [e for e in self.events if not e.done]
            if now >= self.t0 + 60 * (next_row + 1) + 1.0:
                rows.append(self.row(next_row))
                print(fmt_row(rows[-1]), flush=True)
                next_row += 1
            time.sleep(0.2)
        # The end: no new chaos; stops end, restarts and joins are checked.
        self.ending = True
        deadline = time.monotonic() + START_S + REJOIN_S + TERM_S + 30
        while self.events and time.monotonic() < deadline:
            now = time.monotonic()
            self.poll()
            for e in self.events:
                if not e.done:
                    e.step(now)
            self.events = [e for e in self.events if not e.done]
            time.sleep(0.2)
        for e in self.events:
            e.fail("still under way at the end (phase %s)" % e.phase)
        while next_row < math.ceil(minutes - 1e-9):
            rows.append(self.row(next_row))
            print(fmt_row(rows[-1]), flush=True)
            next_row += 1
        self.poll()
        losses = [s.last_eval for s in self.main() if s.life and s.life.alive()
                  and s.last_eval is not None]
        self.loss = statistics.median(losses) if losses else float("nan")
        self.stalled = [str(m + 1) for m in range(int(minutes)) if not self.rounds_min.get(m)]
        self.stop_all()
        self.poll()
        return rows

    def stop_all(self):
        self.ending = True
        for s in self.slots.values():
            if s.stopped and s.life.alive():
                s.life.proc.send_signal(signal.SIGCONT)
                s.stopped = False
        lives = [s.life for s in self.slots.values() if s.life and s.life.alive()]
        for l in lives:
            l.signalled = signal.SIGTERM
            l.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + TERM_S
        for l in lives:
            try:
                l.proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.hang(l.slot, "still running %.0f s after the final SIGTERM" % TERM_S, l)
                l.proc.kill()
                l.proc.wait()
        for s in self.slots.values():
            if s.trainer and s.trainer[0].poll() is None:
                try:
                    s.trainer[0].wait(timeout=20)
                except subprocess.TimeoutExpired:
                    s.trainer[0].kill()
        # Shared memory left by an external node killed with SIGKILL.
        for s in self.slots.values():
            if s.swarm == "ext":
                for l in s.lives:
                    for shm in set(re.findall(r"shared memory /(grove-[0-9a-f]+)", l.text())):
                        try:
                            os.unlink("/dev/shm/" + shm)
                        except OSError:
                            pass

    def judge_lines(self):
        differ = repairs = 0
        for s in self.slots.values():
            for l in s.lives:
                t = l.text()
                differ += len(re.findall(r"slow weights differ after DiLoCo round", t))
                repairs += len(re.findall(r"are not the group's", t))
        return differ, repairs


HEADERS = ["phase", "min", "live", "rounds", "mode", "kills", "stops", "restarts", "joins",
           "tkills", "loss"]
WIDTHS = [8, 4, 5, 7, 14, 6, 6, 9, 6, 7, 8]


def fmt_row(cells):
    return "".join((c.ljust(w) if i in (0, 4) else c.rjust(w) + " ")
                   for i, (c, w) in enumerate(zip(cells, WIDTHS))).rstrip()


def torch_available():
    try:
        r = subprocess.run([PYTHON, "-c", "import torch, msgpack, numpy"], capture_output=True,
                           timeout=120)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def summarize(h, label):
    div, one_sided = h.divergent()
    differ, repairs = h.judge_lines()
    for c in h.crashes:
        print("  crash (%s): %s" % (label, c))
    for x in h.hangs:
        print("  hang (%s): %s" % (label, x))
    for f in h.failures:
        print("  failed (%s): %s" % (label, f))
    for (rnd, ring), what in sorted(div.items(), key=lambda kv: kv[0][0]):
        print("  divergent (%s): round %d, ring of %d: %s" % (label, rnd, len(ring), what[0]))
    nd = sum(len(v) for v in h.diloco.values())
    split = h.splits()
    print("%s: %d averaged DiLoCo round events compared, one-sided ends %d, rounds ended with "
          "several hashes %d%s; judge lines 'slow weights differ' %d, repairs by re-sync %d; "
          "restarts/joins rejoined %d%s, trainers reattached %d; mode requests %s; stalled "
          "minutes %s"
          % (label, nd, one_sided, len(split), " (%s)" % ", ".join(map(str, split[:10]))
             if split else "", differ, repairs, h.tallies.get("rejoined", 0),
             " (%d within %.0f s, the slowest after %.0f s)" % (
                 sum(1 for x in h.rejoin_s if x <= REJOIN_S), REJOIN_S, max(h.rejoin_s))
             if h.rejoin_s else "",
             h.tallies.get("trainer reattached", 0),
             ", ".join("%s at %.0f s" % (m, t) for t, m, _ in h.mode_requests) or "none",
             ", ".join(h.stalled) or "none"), flush=True)
    return div


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--baseline-minutes", type=float,
                    help="the run without chaos (default min(--minutes, 10); 0: none)")
    ap.add_argument("--nodes", type=int, default=8, help="all nodes, trainer nodes included")
    ap.add_argument("--trainer-nodes", type=int, default=2,
                    help="nodes with a PyTorch trainer (their own swarm; 0: none)")
    ap.add_argument("--mode-minutes", type=float,
                    help="NoLoCo/DiLoCo switch period (default minutes/3, within 1-5)")
    ap.add_argument("--rate", default="100mbit", help="--emulate-link rate")
    ap.add_argument("--rtt-ms", default="20-80", help="per-node RTT range for --emulate-link")
    ap.add_argument("--loss", default="0.01",
                    help="--emulate-link packet loss (as over TCP: a frame with a lost packet "
                    "arrives a retransmission timeout late)")
    ap.add_argument("--hang-seconds", type=float, default=180.0)
    ap.add_argument("--grace", type=float, default=90.0)
    ap.add_argument("--loss-tolerance", type=float, default=1.0,
                    help="close: L <= L0 * (1 + this)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="keep the logs here (default: a temporary directory)")
    a = ap.parse_args()
    lo, _, hi = a.rtt_ms.partition("-")
    a.rtt_ms = (int(lo), int(hi or lo))
    if a.baseline_minutes is None:
        a.baseline_minutes = min(a.minutes, 10.0)
    if a.mode_minutes is None:
        a.mode_minutes = min(5.0, max(1.0, a.minutes / 3))
    binary = nb.check_binary(a.binary)
    if a.trainer_nodes and not torch_available():
        print("no torch/msgpack for %s: running without trainer nodes" % PYTHON)
        a.trainer_nodes = 0
    if a.nodes - a.trainer_nodes < 3:
        raise nb.BenchError("the main swarm needs at least 3 nodes (--nodes - --trainer-nodes)")
    root = nb.fresh_dir(a.out) if a.out else tempfile.mkdtemp(prefix="grove-soak.")
    ok = False
    t_start = time.monotonic()
    try:
        print(fmt_row(HEADERS), flush=True)
        base = None
        if a.baseline_minutes > 0:
            base = Harness(a, binary, nb.fresh_dir(os.path.join(root, "baseline")), "baseline",
                           False)
            base.run(a.baseline_minutes, a.mode_minutes)
        soak = Harness(a, binary, nb.fresh_dir(os.path.join(root, "soak")), "soak", True)
        soak.run(a.minutes, a.mode_minutes)
        bad = False
        if base:
            bdiv = summarize(base, "baseline")
            bad |= bool(base.crashes or base.hangs or bdiv or base.failures or base.stalled)
        div = summarize(soak, "soak")
        l0 = base.loss if base else float("nan")
        close = not base or (math.isfinite(soak.loss) and soak.loss <= l0 * (1 + a.loss_tolerance))
        if not close:
            print("loss %.4f is not close to %.4f without chaos (tolerance %.0f%%)"
                  % (soak.loss, l0, 100 * a.loss_tolerance))
        bad |= bool(soak.crashes or soak.hangs or div or soak.failures or soak.stalled) or not close
        print("soak: %.1f min of wall time with the baseline, %d retirements, %d trainer kills; "
              "logs in %s" % ((time.monotonic() - t_start) / 60,
                              sum(1 for s in soak.slots.values() if s.retired),
                              soak.total("trainer kills"), root if (bad or a.out) else "(removed)"))
        print("soak: %g min, %d kills, %d stops, %d restarts, %d joins, crashes %d, hangs %d, "
              "divergent rounds %d, loss %.3f vs %.3f without chaos"
              % (a.minutes, soak.total("kills"), soak.total("stops"), soak.total("restarts"),
                 soak.total("joins"), len(soak.crashes), len(soak.hangs), len(div), soak.loss, l0),
              flush=True)
        ok = not bad
        return 0 if ok else 1
    finally:
        for h in HARNESSES:
            for s in h.slots.values():
                if s.stopped and s.life.alive():
                    s.life.proc.send_signal(signal.SIGCONT)
        nb.kill_children()
        if not a.out and ok:
            shutil.rmtree(root, ignore_errors=True)
        elif not ok:
            print("logs kept in %s" % root, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(nb.main_guard(main))
