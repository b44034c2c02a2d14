"""Machines made on this one, for multi-node tests (standard library only; needs root).

A Cluster is N "nodes": each a network namespace with its own address (10.77.0.K+1/24 on a veth
whose other end sits on a bridge of the test's own), its own temporary NVMe directory and its
own processes, started inside the namespace with `ip netns exec`. Traffic between nodes crosses
the bridge: a fault on one node's link (down, dropped, rate-limited) is a fault between machines.

Every name carries the test's pid (smn<pid>...), so tests started at once never meet, and a
sweep at start removes what a killed test left (names whose pid is no longer alive). The Cluster
removes what it made on exit, on an exception, and on SIGTERM/SIGINT/SIGHUP (CTest's timeout).

Faults this kernel supports (checked here: no netem, no gact/matchall, no iptables):
  link_down(k)  the node's interface goes down inside its namespace
  drop(k)       the node's bridge port is detached: the node's interface stays up, but every
                frame it sends or should receive vanishes without a word (a silent firewall)
  rate(k, bits) tbf on both ends of the node's veth: a slow link
  kill(k)       SIGKILL to every process of the node's namespace (the machine dies)
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "smn"
SUBNET = "10.77.0."

SKIP = 77


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def why_unsupported():
    """None when namespaces can be made here, else the reason (the test skips with it)."""
    if os.geteuid() != 0:
        return "multi-node tests make network namespaces and need root"
    if shutil.which("ip") is None:
        return "multi-node tests need the ip command (iproute2)"
    if shutil.which("tc") is None:
        return "multi-node tests need the tc command (iproute2)"
    # Everything a Cluster makes, once, on throw-away names: a namespace, a bridge, a veth pair
    # and a tbf qdisc (a kernel without one of them skips the tests, saying which).
    tag = f"{PREFIX}{os.getpid()}"
    steps = [
        ("a network namespace", ["ip", "netns", "add", f"{tag}-probe"]),
        ("a bridge", ["ip", "link", "add", f"{tag}pb", "type", "bridge"]),
        ("a veth pair", ["ip", "link", "add", f"{tag}pv", "type", "veth", "peer", "name",
                         f"{tag}pw"]),
        ("a veth on a bridge", ["ip", "link", "set", f"{tag}pv", "master", f"{tag}pb"]),
        ("a tbf qdisc (tc)", ["tc", "qdisc", "add", "dev", f"{tag}pv", "root", "tbf", "rate",
                              "1mbit", "burst", "16kb", "latency", "50ms"]),
    ]
    why = None
    for what, argv in steps:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            why = f"cannot make {what} here ({' '.join(argv)}: {r.stderr.strip()})"
            break
    _ip("link", "del", f"{tag}pv", check=False)
    _ip("link", "del", f"{tag}pb", check=False)
    _ip("netns", "del", f"{tag}-probe", check=False)
    return why


def sweep_stale():
    """Removes namespaces and links of tests that were killed (their pid is gone)."""
    pattern = re.compile(rf"^{PREFIX}(\d+)")
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = pattern.match(name)
        if m and not _alive(int(m.group(1))):
            _kill_namespace(name)
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = pattern.match(name)
        if m and not _alive(int(m.group(1))):
            _ip("link", "del", name, check=False)


def _kill_namespace(name):
    """SIGKILL to every process in the namespace; True when some were found."""
    r = _ip("netns", "pids", name, check=False)
    pids = [int(p) for p in r.stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return bool(pids)


class Cluster:
    def __init__(self, nodes):
        self.n = nodes
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{self.tag}b"
        self.made_bridge = False
        self.namespaces = []
        self.nvme = []
        self.procs = []
        self._old_handlers = {}

    # Names: namespace smn<pid>-<k>, host end smn<pid>h<k>, node end smn<pid>n<k> (<= 15 chars).
    def ns(self, k):
        return f"{self.tag}-{k}"

    def addr(self, k):
        return f"{SUBNET}{k + 1}"

    def host_end(self, k):
        return f"{self.tag}h{k}"

    def node_end(self, k):
        return f"{self.tag}n{k}"

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            sweep_stale()
            _ip("link", "add", self.bridge, "type", "bridge")
            self.made_bridge = True
            _ip("link", "set", self.bridge, "up")
            for k in range(self.n):
                ns = self.ns(k)
                _ip("netns", "add", ns)
                self.namespaces.append(ns)
                _ip("link", "add", self.host_end(k), "type", "veth", "peer", "name", self.node_end(k))
                _ip("link", "set", self.node_end(k), "netns", ns)
                _ip("link", "set", self.host_end(k), "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(k)}/24", "dev", self.node_end(k))
                _ip("-n", ns, "link", "set", self.node_end(k), "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.nvme.append(tempfile.mkdtemp(prefix=f"{self.tag}-nvme{k}-"))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _on_signal(self, sig, _frame):
        self.close()
        sys.exit(128 + sig)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for ns in self.namespaces:
            # Whatever still runs there (a rank that outlived its launcher) dies with the node.
            for _ in range(50):
                if not _kill_namespace(ns):
                    break
                time.sleep(0.02)
            _ip("netns", "del", ns, check=False)
        self.namespaces = []
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        for k in range(self.n):
            _ip("link", "del", self.host_end(k), check=False)
        if self.made_bridge:
            _ip("link", "del", self.bridge, check=False)
            self.made_bridge = False
        for d in self.nvme:
            shutil.rmtree(d, ignore_errors=True)
        self.nvme = []
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}

    # ---- processes ----------------------------------------------------------------------------
    def start(self, k, argv, env=None, out=None):
        """Starts argv inside node k's namespace, with STRATA_NVME_PATHS set to its own
        directory; stdout and stderr go to `out` (a file) or are captured."""
        e = dict(os.environ if env is None else env)
        e["STRATA_NVME_PATHS"] = self.nvme[k]
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(k), *argv],
            env=e,
            stdout=out if out is not None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(p)
        return p

    def pids(self, k):
        return [int(p) for p in _ip("netns", "pids", self.ns(k), check=False).stdout.split()]

    def leftovers(self):
        """{node: pids} of processes still running in the nodes' namespaces."""
        return {k: self.pids(k) for k in range(self.n) if self.pids(k)}

    # ---- faults ---------------------------------------------------------------------------------
    def link_down(self, k):
        _ip("-n", self.ns(k), "link", "set", self.node_end(k), "down")

    def drop(self, k):
        _ip("link", "set", self.host_end(k), "nomaster")

    def rate(self, k, rate, burst="16kb", latency="400ms"):
        """tbf on both ends of node k's veth; `latency` bounds its queue (packets that would
        wait longer are dropped)."""
        for args in (["-n", self.ns(k)], []):
            dev = self.node_end(k) if args else self.host_end(k)
            subprocess.run(["tc", *args, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                            rate, "burst", burst, "latency", latency], check=True,
                           capture_output=True, text=True)

    def kill(self, k):
        _kill_namespace(self.ns(k))
