"""One cgroup per sandbox (shared/runtime/sandbox.py): a memory limit for all its processes together and a
process count of its own, so one sandbox cannot change another's result.

Where: cgroup v2 when its `memory` and `pids` controllers can be given to children of the service's own
cgroup (or of `parent`, a directory delegated to the service); else cgroup v1's `memory` and `pids`
hierarchies (a child of the service's own cgroup in each); else none (`detect()` returns None and the
caller falls back to rlimits, with one warning). The sandbox enters its cgroup before exec: the
`preexec_fn` of the `bwrap` process writes its own pid to `cgroup.procs`, so bwrap and every process
the program starts are inside from the first instruction (children inherit the cgroup; a process of
the sandbox cannot move itself out: the cgroup files belong to root, and the sandbox is uid 65534
without capabilities). `close()` kills whatever is left and removes the cgroup.

Limits: v2 `memory.max` (+ `memory.swap.max` 0, `memory.oom.group` 1), v1 `memory.limit_in_bytes` and
`memory.memsw.limit_in_bytes` (memory + swap, where the kernel has it); `pids.max` in both. tmpfs pages
the sandbox writes (its /tmp and work dir) are charged to its memory cgroup too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
_counter = itertools.count()


def _own_paths() -> dict[str, str]:
    """controller (or '' for v2) -> the service's own cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _mounts() -> tuple[Path | None, dict[str, Path]]:
    """(the cgroup2 mount, {v1 controller: its hierarchy's mount}) from /proc/self/mountinfo."""
    v2, v1 = None, {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3:
                continue
            mnt, fstype, opts = Path(fields[4]), rfields[0], rfields[2].split(",")
            if fstype == "cgroup2" and v2 is None:
                v2 = mnt
            elif fstype == "cgroup":
                for c in ("memory", "pids"):
                    if c in opts:
                        v1.setdefault(c, mnt)
    return v2, v1


@dataclass(frozen=True)
class Backend:
    version: int
    parents: dict[str, Path]  # v2: {"": dir}; v1: {"memory": dir, "pids": dir}


def _try_v2(mount: Path, own: str, parent: str) -> Backend | None:
    base = Path(parent) if parent else mount / own.lstrip("/")
    try:
        have = set((base / "cgroup.controllers").read_text().split())
        if not {"memory", "pids"} <= have:
            return None
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            # refused (EBUSY) when `base` holds processes and is not the root: then it is not usable
            (base / "cgroup.subtree_control").write_text("+memory +pids")
        probe = base / f"jetrl-probe-{os.getpid()}-{secrets.token_hex(4)}"
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return Backend(2, {"": base})


def _try_v1(mounts: dict[str, Path], own: dict[str, str]) -> Backend | None:
    if set(mounts) != {"memory", "pids"}:
        return None
    parents = {c: mounts[c] / own.get(c, "/").lstrip("/") for c in ("memory", "pids")}
    try:
        for d in parents.values():
            probe = d / f"jetrl-probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.mkdir()
            probe.rmdir()
    except OSError:
        return None
    return Backend(1, parents)


_detected: dict[tuple[str, str], Backend | None] = {}
_warned = False


def detect(mode: str = "auto", parent: str = "") -> Backend | None:
    """The cgroup backend sandboxes get (cached per process); None when `mode` is "off" or nothing is
    usable (non-root without a delegated cgroup, a read-only /sys/fs/cgroup): one warning then."""
    global _warned
    if mode == "off":
        return None
    key = (mode, parent)
    if key not in _detected:
        v2, v1 = _mounts()
        own = _own_paths()
        found = None
        if mode in ("auto", "v2") and v2 is not None:
            found = _try_v2(v2, own.get("", "/"), parent)
        if found is None and mode in ("auto", "v1"):
            found = _try_v1(v1, own)
        _detected[key] = found
        if found is not None:
            _sweep(found)
        if found is None and not _warned:
            _warned = True
            log.warning("sandbox: no usable cgroup (mode %s; v2 needs the memory and pids controllers delegated, v1 "
                        "a writable memory and pids hierarchy, i.e. root): falling back to rlimits, so memory is "
                        "bounded per process (RLIMIT_AS) and processes per uid (RLIMIT_NPROC), shared by all "
                        "sandboxes (docs/reward.md, 'Code sandbox')", mode)
    return _detected[key]


def _sweep(backend: Backend) -> None:
    """Remove the empty cgroups a killed service process left behind (its pid is in their name)."""
    for parent in backend.parents.values():
        with contextlib.suppress(OSError):
            for d in parent.glob("jetrl-sandbox-*"):
                try:
                    pid = int(d.name.split("-")[2])
                    os.kill(pid, 0)
                    continue  # its service process still runs
                except (ValueError, IndexError, PermissionError):
                    continue
                except ProcessLookupError:
                    pass
                with contextlib.suppress(OSError):
                    d.rmdir()  # refused while processes are left in it


class SandboxCgroup:
    """A fresh cgroup with `memory_bytes` and `pids_max`; enter it with `enter()` in the preexec_fn."""

    def __init__(self, backend: Backend, memory_bytes: int, pids_max: int):
        self.backend = backend
        name = f"jetrl-sandbox-{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
        self.dirs = [p / name for p in backend.parents.values()]
        made: list[Path] = []
        try:
            for d in self.dirs:
                d.mkdir()
                made.append(d)
            if backend.version == 2:
                d = self.dirs[0]
                (d / "memory.max").write_text(str(memory_bytes))
                for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if (d / knob).exists():
                        (d / knob).write_text(value)
                (d / "pids.max").write_text(str(pids_max))
            else:
                mem, pids = self.dirs
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (pids / "pids.max").write_text(str(pids_max))
        except OSError:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        self._procs = [str(d / "cgroup.procs") for d in self.dirs]

    def enter(self) -> None:
        """Move the calling process in (a preexec_fn: runs between fork and exec, so no allocation-heavy work)."""
        pid = str(os.getpid()).encode()
        for p in self._procs:
            fd = os.open(p, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def _pids(self) -> set[int]:
        out: set[int] = set()
        for p in self._procs:
            with contextlib.suppress(OSError, ValueError):
                out |= {int(x) for x in Path(p).read_text().split()}
        return out

    def memory_limit_hit(self) -> bool:
        """Whether the kernel's OOM killer acted in this cgroup (the whole-sandbox memory limit was reached)."""
        try:
            if self.backend.version == 2:
                events = dict(line.split() for line in (self.dirs[0] / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) > 0 or int(events.get("oom", 0)) > 0
            ctl = dict(line.split() for line in (self.dirs[0] / "memory.oom_control").read_text().splitlines())
            return int(ctl.get("oom_kill", 0)) > 0
        except (OSError, ValueError):
            return False

    def close(self, wait_s: float = 5.0) -> None:
        """Kill every process left in the cgroup and remove it."""
        kill_file = self.dirs[0] / "cgroup.kill" if self.backend.version == 2 else None
        deadline = time.monotonic() + wait_s
        pause = 0.0005
        while True:
            pids = self._pids()
            if not pids:
                break
            if kill_file is not None and kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            else:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                log.warning("sandbox: cgroup %s still has processes %s after %.0f s", self.dirs[0], sorted(pids),
                            wait_s)
                return
            time.sleep(pause)  # the kernel tears the pid namespace down in a few ms
            pause = min(pause * 2, 0.02)
        for d in self.dirs:
            for _ in range(50):  # the kernel may still be reaping the last task
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)
