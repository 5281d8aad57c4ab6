"""Hosts made of Linux network namespaces on a private bridge, for multi-host tests, benchmarks and people.

    with HostNet(["a", "b", "c"]) as net:
        proc = net.spawn("a", ["nats-server", "-a", net.addr("a"), "-p", "4222"], log=path)
        net.cut("b"); net.restore("b")        # pull host b's cable for a while
        net.kill_all("c")                      # every process on host c, as a machine dying would
        net.add_host("d")                      # a new host mid-run
        net.limit("a", 1000)                   # host a sends at most 1 Gbit/s (tc tbf on its eth0)

Layout (nothing but one veth touches the caller's namespace):

    switch ns  <prefix>-sw : bridge br0, one port per host (h<i>), and r0 for the runner
    host ns    <prefix>-<name> : eth0 = 10.219.N.(10+i)/24 (+ lo up); default route none
    runner     the caller's namespace: veth <prefix> = 10.219.N.1/24, so tests reach every host

The harness owns 10.219.0.0/16: one free /24 of 10.219.1-200 per instance (a lock file serialises
the choice), so several harnesses can run at once; 10.219.250.0/24 is the compose test's network and
10.219.251.0/24 the default bridge of a private dockerd (multihost/images.py). Names carry the
owner's pid: a harness whose owner died (SIGKILLed pytest) is swept by the next one (`sweep()`, also
`python -m multihost sweep`).

Cutting a link sets the host's bridge port down: the host keeps its address and its processes run on,
but nothing crosses the bridge (packets are dropped, TCP retransmits), as with a pulled cable. Needs
root (CAP_NET_ADMIN / CAP_SYS_ADMIN) and iproute2; `available()` says why not where it cannot work.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.runtime.parent_death import parent_death_preexec

log = logging.getLogger("jetrl.netns")

SUPERNET = ipaddress.ip_network("10.219.0.0/16")
LOCK_FILE = "/run/jetrl-netns.lock"
NAME_RE = re.compile(r"^jrl(\d+)x(\d+)(?:-(.+))?$")  # jrl<owner pid>x<instance>[-<host>]
_instances = 0


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, a sandbox without CAP_NET_ADMIN)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def available() -> tuple[bool, str]:
    """(True, '') when this process can create network namespaces with a veth pair; else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (ip netns add); run as root or in CI"
    try:
        probe = f"jrl{os.getpid()}x999-probe"
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return False, "iproute2 (`ip`) is not installed"
    if r.returncode != 0:
        return False, f"`ip netns add` failed: {r.stderr.strip()}"
    try:
        r = subprocess.run(["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return False, f"cannot create a veth pair: {r.stderr.strip()}"
        return True, ""
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ns_pids(ns: str) -> list[int]:
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _kill_ns(ns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in namespace `ns` until none is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = _ns_pids(ns)
        if not pids:
            return
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.05)
    log.warning("processes %s in %s survived SIGKILL for %.0fs", _ns_pids(ns), ns, timeout_s)


def sweep(only_dead: bool = True) -> list[str]:
    """Remove namespaces and runner veths of harnesses whose owner process is gone (all of ours if
    `only_dead` is false). Returns what was removed."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NAME_RE.match(name)
        if m and (not only_dead or not _pid_alive(int(m.group(1)))):
            _kill_ns(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        dev = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = NAME_RE.match(dev)
        if m and m.group(3) is None and (not only_dead or not _pid_alive(int(m.group(1)))):
            _ip("link", "del", dev, check=False)
            removed.append(dev)
    return removed


@dataclass
class Host:
    name: str
    ns: str  # network namespace name (`ip netns exec <ns> ...`)
    addr: str  # its address on the bridge
    port: str  # its bridge port in the switch namespace
    procs: list[subprocess.Popen] = field(default_factory=list)


class HostNet:
    """N hosts on one private bridge; `close()` (or leaving the `with`) removes everything it made."""

    def __init__(self, names: Iterable[str] = (), *, start_index: int = 10):
        global _instances
        _instances += 1
        self.prefix = f"jrl{os.getpid()}x{_instances}"
        assert len(self.prefix) <= 15, self.prefix  # the runner's veth carries it as its name
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self._names = list(names)
        self._next = start_index
        self.subnet: ipaddress.IPv4Network | None = None
        self.runner_addr = ""
        self._made = False

    # --- life cycle ---------------------------------------------------------------------------------
    def create(self) -> HostNet:
        ok, why = available()
        if not ok:
            raise NetnsUnavailable(why)
        sweep()
        self._made = True
        try:
            with open(LOCK_FILE, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.subnet = self._free_subnet()
                _ip("netns", "add", self.switch)
                _ip("-n", self.switch, "link", "set", "lo", "up")
                _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
                _ip("-n", self.switch, "link", "set", "br0", "up")
                # the runner's leg: created here, its peer moved into the switch
                _ip("link", "add", self.prefix, "type", "veth", "peer", "name", f"{self.prefix}p")
                _ip("link", "set", f"{self.prefix}p", "netns", self.switch, "name", "r0")
                _ip("-n", self.switch, "link", "set", "r0", "master", "br0", "up")
                self.runner_addr = str(self.subnet.network_address + 1)
                _ip("addr", "add", f"{self.runner_addr}/{self.subnet.prefixlen}", "dev", self.prefix)
                _ip("link", "set", self.prefix, "up")
            for name in self._names:
                self.add_host(name)
        except BaseException:
            self.close()
            raise
        return self

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = set()
        for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
            with contextlib.suppress(ValueError):
                used.add(ipaddress.ip_network(line.split()[0], strict=False))
        start = os.getpid() % 200
        for k in range(200):
            net = ipaddress.ip_network(f"10.219.{(start + k) % 200 + 1}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return net
        raise RuntimeError(f"no free /24 left in {SUPERNET} for a test network")

    def add_host(self, name: str) -> Host:
        """A new host on the bridge (also mid-run)."""
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        if not re.fullmatch(r"[a-z0-9]{1,12}", name):
            raise ValueError(f"host name {name!r}: use 1-12 lower-case letters or digits")
        i = self._next
        self._next += 1
        addr = str(self.subnet.network_address + i)
        ns, port = f"{self.prefix}-{name}", f"h{i}"
        tmp = f"{self.prefix}t"
        _ip("netns", "add", ns)
        self.hosts[name] = Host(name, ns, addr, port)
        _ip("link", "add", tmp, "type", "veth", "peer", "name", f"{tmp}p")
        _ip("link", "set", tmp, "netns", ns, "name", "eth0")
        _ip("link", "set", f"{tmp}p", "netns", self.switch, "name", port)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return self.hosts[name]

    def close(self) -> None:
        """Kill every process on every host, delete the namespaces (their veths go with them) and the
        runner's veth. Safe to call twice and after a failed create()."""
        if not self._made:
            return
        for h in list(self.hosts.values()):
            _kill_ns(h.ns)
            for p in h.procs:
                with contextlib.suppress(Exception):
                    p.wait(timeout=5)
            _ip("netns", "del", h.ns, check=False)
        self.hosts.clear()
        _ip("netns", "del", self.switch, check=False)
        _ip("link", "del", self.prefix, check=False)
        self._made = False

    def __enter__(self) -> HostNet:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- using the hosts ----------------------------------------------------------------------------
    def addr(self, name: str) -> str:
        return self.hosts[name].addr

    def exec_argv(self, name: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on host `name` (for a person: paste it after `sudo`)."""
        return ["ip", "netns", "exec", self.hosts[name].ns, *argv]

    def spawn(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
              log: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None) -> subprocess.Popen:
        """Start `argv` on host `name` (stdout+stderr appended to `log`); it dies if this process dies."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(self.exec_argv(name, argv), env={**os.environ, **(env or {})}, cwd=cwd,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=parent_death_preexec())
        finally:
            if log:
                out.close()
        self.hosts[name].procs.append(proc)
        return proc

    def run(self, name: str, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(self.exec_argv(name, argv), capture_output=True, text=True, timeout=timeout)

    def pids(self, name: str) -> list[int]:
        return _ns_pids(self.hosts[name].ns)

    def kill_all(self, name: str) -> list[int]:
        """SIGKILL every process on host `name` (the host died); returns their pids. The host stays, so
        processes can be started on it again."""
        pids = _ns_pids(self.hosts[name].ns)
        _kill_ns(self.hosts[name].ns)
        for p in self.hosts[name].procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        return pids

    def cut(self, name: str) -> None:
        """Pull host `name`'s cable: its bridge port goes down; nothing reaches or leaves it."""
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "down")

    def restore(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "up")

    def limit(self, name: str, mbit: float, burst_kb: int = 256, latency_ms: int = 25) -> None:
        """Rate-limit what host `name` sends to `mbit` Mbit/s (a token bucket on its eth0), so that links, not
        this machine's cores, bound a transfer; `mbit` 0 removes the limit."""
        ns = self.hosts[name].ns
        if mbit <= 0:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"],
                           capture_output=True, timeout=30)
            return
        r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                            "rate", f"{mbit}mbit", "burst", f"{burst_kb}kb", "latency", f"{latency_ms}ms"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"tc on host {name} failed: {r.stderr.strip()}")

    def describe(self) -> str:
        lines = [f"bridge {self.subnet} in namespace {self.switch}; this shell is {self.runner_addr}"]
        for h in self.hosts.values():
            lines.append(f"  {h.name:<8} {h.addr:<15} ip netns exec {h.ns} <command>")
        return "\n".join(lines)
