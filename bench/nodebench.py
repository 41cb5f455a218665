"""Shared helpers of the grove-node benchmarks (convergence.py, utilization.py, memory.py).

They start real `grove-node` processes on loopback, each with a fresh state directory, wait for
conditions with deadlines (the bootstrap's `listening HOST:PORT` line, the processes' exit),
read the nodes' JSON-lines metrics, and kill every child they started when the script exits,
fails or is interrupted (SIGINT/SIGTERM), and through PR_SET_PDEATHSIG when it is killed.

Standard library only.
"""

import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

DEFAULT_BINARY = "build-perf/node/grove-node"
DEFAULT_GPT_BENCH = "build-perf/bench/gpt_bench"


class BenchError(RuntimeError):
    pass


_children = []  # every Popen this process started
_children_lock = threading.Lock()


try:
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl  # loaded here, not after fork
except (OSError, AttributeError):
    _prctl = None


def _pdeathsig():
    # Runs in the child between fork and exec: the kernel sends it SIGKILL when the thread that
    # started it exits, so no node outlives a killed benchmark. Children are started from the
    # main thread only.
    if _prctl is not None:
        _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def spawn(argv, **kw):
    """Popen in its own session (a Ctrl-C on the terminal reaches only this script, which then
    stops the children itself), killed with this process."""
    p = subprocess.Popen(argv, start_new_session=True, preexec_fn=_pdeathsig, **kw)
    with _children_lock:
        _children.append(p)
    return p


def kill_children(grace=5.0):
    """SIGTERM to every live child, then SIGKILL to those still alive after `grace` seconds."""
    with _children_lock:
        live = [p for p in _children if p.poll() is None]
    for p in live:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_cleanup():
    """Children are stopped on any exit; SIGTERM and SIGINT (even when the shell started this
    script with SIGINT ignored, as it does for background jobs) behave like Ctrl-C."""
    atexit.register(kill_children)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def main_guard(fn):
    """Runs fn(); on Ctrl-C/SIGTERM or a BenchError stops the children and exits non-zero."""
    install_cleanup()
    try:
        return fn()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the nodes", file=sys.stderr)
        kill_children()
        return 130
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        kill_children()
        return 1


def check_binary(path):
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise BenchError(f"{path} is not an executable (build it first: "
                         "ninja -C build-perf grove-node gpt_bench, or pass --binary)")
    return os.path.abspath(path)


def fresh_dir(path):
    """An empty directory at `path` (its previous content is removed)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


class NodeFiles:
    """What a node left in `logdir`: <name>.out (stdout), <name>.err (stderr), <name>.jsonl
    (metrics). Also a finished run's node, read back later (see load_nodes)."""

    def __init__(self, logdir, name):
        self.name = name
        self.out_path = os.path.join(logdir, name + ".out")
        self.err_path = os.path.join(logdir, name + ".err")
        self.metrics_path = os.path.join(logdir, name + ".jsonl")

    def events(self, name=None):
        return [e for e in read_metrics(self.metrics_path) if name is None or e["event"] == name]

    def stop_event(self):
        s = self.events("stop")
        return s[-1] if s else None

    def log_lines(self):
        """stdout then stderr (the node's log lines go to either)."""
        out = []
        for p in (self.out_path, self.err_path):
            try:
                with open(p) as f:
                    out += [l.rstrip("\n") for l in f]
            except OSError:
                pass
        return out

    def tail(self, n=15):
        lines = []
        for p in (self.out_path, self.err_path):
            try:
                with open(p) as f:
                    lines += [f"  {os.path.basename(p)}: {l.rstrip()}" for l in f.readlines()[-n:]]
            except OSError:
                pass
        return "\n".join(lines)


def load_nodes(logdir):
    """The nodes of a finished run, node0 first, from the files they left in `logdir`."""
    names = sorted((f[:-len(".jsonl")] for f in os.listdir(logdir)
                    if f.endswith(".jsonl") and not f.endswith(".trainer.jsonl")),
                   key=lambda n: (len(n), n))
    return [NodeFiles(logdir, n) for n in names]


class Node(NodeFiles):
    """One grove-node process, its files in `logdir` (stdout is also scanned for the
    `listening HOST:PORT` line); the state directory is a fresh one under `statedir`."""

    LISTENING = re.compile(r"^\s*listening\s+(\S+:\d+)\s*$")

    def __init__(self, binary, name, args, logdir, statedir):
        super().__init__(logdir, name)
        self.state_dir = os.path.join(statedir, name)
        if os.path.exists(self.metrics_path):  # the node appends: start from nothing
            os.remove(self.metrics_path)
        self.argv = [binary] + list(args) + [
            "--listen", "127.0.0.1:0", "--state-dir", self.state_dir,
            "--metrics", self.metrics_path, "--no-progress"]
        self.address = None
        self._ready = threading.Event()  # set at the listening line or at EOF
        self._err = open(self.err_path, "w")
        self.proc = spawn(self.argv, stdout=subprocess.PIPE, stderr=self._err,
                          stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        with open(self.out_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if self.address is None:
                    m = self.LISTENING.match(line)
                    if m:
                        self.address = m.group(1)
                        self._ready.set()
        self._ready.set()

    def wait_listening(self, timeout):
        if not self._ready.wait(timeout) or self.address is None:
            state = "exited with %s" % self.proc.poll() if self.proc.poll() is not None else \
                "printed no 'listening' line within %.0f s" % timeout
            raise BenchError(f"{self.name} {state}:\n{self.tail()}")
        return self.address

    def wait(self, timeout):
        """The exit status, or None at the deadline."""
        try:
            rc = self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=5)
        self._err.flush()
        return rc

    def terminate(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def wait_until(what, pred, limit):
    """pred()'s first true value, polled every 0.1 s; BenchError after `limit` seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise BenchError("timed out (%.0f s) waiting for %s" % (limit, what))


def read_metrics(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut by a kill
    except OSError:
        pass
    return out


def start_swarm(binary, n, run_args, node_args, logdir, statedir, listen_timeout=120.0,
                per_node_args=None):
    """Starts node0 with --bootstrap and the run config `run_args`, waits for its listening
    line, then n-1 joiners with --peer; returns them once every one is listening (a joiner prints
    it once it has found the run)."""
    per = per_node_args or (lambda i: [])
    boot = Node(binary, "node0", ["--bootstrap"] + list(run_args) + list(node_args) + per(0),
                logdir, statedir)
    nodes = [boot]
    addr = boot.wait_listening(listen_timeout)
    # A closed swarm (the default): the bootstrap node keeps its new key in its state dir.
    key = ["--swarm-key-file", os.path.join(boot.state_dir, "swarm.key")]
    for i in range(1, n):
        nodes.append(Node(binary, f"node{i}", ["--peer", addr] + key + list(node_args) + per(i),
                          logdir, statedir))
    for nd in nodes[1:]:
        nd.wait_listening(listen_timeout)
    return nodes


def wait_all(nodes, timeout, grace=45.0):
    """Waits for every node to exit (deadline `timeout` s from now). Past it, SIGTERM (a node
    finishes its round in flight, ≤ 30 s), then SIGKILL after `grace` s; raises BenchError then,
    and when a node exits non-zero."""
    deadline = time.monotonic() + timeout
    late = []
    for nd in nodes:
        if nd.wait(deadline - time.monotonic()) is None:
            late.append(nd)
    if late:
        for nd in late:
            nd.terminate()
        end = time.monotonic() + grace
        for nd in late:
            if nd.wait(end - time.monotonic()) is None:
                nd.proc.kill()
                nd.wait(10)
        raise BenchError("timed out after %.0f s waiting for %s to finish (raise --timeout)\n%s" %
                         (timeout, ", ".join(n.name for n in late), late[0].tail()))
    bad = [nd for nd in nodes if nd.proc.returncode != 0]
    if bad:
        raise BenchError("%s exited with %s:\n%s" % (bad[0].name, bad[0].proc.returncode,
                                                     bad[0].tail()))


def statedir(keep=False, prefix="grove-bench-"):
    """A fresh temporary directory for state dirs (removed at exit unless keep)."""
    d = tempfile.mkdtemp(prefix=prefix)
    if not keep:
        atexit.register(shutil.rmtree, d, True)
    return d


_HEX = re.compile(r"\b[0-9a-f]{8,}\b")
_TS = re.compile(r"^\[[^\]]*\]\s*")
_NUM = re.compile(r"\d+(\.\d+)?")


def log_digest(nodes, levels=("warning", "error", "critical")):
    """Warnings and errors of the nodes' logs, grouped by message shape (ids and numbers
    blanked): [(count, level, shape, first example line)], most frequent first."""
    groups = {}
    for nd in nodes:
        for line in nd.log_lines():
            m = re.search(r"\[(trace|debug|info|warning|error|critical)\]\s*(.*)", line)
            if not m or m.group(1) not in levels:
                continue
            if "LAN discovery off" in m.group(2):
                continue  # no Avahi daemon on a build machine: expected
            shape = _NUM.sub("N", _HEX.sub("ID", m.group(2)))
            key = (m.group(1), shape)
            if key not in groups:
                groups[key] = [0, f"{nd.name}: {line}"]
            groups[key][0] += 1
    return sorted(((c, lv, sh, ex) for (lv, sh), (c, ex) in groups.items()), reverse=True)


def print_log_digest(nodes, title, limit=8):
    d = log_digest(nodes)
    if not d:
        print(f"{title}: no warnings or errors in the nodes' logs")
        return d
    print(f"{title}: warnings/errors in the nodes' logs (count, first example):")
    for c, _lv, _sh, ex in d[:limit]:
        print(f"  {c:4d} x {ex}")
    if len(d) > limit:
        print(f"  ... and {len(d) - limit} more kinds")
    return d


def table(rows, headers):
    """A plain text table (every cell already a string)."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def mb(x):
    return x / 1e6


class RssSampler:
    """Samples the resident set (VmRSS, /proc/PID/status) of processes every `interval` s on a
    background thread: samples[name] = [(unix time, bytes)], and its parts: parts[name] =
    [(unix time, anonymous, file-backed, shared memory bytes)] (RssAnon, RssFile, RssShmem)."""

    def __init__(self, interval=0.05):
        self.interval = interval
        self.samples = {}
        self.parts = {}
        self._procs = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, name, pid):
        self.samples.setdefault(name, [])
        self.parts.setdefault(name, [])
        self._procs[name] = pid

    def peak(self, name):
        """(VmRSS, anonymous, file-backed, shared memory) bytes at the highest VmRSS sample."""
        best = None
        for (t, rss), (_, anon, file_, shmem) in zip(self.samples.get(name, []),
                                                     self.parts.get(name, [])):
            if best is None or rss > best[0]:
                best = (rss, anon, file_, shmem)
        return best

    def _run(self):
        while not self._stop.wait(self.interval):
            for name, pid in list(self._procs.items()):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        v = {}
                        for line in f:
                            key = line.split(":", 1)[0]
                            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                                v[key] = int(line.split()[1]) * 1024
                    if "VmRSS" not in v:  # a zombie: it has exited
                        raise OSError("exited")
                    t = time.time()
                    self.samples[name].append((t, v["VmRSS"]))
                    self.parts[name].append((t, v.get("RssAnon", 0), v.get("RssFile", 0),
                                             v.get("RssShmem", 0)))
                except (OSError, ValueError, IndexError):
                    self._procs.pop(name, None)  # exited

    def stop(self):
        self._stop.set()
        self._thread.join()
