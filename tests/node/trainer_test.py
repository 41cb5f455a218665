#!/usr/bin/python3
"""Real grove-node processes on loopback, each driven by a PyTorch trainer process through the
grove package (node/python): --workload external end to end.

  noloco: three nodes + trainers train one small MLP; their losses fall together and they average
          with each other; one trainer is killed (SIGKILL) and restarted: its node stays in the
          swarm and the new trainer goes on from the node's weights and gets its own state back
          (optimiser momentum, data position: grove's keep()); a fourth node + trainer joins
          mid-run and its trainer starts from the swarm's weights (its own initialisation is
          different); a trainer with another model is refused with the reason; a node killed
          under its trainer makes the trainer raise NodeGone. The model has a float64 parameter
          besides its float32 ones, so the copy path and the zero-copy path both run.
  diloco: three nodes + trainers with DiLoCo: rounds averaged, losses fall together; the third
          trainer starts its own node (grove.attach(start=[...])) and stops it when it is done.
  sparseloco: the same with SparseLoCo chosen by the first trainer (node.sparseloco(), top-8 of
          each 64 values): the run takes its algorithm from the trainer, rounds are averaged and
          the losses fall together.
  fragments: the same with DiLoCo in two streaming fragments (node.diloco(fragments=2)): a round
          every H/2 steps syncs half of the model, the trainer's other half trains on.

Usage: trainer_test.py GROVE_NODE noloco|diloco|sparseloco|fragments. Exit 77 (skipped) without torch/msgpack.
Run with /usr/bin/python3 (Debian's torch). Waits on conditions with deadlines, never on sleeps.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "..", "node", "python"))


# ---- the trainer (this file run with --trainer) ------------------------------------------------
def trainer(argv):
    import argparse

    import torch

    sys.path.insert(0, PKG)
    import grove

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--outer", default="noloco")
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--init-seed", type=int, default=1234)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--start", help="grove-node arguments (JSON list): attach(start=...)")
    ap.add_argument("--state-dir")
    ap.add_argument("--node-binary")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(77)
    teacher = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    torch.manual_seed(a.init_seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, a.hidden), torch.nn.Tanh(),
                                torch.nn.Linear(a.hidden, 1))
    # A float64 parameter: handed over by copy (float32 CPU ones are re-pointed into shared
    # memory), so both paths of the package run.
    model.register_parameter("gain", torch.nn.Parameter(torch.ones(1, dtype=torch.float64)))

    def forward(x):
        return model(x) * model.gain.float()
    gen = torch.Generator().manual_seed(a.data_seed)
    xs = torch.randn(256, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ys = teacher(xs)

    def held_out():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(forward(xs), ys).item()

    class Position:  # the data position, kept with the optimiser's state
        def __init__(self):
            self.step = 0

        def state_dict(self):
            return {"step": self.step, "gen": gen.get_state()}

        def load_state_dict(self, d):
            self.step = int(d["step"])
            gen.set_state(d["gen"])

    log = open(a.log, "a", buffering=1)
    node = grove.attach(socket=a.socket, timeout=60, state_dir=a.state_dir,
                        start=json.loads(a.start) if a.start else None, node_binary=a.node_binary)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    position = Position()
    node.keep(optimizer=opt, data=position)
    try:
        if a.outer == "noloco":
            outer = node.noloco(model, inner_steps=a.inner_steps)
        elif a.outer == "sparseloco":  # top-8 of each 64 of the model's 322 values
            outer = node.sparseloco(model, inner_steps=a.inner_steps, topk=8, chunk=64)
        elif a.outer == "fragments":  # DiLoCo, half of the model a round
            outer = node.diloco(model, inner_steps=a.inner_steps, fragments=2)
        else:
            outer = node.diloco(model, inner_steps=a.inner_steps)
    except grove.Refused as e:
        log.write(json.dumps({"refused": str(e)}) + "\n")
        return 3
    log.write(json.dumps({"attached": outer.run, "eval": held_out(),
                          "restored": node.restored and node.restored["steps"],
                          "momentum": bool(opt.state), "position": position.step}) + "\n")
    step = position.step
    try:
        while True:
            x = torch.randn(32, 8, generator=gen)
            with torch.no_grad():
                y = teacher(x) + 0.05 * torch.randn(32, 1, generator=gen)
            loss = torch.nn.functional.mse_loss(forward(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            position.step = step
            ev = held_out() if step % a.inner_steps == 0 else None
            node.report(loss=loss.item(), eval_loss=ev, tokens=32)
            outer.step()
            if ev is not None:
                log.write(json.dumps({"step": step, "eval": ev}) + "\n")
    except grove.NodeStopped as e:
        log.write(json.dumps({"stopped": str(e), "eval": held_out()}) + "\n")
        if node.process is not None:  # a node this trainer started: stopped by close()
            node.close()
            log.write(json.dumps({"node_exit": node.process.returncode}) + "\n")
        return 0
    except grove.NodeGone as e:
        log.write(json.dumps({"gone": str(e)}) + "\n")
        return 4
    finally:
        node.close()


# ---- the orchestration ---------------------------------------------------------------------------
class Fail(Exception):
    pass


def wait_until(what, pred, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise Fail("timed out (%d s) waiting until %s" % (limit, what))


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip().startswith("{")]
    except FileNotFoundError:
        return []


class Swarm:
    def __init__(self, binary, work, outer):
        self.binary, self.work, self.outer = binary, work, outer
        self.nodes, self.trainers = {}, {}
        self.key = os.path.join(work, "key")
        self.boot_addr = None

    def node_args(self, name, bootstrap=False, max_steps=None):
        args = ["--listen", "127.0.0.1:0", "--no-upnp", "--swarm-key-file", self.key,
                "--metrics", os.path.join(self.work, name + ".jsonl")]
        if bootstrap:
            args += ["--bootstrap", "--workload", "external", "--window-ms", "1000"]
        else:
            args += ["--peer", self.boot_addr]
        if max_steps:
            args += ["--max-steps", str(max_steps)]
        return args

    def node(self, name, bootstrap=False, max_steps=None):
        d = os.path.join(self.work, name)
        args = ([self.binary, "--no-progress", "--state-dir", d]
                + self.node_args(name, bootstrap, max_steps))
        log = open(os.path.join(self.work, name + ".log"), "w")
        self.nodes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        return os.path.join(d, "trainer.sock")

    def trainer(self, name, **kw):
        sock = os.path.join(self.work, name, "trainer.sock")
        args = ["/usr/bin/python3", os.path.abspath(__file__), "--trainer", "--socket", sock,
                "--outer", self.outer, "--log", os.path.join(self.work, name + ".trainer.jsonl")]
        for k, v in kw.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        out = open(os.path.join(self.work, name + ".trainer.log"), "a")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.trainers[name] = p
        return p

    def log(self, name):
        # A node its trainer started writes into the trainer's log.
        path = os.path.join(self.work, name + ".log")
        if name not in self.nodes:
            path = os.path.join(self.work, name + ".trainer.log")
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def rounds(self, name):
        return [m for m in lines(os.path.join(self.work, name + ".jsonl")) if m.get("event") == "round"]

    def evals(self, name):
        return [m["eval"] for m in lines(os.path.join(self.work, name + ".trainer.jsonl"))
                if "eval" in m and m["eval"] is not None]

    def stop_all(self):
        for p in list(self.trainers.values()) + list(self.nodes.values()):
            if p.poll() is None:
                p.kill()
        for p in list(self.trainers.values()) + list(self.nodes.values()):
            p.wait()
        # A node killed with SIGKILL leaves its shared-memory segment behind.
        for name in self.nodes:
            try:
                for shm in set(re.findall(r"shared memory /(grove-[0-9a-f]+)", self.log(name))):
                    if os.path.exists("/dev/shm/" + shm):
                        os.unlink("/dev/shm/" + shm)
            except OSError:
                pass

    def dump(self):
        for f in sorted(os.listdir(self.work)):
            if f.endswith(".log"):
                print("---- %s (last 25 lines)" % f)
                with open(os.path.join(self.work, f)) as fh:
                    print("".join(fh.readlines()[-25:]), end="")


def averaged(rounds):
    return sum(1 for r in rounds if r.get("partners"))


def run(binary, mode):
    work = tempfile.mkdtemp(prefix="grove-trainer.")
    s = Swarm(binary, work, mode)
    try:
        s.node("a", bootstrap=True, max_steps=400)
        wait_until("node a waits for a trainer", lambda: "grove.attach" in s.log("a"), 30)
        s.trainer("a", data_seed=1)
        s.boot_addr = wait_until("node a prints its address",
                                 lambda: (re.search(r"listening (\S+)", s.log("a")) or [None, None])[1], 60)
        s.node("b", max_steps=400)
        s.trainer("b", data_seed=2)
        if mode == "diloco":
            # c's trainer starts its own node: grove.attach(start=[...]).
            s.trainer("c", data_seed=3, start=json.dumps(s.node_args("c", max_steps=400)),
                      state_dir=os.path.join(work, "c"), node_binary=binary)
        else:
            s.node("c", max_steps=400)
            s.trainer("c", data_seed=3)
        for n in "abc":
            wait_until("trainer %s attached" % n, lambda n=n: "trainer: pid" in s.log(n), 90)
        first = wait_until("a's first held-out loss", lambda: s.evals("a")[:1], 60)[0]

        if mode == "noloco":
            # A trainer with another model is refused with the reason.
            s.node("x")
            bad = s.trainer("x", hidden=33)
            rc = bad.wait(timeout=120)
            refused = [m["refused"] for m in lines(os.path.join(work, "x.trainer.jsonl"))
                       if "refused" in m]
            if rc != 3 or not refused or "does not match" not in refused[0]:
                raise Fail("the mismatched trainer was not refused as it should (rc %s, %r)"
                           % (rc, refused))
            print("refused: %s" % refused[0])
            s.nodes["x"].terminate()
            s.nodes["x"].wait(timeout=60)

            # Kill b's trainer mid-run; its node stays; a new trainer goes on from the node's θ.
            wait_until("b ends 5 rounds", lambda: len(s.rounds("b")) >= 5, 120)
            s.trainers["b"].send_signal(signal.SIGKILL)
            s.trainers["b"].wait()
            wait_until("node b notices", lambda: "waits for a trainer to attach again" in s.log("b"), 60)
            if s.nodes["b"].poll() is not None:
                raise Fail("node b exited when its trainer died")
            before = s.evals("b")[-1]
            s.trainer("b", data_seed=4)
            attaches = lambda: [m for m in lines(os.path.join(work, "b.trainer.jsonl")) if "attached" in m]
            reattached = wait_until("b's new trainer attached", lambda: attaches()[1:], 60)[0]
            print("b's trainer killed and restarted: held-out loss %.4f before the kill, %.4f "
                  "when the new trainer attached (%.4f for a fresh model)"
                  % (before, reattached["eval"], first))
            # Its own state came back from the node's state dir: the optimiser's momentum and
            # the data position, as saved after the node's last checkpoint.
            if not (reattached["restored"] and reattached["restored"] >= 40
                    and reattached["momentum"] and reattached["position"] >= 40):
                raise Fail("b's new trainer did not get its state back: %r" % reattached)
            print("b's new trainer restored its optimiser state and data position (saved after "
                  "%d steps)" % reattached["restored"])

            # A fourth node + trainer joins mid-run with another initialisation: it starts from the
            # swarm's weights.
            wait_until("a ends 10 rounds", lambda: len(s.rounds("a")) >= 10, 120)
            s.node("d", max_steps=200)
            s.trainer("d", data_seed=5, init_seed=999)
            att = wait_until("d's trainer attached",
                             lambda: [m for m in lines(os.path.join(work, "d.trainer.jsonl")) if "attached" in m], 120)[0]
            swarm_now = s.evals("a")[-1]
            print("d joined mid-run: held-out loss %.4f at attach (a's %.4f now, %.4f at its start)"
                  % (att["eval"], swarm_now, first))
            if not att["eval"] < 0.5 * first:
                raise Fail("d's trainer did not start from the swarm's weights (%.4f vs first %.4f)"
                           % (att["eval"], first))
            if not reattached["eval"] < 0.5 * first:
                raise Fail("b's new trainer did not go on from the node's weights")

            # A node that dies: its trainer gets a clear error, not a hang.
            s.node("y")
            yt = s.trainer("y", data_seed=6)
            wait_until("y's trainer attached", lambda: [m for m in lines(os.path.join(work, "y.trainer.jsonl")) if "attached" in m], 120)
            s.nodes["y"].send_signal(signal.SIGKILL)
            rc = yt.wait(timeout=60)
            gone = [m["gone"] for m in lines(os.path.join(work, "y.trainer.jsonl")) if "gone" in m]
            if rc != 4 or not gone or "gone away" not in gone[0]:
                raise Fail("y's trainer did not report its node's death (rc %s, %r)" % (rc, gone))
            print("node y killed: its trainer raised NodeGone: %s" % gone[0])

        for n, p in s.nodes.items():
            if n not in "xy" and p.wait(timeout=300) != 0:
                raise Fail("node %s exited with %s" % (n, p.returncode))
        for n, p in s.trainers.items():
            if n not in "xy" and p.wait(timeout=60) != 0:
                raise Fail("trainer %s exited with %s" % (n, p.returncode))
        if mode == "diloco":
            exits = [m["node_exit"] for m in lines(os.path.join(work, "c.trainer.jsonl"))
                     if "node_exit" in m]
            if exits != [0]:
                raise Fail("the node c's trainer started did not end cleanly (%r)" % exits)
            print("c's trainer started its own node (attach(start=...)); it exited with 0")
        if mode == "fragments" and "1/2 of the model a round" not in s.log("a"):
            raise Fail("node a's banner does not show the run's two fragments")
        if mode == "fragments":
            # After a round of one fragment the node gives the trainer that half of θ only
            # (its float64 parameter by copy): on average well under a whole θ a hand-off.
            ho = [m for m in lines(os.path.join(work, "a.jsonl")) if m.get("event") == "handoff"]
            if not ho or not ho[-1]["set_bytes"] < 0.75 * ho[-1]["bytes"]:
                raise Fail("node a gave its trainer whole θs after fragment rounds (%r)" % ho)
            print("fragments: a hand-off to the trainer wrote %.0f of θ's %.0f bytes on average"
                  % (ho[-1]["set_bytes"], ho[-1]["bytes"]))
        names = "abcd" if mode == "noloco" else "abc"
        report = []
        for n in names:
            r = s.rounds(n)
            ev = s.evals(n)
            report.append("%s: %d rounds, %d averaged, held-out loss %.4f -> %.4f"
                          % (n, len(r), averaged(r), ev[0], ev[-1]))
            if len(r) < 10 or averaged(r) * 10 < len(r) * 7:
                raise Fail("%s averaged only %d of %d rounds" % (n, averaged(r), len(r)))
            if not ev[-1] < 0.3 * first:
                raise Fail("%s's loss did not fall (%.4f, first %.4f)" % (n, ev[-1], first))
        finals = [s.evals(n)[-1] for n in names]
        print("%s: %s; final held-out losses within %.4f of each other"
              % (mode, "; ".join(report), max(finals) - min(finals)))
        if max(finals) > 2 * min(finals) + 0.01:
            raise Fail("the trainers' losses did not fall together: %r" % finals)
        print("PASS")
        return 0
    except Fail as e:
        print("FAIL: %s" % e)
        s.dump()
        return 1
    finally:
        s.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        sys.exit(trainer(sys.argv[2:]))
    try:
        import msgpack  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: %s (Debian: python3-torch python3-msgpack; run with /usr/bin/python3)" % e)
        sys.exit(77)
    if len(sys.argv) != 3 or sys.argv[2] not in ("noloco", "diloco", "sparseloco", "fragments"):
        print(__doc__)
        sys.exit(2)
    sys.exit(run(sys.argv[1], sys.argv[2]))
