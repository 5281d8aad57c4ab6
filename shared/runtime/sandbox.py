"""Run untrusted Python (the `code` scorer's programs, the rollout `python` tool) inside bubblewrap.

What the boundary is (docs/reward.md, "Code sandbox"): each run is a fresh `bwrap` with
- its own mount namespace holding only read-only /usr, /lib*, /bin and the interpreter's prefix, a
  private size-limited /tmp, a minimal /dev and /proc, and one writable work dir, `/sandbox`: a tmpfs of
  `Limits.disk_mb` into which the caller's files are copied by bwrap (`--file`), so no host dir is shared
  (a caller may still bind a host dir as the work dir, then bounded only by RLIMIT_FSIZE); the host's
  other files (home dirs, /etc, the run dir, secrets) do not exist inside;
- no network (its own network namespace: 127.0.0.1 inside is not the host's);
- its own pid namespace: when the program's main process ends, or the caller kills the sandbox, every
  process it started dies with it (a detached or daemonised child included); `--die-with-parent` ends
  it when the caller dies;
- an unprivileged user: as root the program runs as uid/gid 65534 (nobody) after `setpriv` drops every
  capability; as another user bwrap maps it to 65534 in a user namespace (host uid = the caller's);
- its own cgroup (shared/runtime/sandbox_cgroup.py) when the host has one to give: a memory limit for all its
  processes together (and its tmpfs pages) and its own `pids.max`, so a fork bomb or a memory hog in one
  sandbox cannot change another's result. Without cgroups (non-root, no delegation) it falls back to
  RLIMIT_NPROC, which uid 65534's processes on the host share across all sandboxes (one warning);
- rlimits on CPU time, address space (per process), file size, open files and core dumps; an empty
  environment but PATH/HOME/LANG; output read with a cap (the sandbox is killed past it).
What it is not: not a VM (one kernel: a kernel bug is an escape), and no seccomp filter.
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
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.runtime import sandbox_cgroup

SANDBOX_UID = 65534  # nobody
DEFAULT_NPROC = 64
WORKDIR = "/sandbox"  # the work dir inside when the caller passes no host dir


class SandboxUnavailable(RuntimeError):
    """bubblewrap (or setpriv, when running as root) is not installed."""


@dataclass
class Limits:
    cpu_s: int = 5
    memory_mb: int = 512  # RLIMIT_AS per process, and the whole sandbox's memory.max when in a cgroup
    file_bytes: int = 16 << 20
    nofile: int = 64
    nproc: int = DEFAULT_NPROC  # pids.max of the sandbox's cgroup; RLIMIT_NPROC (per uid) without cgroups
    disk_mb: int = 64  # size of the tmpfs work dir and of /tmp
    cgroups: str = "auto"  # auto | v2 | v1 | off (shared/runtime/sandbox_cgroup.py)
    cgroup_parent: str = ""  # a delegated cgroup v2 dir to create sandboxes under ('' = the service's own)
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


def command(argv: list[str], work: Path | None = None, ro_files: dict[str, str] | None = None,
            ro_dirs: list[str] | None = None, *, files: dict[str, int] | None = None,
            disk_bytes: int = 64 << 20) -> list[str]:
    """The bwrap command line running `argv`. Work dir: `work` (a host dir, bound writable at the same path)
    or, when None, a fresh tmpfs of `disk_bytes` at /sandbox holding `files` (path inside -> an fd the
    child inherits, copied in by bwrap). `ro_files` maps host files to read-only paths inside; `ro_dirs`
    are shown read-only at their path."""
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
    out += ["--proc", "/proc", "--dev", "/dev", "--size", str(disk_bytes), "--tmpfs", "/tmp"]
    binds = _interpreter_dirs() + [os.path.realpath(d) for d in ro_dirs or []]
    # bwrap would create the parents of a bind 0700 (root's): make them traversable by uid 65534
    out += _parent_dirs([*binds, *(ro_files or {}).values()])
    for d in binds:
        out += ["--ro-bind", d, d]
    if work is None:
        cwd = WORKDIR
        out += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", WORKDIR]
        for inside, fd in (files or {}).items():
            out += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{inside}"]
    else:
        cwd = str(work)
        out += ["--bind", cwd, cwd]
    for host, inside in (ro_files or {}).items():
        out += ["--ro-bind", host, inside]
    out += ["--chdir", cwd, "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", cwd,
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
    """Make a host `work` dir writable by the sandbox's user (as root: owned by uid 65534)."""
    if os.geteuid() == 0:
        os.chown(work, SANDBOX_UID, SANDBOX_UID)
    os.chmod(work, 0o700)


def rlimits(limits: Limits, cgroup: sandbox_cgroup.SandboxCgroup | None = None) -> Callable[[], None]:
    """preexec_fn applying `limits` (runs in the child between fork and exec; inherited by the sandbox) and
    moving the child into `cgroup` before bwrap starts. RLIMIT_NPROC counts every process of uid 65534 on
    the host (all sandboxes together), so it is set only when no cgroup gives this sandbox its own pids.max."""

    def apply() -> None:
        if cgroup is not None:
            cgroup.enter()
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if cgroup is None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))

    return apply


def new_cgroup(limits: Limits) -> sandbox_cgroup.SandboxCgroup | None:
    """A cgroup for one sandbox, or None when the host has none to give (then rlimits alone)."""
    backend = sandbox_cgroup.detect(limits.cgroups, limits.cgroup_parent)
    if backend is None:
        return None
    return sandbox_cgroup.SandboxCgroup(backend, limits.memory_mb << 20, limits.nproc)


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
    memory_limit: bool = False  # the cgroup's memory limit was reached (the kernel killed a process in it)


def _file_fds(files: dict[str, bytes] | None) -> tuple[dict[str, int], list]:
    """Unlinked temp files holding `files`' contents, for bwrap's `--file FD DEST` (no dir shared with the host)."""
    fds, handles = {}, []
    for name, data in (files or {}).items():
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"sandbox file name {name!r} must be a plain file name")
        f = tempfile.TemporaryFile()
        f.write(data)
        f.flush()
        f.seek(0)
        handles.append(f)
        fds[name] = f.fileno()
    return fds, handles


class Session:
    """One running sandbox whose stdin/stdout the caller talks over (request/reply), stderr read aside with
    a cap. `readline()` returns one line of stdout; `finish()` kills the sandbox, removes its cgroup and
    returns the Outcome (stdout = what was read and not returned as lines)."""

    def __init__(self, argv: list[str], limits: Limits, timeout_s: float, *, output_cap: int = 1 << 20,
                 files: dict[str, bytes] | None = None, work: Path | None = None,
                 ro_files: dict[str, str] | None = None, ro_dirs: list[str] | None = None):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout_s
        self.output_cap = output_cap
        self.timed_out = self.truncated = False
        fds, handles = _file_fds(files)
        cmd = command(argv, work, ro_files, ro_dirs, files=fds, disk_bytes=limits.disk_mb << 20)
        self.cgroup = new_cgroup(limits)
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True, close_fds=True, pass_fds=list(fds.values()),
                                         preexec_fn=rlimits(limits, self.cgroup))
        except BaseException:
            if self.cgroup is not None:
                self.cgroup.close()
            raise
        finally:
            for h in handles:
                h.close()
        self._attach()

    def _attach(self) -> None:
        """Set up the pipes' state once `self.proc` runs."""
        self.out, self.err = bytearray(), bytearray()
        self.pending = bytearray()  # stdin bytes not yet written
        self.stdin_open = self.stdout_open = True
        self.close_after = False
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.sel.register(self.proc.stderr, selectors.EVENT_READ)

    def send(self, data: bytes) -> None:
        self.pending += data

    def close_stdin(self) -> None:
        self.close_after = True  # _pump closes stdin once what was sent is written

    def _pump(self, until: Callable[[], bool]) -> bool:
        """Move bytes until `until()` or the end of stdout; False on the deadline, the cap or EOF first."""
        while not until():
            if self.pending and self.stdin_open:
                with contextlib.suppress(KeyError):
                    self.sel.register(self.proc.stdin, selectors.EVENT_WRITE)
            elif self.close_after and self.stdin_open and not self.pending:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.proc.stdin)
                self.proc.stdin.close()
                self.stdin_open = False
            if not self.stdout_open:
                return until()
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return False
            for key, _ in self.sel.select(min(left, 1.0)):
                if key.fileobj is self.proc.stdin:
                    try:
                        n = os.write(key.fd, self.pending[: 1 << 16])
                        del self.pending[:n]
                    except BlockingIOError:
                        pass
                    except (BrokenPipeError, OSError):
                        self.pending.clear()
                        self.stdin_open = False
                    if not self.pending:
                        with contextlib.suppress(KeyError, ValueError):
                            self.sel.unregister(self.proc.stdin)
                    continue
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                buf = self.out if key.fileobj is self.proc.stdout else self.err
                if not chunk:
                    self.sel.unregister(key.fileobj)
                    if key.fileobj is self.proc.stdout:
                        self.stdout_open = False
                    continue
                buf += chunk
                if len(buf) > self.output_cap:
                    del buf[self.output_cap:]
                    self.truncated = True
                    return False
        return True

    def readline(self) -> bytes | None:
        """The next line of stdout (without its newline); None on EOF, the deadline or the output cap."""
        if not self._pump(lambda: b"\n" in self.out):
            return None
        line, _, rest = bytes(self.out).partition(b"\n")
        self.out[:] = rest
        return line

    def read_to_end(self) -> None:
        """Read until the sandbox closes its stdout (or the deadline / cap)."""
        self._pump(lambda: False)

    def finish(self, wait: bool = False) -> Outcome:
        """End the sandbox (after waiting for its exit up to the deadline when `wait`) and clean up."""
        try:
            if wait and not (self.timed_out or self.truncated):
                try:
                    self.proc.wait(max(0.1, self.deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.timed_out = True
        finally:
            _kill(self.proc)
            self.proc.wait()
            self.sel.close()
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                with contextlib.suppress(OSError):
                    f.close()
            memory = False
            if self.cgroup is not None:
                memory = self.cgroup.memory_limit_hit()
                self.cgroup.close()
        return Outcome(self.proc.returncode, bytes(self.out), bytes(self.err), self.timed_out, self.truncated,
                       time.monotonic() - self.t0, memory)


def run(argv: list[str], work: Path | None, limits: Limits, timeout_s: float, *, stdin: bytes = b"",
        output_cap: int = 1 << 20, ro_files: dict[str, str] | None = None, ro_dirs: list[str] | None = None,
        files: dict[str, bytes] | None = None) -> Outcome:
    """Run `argv` in a fresh sandbox; stdout/stderr read up to `output_cap` bytes each (the sandbox is
    killed past it), the whole sandbox killed after `timeout_s`."""
    s = Session(argv, limits, timeout_s, output_cap=output_cap, files=files, work=work, ro_files=ro_files,
                ro_dirs=ro_dirs)
    try:
        s.send(stdin)
        s.close_stdin()
        s.read_to_end()
    finally:
        out = s.finish(wait=True)
    return out


async def run_async(argv: list[str], work: Path | None, limits: Limits, timeout_s: float, *,
                    output_cap: int = 1 << 20, ro_files: dict[str, str] | None = None,
                    ro_dirs: list[str] | None = None, files: dict[str, bytes] | None = None) -> Outcome:
    """`run` for asyncio callers (the rollout tools), stdin empty."""
    fds, handles = _file_fds(files)
    cmd = command(argv, work, ro_files, ro_dirs, files=fds, disk_bytes=limits.disk_mb << 20)
    cgroup = await asyncio.to_thread(new_cgroup, limits)
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, pass_fds=list(fds.values()), preexec_fn=rlimits(limits, cgroup))
    except BaseException:
        if cgroup is not None:
            await asyncio.to_thread(cgroup.close)
        raise
    finally:
        for h in handles:
            h.close()
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
        memory = False
        if cgroup is not None:
            memory = cgroup.memory_limit_hit()
            await asyncio.to_thread(cgroup.close)
    if timed_out and readers.done() and not readers.cancelled() and readers.exception() is None:
        out, err = readers.result()
    return Outcome(proc.returncode if proc.returncode is not None else -9, out, err, timed_out, state["truncated"],
                   time.monotonic() - t0, memory)
