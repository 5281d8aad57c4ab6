"""Run untrusted Python (the `code` scorer's programs, the rollout `python` tool) inside bubblewrap.

What the boundary is (docs/reward.md, "Code sandbox"): each run is a fresh `bwrap` with
- its own mount namespace holding only read-only /usr, /lib*, /bin and the interpreter's prefix, a
  private /tmp (tmpfs), a minimal /dev and /proc, and one writable work dir: the host's other files
  (home dirs, /etc, the run dir, secrets) do not exist inside;
- no network (its own network namespace: 127.0.0.1 inside is not the host's);
- its own pid namespace: when the program's main process ends, or the caller kills the sandbox, every
  process it started dies with it (a detached or daemonised child included); `--die-with-parent` ends
  it when the caller dies;
- an unprivileged user: as root the program runs as uid/gid 65534 (nobody) after `setpriv` drops every
  capability (the real host uid, so RLIMIT_NPROC bounds its processes); as another user bwrap maps it
  to 65534 in a user namespace (host uid = the caller's);
- rlimits on CPU time, address space, file size, open files, processes and core dumps; an empty
  environment but PATH/HOME/LANG; output read with a cap (the sandbox is killed past it).
What it is not: not a VM (one kernel: a kernel bug is an escape), no cgroup memory or pid limits
(RLIMIT_AS bounds memory per process, RLIMIT_NPROC the processes of uid 65534 on the host as root;
run as non-root the process bound is only the pid namespace, the CPU rlimit and the wall clock), and no
seccomp filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # nobody
DEFAULT_NPROC = 64


class SandboxUnavailable(RuntimeError):
    """bubblewrap (or setpriv, when running as root) is not installed."""


@dataclass
class Limits:
    cpu_s: int = 5
    memory_mb: int = 512
    file_bytes: int = 16 << 20
    nofile: int = 64
    nproc: int = DEFAULT_NPROC


def bwrap_binary() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable("bubblewrap is not installed: `apt-get install bubblewrap` (Debian/Ubuntu); untrusted "
                                 "code is never run without it")
    return path


def _interpreter_dirs() -> list[str]:
    """Directories the interpreter needs read-only: its real prefix (stdlib, libpython) when outside /usr."""
    dirs = []
    for p in (os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))):
        if not p.startswith(("/usr/", "/lib", "/bin")) and p != "/usr":
            dirs.append(p)
    out: list[str] = []
    for d in sorted(set(dirs), key=len):
        if not any(d == o or d.startswith(o + "/") for o in out):
            out.append(d)
    return out


def _parent_dirs(paths: list[str]) -> list[str]:
    out, seen = [], set()
    for p in paths:
        parts = Path(p).parent.parts
        for i in range(2, len(parts) + 1):
            d = str(Path(*parts[:i]))
            if d not in seen and d != "/tmp" and not d.startswith(("/usr", "/lib", "/bin", "/sbin", "/proc", "/dev")):
                seen.add(d)
                out += ["--perms", "0755", "--dir", d]
    return out


def python_binary() -> str:
    return os.path.realpath(sys.executable)


def command(argv: list[str], work: Path, ro_files: dict[str, str] | None = None,
            ro_dirs: list[str] | None = None) -> list[str]:
    """The bwrap command line running `argv` with `work` as its writable cwd (same path inside).
    `ro_files` maps host files to read-only paths inside; `ro_dirs` are shown read-only at their path."""
    bw = bwrap_binary()
    as_root = os.geteuid() == 0
    out = [bw, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not as_root:
        out += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    out += ["--ro-bind", "/usr", "/usr"]
    for d in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        out += ["--ro-bind-try", d, d]
    # the private /tmp first: binds below come on top of it (an interpreter or venv under the host's /tmp
    # stays visible)
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    binds = _interpreter_dirs() + [os.path.realpath(d) for d in ro_dirs or []]
    # bwrap would create the parents of a bind 0700 (root's): make them traversable by uid 65534
    out += _parent_dirs([*binds, *(ro_files or {}).values()])
    for d in binds:
        out += ["--ro-bind", d, d]
    out += ["--bind", str(work), str(work)]
    for host, inside in (ro_files or {}).items():
        out += ["--ro-bind", host, inside]
    out += ["--chdir", str(work), "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", str(work),
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONIOENCODING", "utf-8", "--setenv", "PYTHONHASHSEED", "0",
            "--"]
    if as_root:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("setpriv (util-linux) is not installed: as root the sandbox needs it to drop to "
                                     "an unprivileged user")
        out += [setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]
    return out + list(argv)


def prepare_workdir(work: Path) -> None:
    """Make `work` writable by the sandbox's user (as root: owned by uid 65534)."""
    if os.geteuid() == 0:
        os.chown(work, SANDBOX_UID, SANDBOX_UID)
    os.chmod(work, 0o700)


def rlimits(limits: Limits) -> Callable[[], None]:
    """preexec_fn applying `limits` (runs in the child between fork and exec; inherited by the sandbox)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))

    return apply


def _kill(proc) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap and its session; the pid namespace takes the rest


@dataclass
class Outcome:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool  # output passed the cap: the sandbox was killed
    elapsed_s: float


def run(argv: list[str], work: Path, limits: Limits, timeout_s: float, *, stdin: bytes = b"",
        output_cap: int = 1 << 20, ro_files: dict[str, str] | None = None, ro_dirs: list[str] | None = None) -> Outcome:
    """Run `argv` in a fresh sandbox; stdout/stderr read up to `output_cap` bytes each (the sandbox is
    killed past it), the whole sandbox killed after `timeout_s`."""
    cmd = command(argv, work, ro_files, ro_dirs)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, close_fds=True, preexec_fn=rlimits(limits))
    fd_out, fd_err = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {fd_out: bytearray(), fd_err: bytearray()}
    truncated = timed_out = False
    try:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
        proc.stdin.close()
        sel = selectors.DefaultSelector()
        for f in (proc.stdout, proc.stderr):
            sel.register(f, selectors.EVENT_READ)
        open_fds = 2
        while open_fds:
            left = timeout_s - (time.monotonic() - t0)
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_fds -= 1
                    continue
                buf = bufs[key.fd]
                buf += chunk[: max(0, output_cap + 1 - len(buf))]
                if len(buf) > output_cap:
                    truncated = True
                    open_fds = 0
                    break
        sel.close()
        if not (timed_out or truncated):
            try:
                proc.wait(max(0.1, timeout_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        _kill(proc)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return Outcome(proc.returncode, bytes(bufs[fd_out][:output_cap]), bytes(bufs[fd_err][:output_cap]), timed_out,
                   truncated, time.monotonic() - t0)


async def run_async(argv: list[str], work: Path, limits: Limits, timeout_s: float, *, output_cap: int = 1 << 20,
                    ro_files: dict[str, str] | None = None, ro_dirs: list[str] | None = None) -> Outcome:
    """`run` for asyncio callers (the rollout tools), stdin empty."""
    cmd = command(argv, work, ro_files, ro_dirs)
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, start_new_session=True,
                                                preexec_fn=rlimits(limits))
    state = {"truncated": False}

    async def read(stream) -> bytes:
        buf = bytearray()
        while chunk := await stream.read(1 << 16):
            buf += chunk[: max(0, output_cap + 1 - len(buf))]
            if len(buf) > output_cap:
                state["truncated"] = True
                _kill(proc)
                break
        return bytes(buf[:output_cap])

    timed_out = False
    readers = asyncio.gather(read(proc.stdout), read(proc.stderr))
    try:
        out, err = await asyncio.wait_for(asyncio.shield(readers), timeout_s)
        await asyncio.wait_for(proc.wait(), max(0.1, timeout_s - (time.monotonic() - t0)))
    except asyncio.TimeoutError:
        timed_out = True
        out, err = b"", b""
    finally:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        if not readers.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(readers, 5)
    if timed_out and readers.done() and not readers.cancelled() and readers.exception() is None:
        out, err = readers.result()
    return Outcome(proc.returncode if proc.returncode is not None else -9, out, err, timed_out, state["truncated"],
                   time.monotonic() - t0)
