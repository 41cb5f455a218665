"""soak.py's processes and chaos events: a node's lives (one process each) in a slot, its
metrics read as they grow, and the events that kill, stop, restart, join, retire and replace
trainers, each checked until it has played out (see soak.py's docstring for the rules).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import nodebench as nb  # noqa: E402

PKG = os.path.normpath(os.path.join(HERE, "..", "node", "python"))
PYTHON = "/usr/bin/python3"
RUN = ["--workload", "mlp", "--model-size", "tiny", "--inner-steps", "20", "--lr", "0.01",
       "--warmup", "10", "--schedule-steps", "100000", "--eval-every", "20", "--window-ms", "1000"]
EXT_RUN = ["--workload", "external", "--window-ms", "1000"]
NODE_ARGS = ["--no-progress", "--no-upnp", "--threads", "1", "--checkpoint-every", "1"]
STARTED = re.compile(r"^\s*(resumed|synced)\s+round (\d+)", re.M)
LISTENING = re.compile(r"^\s*listening (\S+)", re.M)
WEIGHTS = {"kill": 3, "term": 2, "stop": 2, "join": 2, "trainer": 1}  # among the possible ones
# A restart or a joiner must print its start line within START_S and average a round within
# REJOIN_MAX_S of it (PCCL's stress harness fails when no reduce completes for 5 minutes). Within
# REJOIN_S is on time; a later one is counted and its delay reported, not failed: a DiLoCo member
# that syncs into a round may wait up to 120 s for its group and then run an all-reduce whose
# deadline is at least 60 s, and under frame loss a group's members may read different ready
# records, split, and suspect each other in turn (10 s each) before the outsider re-syncs.
START_S, REJOIN_S, REJOIN_MAX_S, TERM_S = 90.0, 120.0, 300.0, 120.0


# ---- processes ----------------------------------------------------------------------------------
class MetricsTail:
    """The new complete JSON lines of a metrics file since the last call."""

    def __init__(self, path):
        self.path, self.pos, self.part = path, 0, b""

    def read(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        self.pos += len(data)
        data = self.part + data
        lines = data.split(b"\n")
        self.part = lines.pop()
        out = []
        for l in lines:
            try:
                out.append(json.loads(l))
            except ValueError:
                pass  # a line cut by a kill
        return out


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(path, n=15, width=300):
    return "\n".join("    " + l[:width] for l in read_text(path).splitlines()[-n:])


class Life:
    """One incarnation of a node: its process, stdout+stderr and metrics files."""

    def __init__(self, slot, args):
        self.slot, self.k = slot, len(slot.lives)
        base = os.path.join(slot.work, "%s.%d" % (slot.name, self.k))
        self.out, self.metrics = base + ".out", base + ".jsonl"
        argv = [slot.h.binary, "--listen", "127.0.0.1:0", "--state-dir", slot.state_dir,
                "--metrics", self.metrics, "--emulate-link", slot.h.link_of(slot.name)]
        with open(self.out, "w") as f:
            self.proc = nb.spawn(argv + NODE_ARGS + list(args), stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.tail = MetricsTail(self.metrics)
        self.signalled = None  # the signal we sent to end it (SIGKILL/SIGTERM)
        self.reported = False  # its exit has been judged
        self.address = None
        self.averaged = False  # a round event with partners

    def text(self):
        return read_text(self.out)

    def listening(self):
        if self.address is None:
            m = LISTENING.search(self.text())
            self.address = m.group(1) if m else None
        return self.address

    def started(self):
        return STARTED.search(self.text()) is not None

    def alive(self):
        return self.proc.poll() is None


class Slot:
    """A node name and state directory, through its incarnations."""

    def __init__(self, h, name, swarm):
        self.h, self.name, self.swarm, self.work = h, name, swarm, h.work
        self.state_dir = os.path.join(h.work, name)
        self.lives, self.life = [], None
        self.stopped = False
        self.busy = None  # the event that holds it
        self.retired = False
        self.last_round = 0.0  # monotonic time of its last round event
        self.watch_from = 0.0  # hang watch: rounds count from here (a start, SIGCONT, trainer)
        self.last_eval = None
        self.node_id = None
        self.trainer = None  # (Popen, attach count before it) of a trainer-swarm node
        self.trainer_k = 0
        self.trainer_killed = False

    def start(self, args):
        self.life = Life(self, args)
        self.lives.append(self.life)
        self.stopped = False
        self.regrace()
        return self.life

    def regrace(self):
        now = time.monotonic()
        self.watch_from = now + self.h.a.grace
        self.last_round = 0.0

    def up(self):
        """Running, not stopped, not held by an event, not retired."""
        return (self.life is not None and self.life.alive() and not self.stopped
                and self.busy is None and not self.retired)

    def trainer_log(self):
        return os.path.join(self.work, self.name + ".trainer.jsonl")

    def attaches(self):
        out = []
        for l in read_text(self.trainer_log()).splitlines():
            try:
                d = json.loads(l)
            except ValueError:
                continue
            if "attached" in d:
                out.append(d)
        return out

    def start_trainer(self, seed):
        self.trainer_k += 1
        out = open(os.path.join(self.work, "%s.trainer.%d.out" % (self.name, self.trainer_k)), "w")
        env = dict(os.environ, PYTHONPATH=PKG)
        p = nb.spawn([PYTHON, os.path.join(HERE, "soak_trainer.py"), "--socket",
                      os.path.join(self.state_dir, "trainer.sock"), "--log", self.trainer_log(),
                      "--data-seed", str(seed)], stdout=out, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, env=env)
        out.close()
        self.trainer = (p, len(self.attaches()))
        return p


# ---- events -------------------------------------------------------------------------------------
class Event:
    """One chaos event: a small state machine stepped by the harness's loop."""

    def __init__(self, h, kind, slot):
        self.h, self.kind, self.slot = h, kind, slot
        self.phase, self.at = "begin", time.monotonic()
        self.done = False
        slot.busy = self

    def finish(self):
        self.done = True
        if self.slot.busy is self:
            self.slot.busy = None

    def fail(self, what, life=None):
        path = (life or self.slot.life).out if (life or self.slot.life) else None
        self.h.failures.append("%s %s: %s\n%s" % (self.kind, self.slot.name, what,
                                                  tail(path) if path else ""))
        self.h.say("FAILED: %s %s: %s" % (self.kind, self.slot.name, what))

    # The restart checks (kill_anywhere.py's): started from a checkpoint or the swarm's state,
    # then a round averaged with a partner.
    def verify(self, now, life):
        if self.phase == "verify_start":
            if life.started():
                self.phase, self.at = "verify_rejoin", now
            elif not life.alive():
                return self.finish()  # (judged as a crash by the exit watch)
            elif now - self.at > START_S:
                self.fail("printed no resumed/synced line within %.0f s" % START_S, life)
                return self.finish()
        if self.phase == "verify_rejoin":
            if life.averaged:
                self.h.rejoined(now - self.at)
                return self.finish()
            if not life.alive():
                return self.finish()
            if now - self.at > REJOIN_MAX_S:
                self.fail("averaged no round within %.0f s of its start line" % REJOIN_MAX_S, life)
                return self.finish()


class Restart(Event):
    """kill (SIGKILL) or term (SIGTERM), then a restart on the state directory."""

    def step(self, now):
        s, h = self.slot, self.h
        if self.phase == "begin":
            self.life = s.life
            sig = signal.SIGKILL if self.kind == "kill" else signal.SIGTERM
            self.life.signalled = sig
            self.life.proc.send_signal(sig)
            h.count("kills")
            self.phase, self.at = "exit", now
        if self.phase == "exit":
            rc = self.life.proc.poll()
            if rc is None:
                if now - self.at > TERM_S:
                    h.hang(s, "still running %.0f s after SIGTERM" % TERM_S, self.life)
                    self.life.proc.kill()
                    self.life.proc.wait()
                else:
                    return
            self.delay = now + h.rng.uniform(0.5, 5.0)
            self.phase = "delay"
        if self.phase == "delay" and now >= self.delay:
            self.new = s.start([])
            h.count("restarts")
            self.phase, self.at = "verify_start", now
        if self.phase.startswith("verify"):
            self.verify(now, self.new)


class Stop(Event):
    def step(self, now):
        s, h = self.slot, self.h
        if self.phase == "begin":
            self.until = now + h.rng.uniform(5.0, 60.0)
            s.life.proc.send_signal(signal.SIGSTOP)
            s.stopped = True
            h.count("stops")
            self.phase = "stopped"
        if self.phase == "stopped" and (now >= self.until or h.ending):
            self.cont()

    def cont(self):
        s = self.slot
        if s.stopped:
            try:
                s.life.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            s.stopped = False
            s.regrace()
        self.finish()


class Join(Event):
    """A fresh node through a live member; a member retired while the swarm is above target."""

    def __init__(self, h, slot, via):
        super().__init__(h, "join", slot)
        self.via = via  # the member it joins through: held (no event) until the join has synced
        via.busy = self

    def release(self):
        if self.via.busy is self:
            self.via.busy = None

    def finish(self):
        self.release()
        super().finish()

    def step(self, now):
        s, h = self.slot, self.h
        if self.phase == "begin":
            self.life = s.start(["--peer", self.via.life.listening(), "--swarm-key-file",
                                 h.key_file])
            h.count("joins")
            h.pending_retire += 1
            self.phase, self.at = "verify_start", now
        if self.phase.startswith("verify"):
            self.verify(now, self.life)
            if self.phase != "verify_start":
                self.release()


class Retire(Event):
    def step(self, now):
        s, h = self.slot, self.h
        if self.phase == "begin":
            self.life = s.life
            self.life.signalled = signal.SIGTERM
            self.life.proc.send_signal(signal.SIGTERM)
            s.retired = True
            self.phase, self.at = "exit", now
        if self.phase == "exit":
            if self.life.proc.poll() is None:
                if now - self.at <= TERM_S:
                    return
                h.hang(s, "still running %.0f s after SIGTERM" % TERM_S, self.life)
                self.life.proc.kill()
                self.life.proc.wait()
            self.finish()


class TrainerKill(Event):
    def step(self, now):
        s, h = self.slot, self.h
        if self.phase == "begin":
            p, _ = s.trainer
            s.trainer_killed = True
            p.send_signal(signal.SIGKILL)
            p.wait()
            h.count("trainer kills")
            self.delay = now + h.rng.uniform(0.5, 5.0)
            self.phase = "delay"
        if self.phase == "delay" and now >= self.delay:
            s.start_trainer(h.rng.randrange(1 << 30))
            s.trainer_killed = False
            s.regrace()
            self.phase, self.at = "attach", now
        if self.phase == "attach":
            p, before = s.trainer
            att = s.attaches()[before:]
            if att:
                if not att[0].get("restored"):
                    self.fail("the new trainer attached without its state restored: %r" % att[0])
                    return self.finish()
                self.mark = h.rounds_of(s)
                self.phase, self.at = "round", now
            elif p.poll() is not None:
                return self.finish()  # (judged by the trainer watch)
            elif now - self.at > START_S:
                self.fail("the new trainer did not attach within %.0f s" % START_S)
                return self.finish()
        if self.phase == "round":
            if h.rounds_of(s) > self.mark:
                h.tally("trainer reattached")
                return self.finish()
            if now - self.at > REJOIN_MAX_S:
                self.fail("its node ended no round within %.0f s of the new trainer" % REJOIN_MAX_S)
                return self.finish()
