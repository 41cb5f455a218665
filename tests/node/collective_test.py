#!/usr/bin/python3
"""Grove's per-step collectives between real grove-node processes on loopback, each driven by a
PyTorch trainer through the grove package (grove.all_sum, average_gradients, all_gather,
barrier), with a member killed during the calls.

Three nodes and their trainers (a, b, c) meet at a barrier of three, then make CALLS calls of one
kind on 2 Mi values each (integers as float32, so that sums are exact); after a few calls c's
trainer and its node are SIGKILLed, most likely during a call. Checks, for every call number:
  - the members that logged it got the same bits (a digest of the whole result);
  - the result is the collective computed in NumPy over the inputs of the call's group (its
    members by rank: the loggers, and c when the group was larger than the loggers: c died after
    the call began), on a strided sample of the values;
  - the survivors raised nothing (their trainers end with 0 after CALLS calls), and the calls
    after the kill are among the two survivors.
In the all_sum mode a fourth node and trainer (d) then join and enter the group at a later call
(calls of size 3 again, d among their members).

Usage: collective_test.py GROVE_NODE all_sum|average_gradients|all_gather|barrier.
Exit 77 (skipped) without torch/msgpack. Waits on conditions with deadlines, never on sleeps.
"""
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "..", "node", "python"))
sys.path.insert(0, HERE)
from trainer_test import Fail, lines, wait_until  # noqa: E402

N = 1 << 21  # values a call
SAMPLE = 4099  # the sample's stride
MODES = ("all_sum", "average_gradients", "all_gather", "barrier", "send_recv", "ddp")


def calls_of(a, grove=None):
    """--calls call numbers, then more until the file --until exists (a joiner has done), or
    until --with-others calls had other members (a joiner: it may call alone until the swarm's
    member records reach it)."""
    import time
    i, together, end = 0, 0, time.monotonic() + 120
    while (i < a.calls or (a.until and not os.path.exists(a.until))
           or (a.with_others and together < a.with_others and time.monotonic() < end)):
        yield i
        i += 1
        if grove is not None and grove.world_size > 1:
            together += 1


def inputs(ident, i):
    import torch
    g = torch.Generator().manual_seed(1000 * ident + i)
    return torch.randint(-100, 101, (N,), generator=g).float()


# ---- the trainer (this file run with --trainer) ------------------------------------------------
def trainer(argv):
    import argparse

    import numpy as np
    import torch

    sys.path.insert(0, PKG)
    import grove

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--ident", type=int, required=True)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--min-size", type=int, default=3)
    ap.add_argument("--init-seed", type=int, default=0)
    ap.add_argument("--until", help="after --calls calls, go on until this file exists")
    ap.add_argument("--with-others", type=int, default=0,
                    help="go on until this many calls had other members (a joiner), 120 s at most")
    ap.add_argument("--log", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    log = open(a.log, "a", buffering=1)
    node = grove.attach(socket=a.socket, timeout=60)
    if a.mode == "ddp":
        return ddp_loop(a, grove, node, log)
    node.noloco(torch.nn.Linear(4, 1), inner_steps=100000)  # (no rounds during the test)
    world = grove.init()
    try:
        if a.min_size:
            grove.barrier(min_size=a.min_size, timeout=120)
        log.write(json.dumps({"met": world.size(), "call": node.collectives.call}) + "\n")
        if a.mode == "send_recv":
            return send_recv_loop(a, grove, node, log)
        for i in calls_of(a, grove):
            x = inputs(a.ident, i)
            if a.mode == "all_sum":
                r = grove.all_sum(x)
            elif a.mode == "average_gradients":
                # A nested structure, as a model's gradients: the values split over its leaves.
                g = grove.average_gradients({"w": x[:N // 2].view(N // 2048, 1024),
                                             "more": [x[N // 2:N // 2 + 1000], 7],
                                             "b": x[N // 2 + 1000:]})
                if g["more"][1] != 7 or g["w"].shape != (N // 2048, 1024):
                    raise SystemExit("average_gradients changed the structure")
                r = torch.cat([g["w"].reshape(-1), g["more"][0], g["b"]])
            elif a.mode == "all_gather":
                r = grove.all_gather(x)
            else:
                grove.barrier(timeout=60)
                r = torch.zeros(0)
            v = r.numpy()
            log.write(json.dumps({
                "i": i, "call": node.collectives.call, "rank": grove.rank,
                "size": grove.world_size, "n": int(v.size),
                "digest": hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest(),
                "sample": v[::SAMPLE].tolist()}) + "\n")
    except grove.CollectiveError as e:
        log.write(json.dumps({"error": str(e)}) + "\n")
        return 5
    finally:
        node.close()
    return 0


def ddp_loop(a, grove, node, log):
    """Per-step data parallel in a per-step run (grove.init(model)): a small model, its
    gradients averaged over the group every step (average_gradients on the module), plain SGD.
    Every member logs a digest of its parameters after each step: members of one call must
    agree. A joiner starts from other weights (--init-seed) and must agree from its first
    call on (average_gradients aligns the weights when the group gains a member)."""
    import torch
    torch.manual_seed(1000 + a.init_seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    world = grove.init(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    try:
        if a.min_size:
            grove.barrier(min_size=a.min_size, timeout=120)
        log.write(json.dumps({"met": world.size(), "call": node.collectives.call}) + "\n")
        for i in calls_of(a, grove):
            g = torch.Generator().manual_seed(1000 * a.ident + i)
            x = torch.randn(32, 8, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).tanh())
            loss.backward()
            grove.report(loss.item())
            syncs = node.collectives.syncs
            grove.average_gradients(model)
            joined = node.collectives.syncs > syncs  # (its weights were aligned with the group's)
            opt.step()
            opt.zero_grad()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            log.write(json.dumps({
                "i": i, "call": node.collectives.call, "rank": grove.rank,
                "size": grove.world_size, "joined": joined, "loss": loss.item(),
                "digest": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}) + "\n")
    except grove.CollectiveError as e:
        log.write(json.dumps({"error": str(e)}) + "\n")
        return 5
    finally:
        node.close()
    return 0


def send_recv_loop(a, grove, node, log):
    """Each round: a barrier (the group and its ranks), then every member sends to the next rank
    a tensor named by (its ident, the barrier's call) and receives from the previous one (even
    ranks send first, odd ones receive first: no cycle of waits). A transfer with a member that
    died raises CollectiveError; the member logs it and the next barrier re-forms the group."""
    errors = 0
    for i in range(a.calls):
        try:
            grove.barrier(timeout=60)
        except grove.CollectiveError as e:
            # (A member still waiting on a transfer with the dead one misses a barrier.)
            errors += 1
            log.write(json.dumps({"i": i, "transfer_error": "barrier: %s" % e}) + "\n")
            if errors > 4:
                return 5
            continue
        call, r, size = node.collectives.call, grove.rank, grove.world_size
        if size < 2:
            log.write(json.dumps({"i": i, "call": call, "alone": True}) + "\n")
            continue
        x = inputs(a.ident, call)
        dst, src = (r + 1) % size, (r - 1) % size
        try:
            if r % 2 == 0:
                grove.send(x, dst, timeout=10)
                y = grove.recv((N,), src=src, timeout=10)
            else:
                y = grove.recv((N,), src=src, timeout=10)
                grove.send(x, dst, timeout=10)
        except grove.CollectiveError as e:
            errors += 1
            log.write(json.dumps({"i": i, "call": call, "transfer_error": str(e)}) + "\n")
            if errors > 4:
                return 5
            continue
        log.write(json.dumps({"i": i, "call": call, "rank": r, "size": size, "src": src,
                              "got": hashlib.sha256(y.numpy().tobytes()).hexdigest()}) + "\n")
    return 0


def check_ddp(s, names):
    """Members of one call hold the same weights after it; d, which started from others, too."""
    by_call = {}
    for name in names:
        for m in s.calls(name):
            if m["size"] > 1:  # (a member alone numbers its own calls)
                by_call.setdefault(m["call"], {})[name] = m
    for call, ms in sorted(by_call.items()):
        if len({m["digest"] for m in ms.values()}) != 1:
            raise Fail("call %d: members hold different weights after it (%s)"
                       % (call, sorted(ms)))
    with_d = [call for call, ms in by_call.items() if "d" in ms and len(ms) > 1]
    firsts = [m for m in s.calls("d") if m["size"] > 1][:1]
    if not with_d or not firsts or not firsts[0]["joined"]:
        raise Fail("d never trained with the others, or its first call with them did not say "
                   "joined: %r" % s.calls("d")[:3])
    losses = [m["loss"] for m in s.calls("a")]
    print("ddp: %d calls, the members of each holding the same weights after it; d (other "
          "initial weights) joined at call %d and agreed from then on (%d calls with others); "
          "a's loss %.4f -> %.4f" % (len(by_call), firsts[0]["call"], len(with_d), losses[0],
                                      losses[-1]))
    if not losses[-1] < losses[0]:
        raise Fail("the loss did not fall")
    print("PASS")
    return 0


def check_transfers(s, names, idents):
    """Every received tensor is its sender's (ident, call) input, the sender found by rank."""
    by_call = {}
    for name in names:
        for m in s.calls(name):
            if "got" in m:
                by_call.setdefault(m["call"], {})[m["rank"]] = (name, m)
    checked = 0
    for call, ranks in by_call.items():
        for r, (name, m) in ranks.items():
            if m["src"] not in ranks:
                continue  # the sender's log line is missing (killed after sending)
            sender = ranks[m["src"]][0]
            want = hashlib.sha256(inputs(idents[sender], call).numpy().tobytes()).hexdigest()
            if m["got"] != want:
                raise Fail("call %d: %s received something else than %s's tensor"
                           % (call, name, sender))
            checked += 1
    return checked


# ---- the orchestration ---------------------------------------------------------------------------
class Swarm:
    def __init__(self, binary, work):
        self.binary, self.work = binary, work
        self.nodes, self.trainers = {}, {}
        self.key = os.path.join(work, "key")
        self.boot_addr = None

    def node(self, name, bootstrap=False):
        d = os.path.join(self.work, name)
        args = [self.binary, "--no-progress", "--state-dir", d, "--listen", "127.0.0.1:0",
                "--no-upnp", "--swarm-key-file", self.key]
        args += (["--bootstrap", "--workload", "external", "--window-ms", "1000"]
                 if bootstrap else ["--peer", self.boot_addr])
        if os.environ.get("GROVE_TEST_LOG"):
            args += ["--log-level", os.environ["GROVE_TEST_LOG"]]
        log = open(os.path.join(self.work, name + ".log"), "w")
        self.nodes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def trainer(self, name, ident, mode, **kw):
        args = ["/usr/bin/python3", os.path.abspath(__file__), "--trainer",
                "--socket", os.path.join(self.work, name, "trainer.sock"), "--mode", mode,
                "--ident", str(ident), "--log", self.tlog(name)]
        for k, v in kw.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        out = open(os.path.join(self.work, name + ".trainer.log"), "a")
        self.trainers[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def tlog(self, name):
        return os.path.join(self.work, name + ".trainer.jsonl")

    def log(self, name):
        try:
            with open(os.path.join(self.work, name + ".log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def calls(self, name):
        return [m for m in lines(self.tlog(name)) if "i" in m]

    def stop_all(self):
        for p in list(self.trainers.values()) + list(self.nodes.values()):
            if p.poll() is None:
                p.kill()
        for p in list(self.trainers.values()) + list(self.nodes.values()):
            p.wait()
        # Nodes killed with SIGKILL leave their shared-memory segments behind.
        for name in self.nodes:
            for shm in set(re.findall(r"shared memory /(grove-[0-9a-f]+)", self.log(name))):
                for path in glob.glob("/dev/shm/" + shm + "*"):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

    def dump(self):
        for f in sorted(os.listdir(self.work)):
            if f.endswith(".log"):
                print("---- %s (last 25 lines)" % f)
                with open(os.path.join(self.work, f)) as fh:
                    print("".join(fh.readlines()[-25:]), end="")


def expected_sample(mode, idents_by_rank, i_by_ident):
    """The collective in NumPy over the group's inputs (by rank), on the sample's positions."""
    import numpy as np
    xs = [inputs(ident, i_by_ident[ident]).numpy() for ident in idents_by_rank]
    if mode == "all_sum":
        return np.sum(np.stack(xs), axis=0, dtype=np.float64)[::SAMPLE]
    if mode == "average_gradients":
        return (np.sum(np.stack(xs), axis=0, dtype=np.float64) / len(xs))[::SAMPLE]
    if mode == "all_gather":
        return np.concatenate(xs)[::SAMPLE].astype(np.float64)
    return np.zeros(0)


def check(s, mode, names, idents, killed):
    """Every call's members agree bit for bit and match NumPy; returns {call: members}."""
    import numpy as np
    by_call = {}
    for name in names:
        for m in s.calls(name):
            # A member alone numbers its own calls (a joiner before it is admitted): apart.
            key = m["call"] if m["size"] > 1 else (m["call"], name)
            by_call.setdefault(key, {})[name] = m
    # The killed trainer's call in flight: the one after its last logged, on its next input.
    last = s.calls(killed)
    in_flight = (last[-1]["call"] + 1, last[-1]["i"] + 1) if last else None
    groups = {}
    for call, ms in sorted(by_call.items(), key=lambda kv: str(kv[0])):
        digests = {m["digest"] for m in ms.values()}
        if len(digests) != 1:
            raise Fail("call %d: members got different results (%s)" % (call, sorted(ms)))
        sizes = {m["size"] for m in ms.values()}
        if len(sizes) != 1:
            raise Fail("call %d: members disagree on the group's size %r" % (call, sizes))
        size = sizes.pop()
        ranks = {m["rank"]: name for name, m in ms.items()}
        if len(ranks) != len(ms):
            raise Fail("call %d: two members with one rank" % call)
        members = dict(ranks)
        if size > len(ms):
            # A member that did not log the call: the killed one, dead after the call began.
            if size != len(ms) + 1 or not in_flight or in_flight[0] != call:
                raise Fail("call %d: a group of %d, %d logged it (killed in call %r)"
                           % (call, size, len(ms), in_flight))
            missing = [r for r in range(size) if r not in ranks]
            members[missing[0]] = killed
        i_by_ident = {idents[n]: ms[n]["i"] if n in ms else in_flight[1] for n in members.values()}
        want = expected_sample(mode, [idents[members[r]] for r in range(size)], i_by_ident)
        got = np.array(next(iter(ms.values()))["sample"], dtype=np.float64)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-5):
            raise Fail("call %d (%s among %s): the result is not NumPy's" % (call, mode, members))
        if isinstance(call, int):
            groups[call] = sorted(members.values())
    return groups


def run(binary, mode):
    work = tempfile.mkdtemp(prefix="grove-collective.")
    s = Swarm(binary, work)
    idents = {"a": 1, "b": 2, "c": 3, "d": 4}
    calls = 24
    joins = mode in ("all_sum", "ddp")
    # With a joiner, a and b go on until d is done.
    until = os.path.join(work, "d-done")
    more = {"until": until} if joins else {}
    try:
        s.node("a", bootstrap=True)
        wait_until("node a waits for a trainer", lambda: "grove.attach" in s.log("a"), 30)
        s.trainer("a", 1, mode, calls=calls, **more)
        s.boot_addr = wait_until("node a prints its address",
                                 lambda: (re.search(r"listening (\S+)", s.log("a")) or [None, None])[1], 60)
        for n in "bc":
            s.node(n)
            s.trainer(n, idents[n], mode, calls=calls, **(more if n == "b" else {}))
        for n in "abc":
            wait_until("trainer %s met the others" % n,
                       lambda n=n: [m for m in lines(s.tlog(n)) if "met" in m], 180)
        # c (trainer and node) dies a few calls in: most likely during a call.
        wait_until("c made 4 calls", lambda: len(s.calls("c")) >= 4, 120)
        for p in (s.trainers["c"], s.nodes["c"]):
            p.send_signal(signal.SIGKILL)
            p.wait()
        print("killed c (trainer and node) after its call %d" % s.calls("c")[-1]["call"])
        names = "abc"
        if joins:
            wait_until("a made 8 calls", lambda: len(s.calls("a")) >= 8, 180)
            s.node("d")
            s.trainer("d", 4, mode, calls=calls, min_size=0, init_seed=7, with_others=calls)
            names = "abcd"
        if joins:
            rc = s.trainers["d"].wait(timeout=300)
            open(until, "w").close()
            if rc != 0:
                raise Fail("trainer d ended with %d: %r" % (rc, lines(s.tlog("d"))[-1:]))
        for n in "ab":
            rc = s.trainers[n].wait(timeout=300)
            if rc != 0:
                raise Fail("trainer %s ended with %d: %r" % (n, rc, lines(s.tlog(n))[-1:]))
        if mode == "send_recv":
            checked = check_transfers(s, names, idents)
            errs = {n: [m for m in lines(s.tlog(n)) if "transfer_error" in m] for n in "ab"}
            late = [m for m in s.calls("a")[-5:] + s.calls("b")[-5:] if "got" not in m]
            if checked < 20 or late:
                raise Fail("send/recv: %d transfers checked, last rounds %r" % (checked, late))
            print("send_recv: %d transfers checked (each the sender's tensor); after c's death "
                  "a and b raised %d and %d CollectiveErrors (%s), then went on between them"
                  % (checked, len(errs["a"]), len(errs["b"]),
                     (errs["a"] + errs["b"] + [{"transfer_error": "none"}])[0]["transfer_error"]))
            print("PASS")
            return 0
        if mode == "ddp":
            return check_ddp(s, names)
        groups = check(s, mode, names, idents, "c")
        after = [g for call, g in groups.items() if call > s.calls("c")[-1]["call"] + 1]
        if not after or any("c" in g for g in after):
            raise Fail("calls after c's death still count c: %r" % after)
        print("%s: %d calls checked against NumPy, every member the same bits; groups: %s"
              % (mode, len(groups), " ".join("%d:%s" % (c, "".join(g))
                                             for c, g in sorted(groups.items()))))
        if mode == "all_sum":
            joined = [g for g in after if "d" in g]
            if not joined or len(joined[-1]) != 3:
                raise Fail("d never entered the group: %r" % after[-5:])
            print("d joined and entered the group at a later call (%d calls with d)"
                  % len(joined))
        print("PASS")
        return 0
    except Fail as e:
        print("FAIL: %s" % e)
        s.dump()
        return 1
    finally:
        s.stop_all()
        if os.environ.get("GROVE_TEST_KEEP"):
            print("logs kept in %s" % work)
        else:
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
    if len(sys.argv) != 3 or sys.argv[2] not in MODES:
        print(__doc__)
        sys.exit(2)
    sys.exit(run(sys.argv[1], sys.argv[2]))
