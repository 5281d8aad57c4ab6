"""Supervise jetrl services as child processes: prefixed, colourised logs (also written to files in
the run dir), restart of a crashed child with exponential back-off, clean shutdown in reverse order.

A crash loop ends the run instead of restarting for ever: a child that exits with an error
`crash_loop_restarts` times within `crash_loop_window_s` is not restarted again, and `failure` (awaited by
`wait_failure()`) names it with its last log lines, so `jetrl up` can stop with that error.

Used by `jetrl up` / `jetrl demo`. Children are ordinary `jetrl <service>` processes, so what runs here
is exactly what runs on separate hosts or in containers. Each child's environment names this process
(JETRL_SUPERVISOR_PID): a `jetrl` child then takes SIGTERM when the supervisor dies, even by SIGKILL, instead
of running on without it (shared/runtime/parent_death.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.runtime.parent_death import SUPERVISOR_ENV

log = logging.getLogger("jetrl.supervisor")

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta"]


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    restart: bool = True  # restart after a crash (non-zero exit); a clean exit 0 is never restarted
    ready_line: str = ""  # a log substring that means the service is up (informational)


@dataclass
class ChildState:
    spec: ProcessSpec
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    last_exit: int | None = None
    started_at: float = 0.0
    ready: bool = False
    finished: bool = False  # exited 0 and is not restarted
    failures: collections.deque = field(default_factory=collections.deque)  # monotonic times of error exits
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))  # last output lines
    crash_loop: bool = False  # gave up on it


@dataclass
class CrashLoop:
    """A child that kept failing: the run cannot go on."""

    name: str
    failures: int
    window_s: float
    last_exit: int | None
    lines: list[str]

    def message(self) -> str:
        head = (f"{self.name} failed {self.failures} times within {self.window_s:.0f}s (last exit code "
                f"{self.last_exit}); not restarting it. Its last log lines:")
        return "\n".join([head, *("  " + line for line in self.lines)])


class Supervisor:
    def __init__(self, specs: list[ProcessSpec], run_dir: str | os.PathLike, console=None,
                 max_backoff_s: float = 30.0, echo: bool = True, crash_loop_restarts: int = 5,
                 crash_loop_window_s: float = 300.0, error_lines: int = 20):
        self.children = {s.name: ChildState(s) for s in specs}
        self.order = [s.name for s in specs]
        self.log_dir = Path(run_dir) / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        self.max_backoff_s = max_backoff_s
        self.echo = echo
        self.crash_loop_restarts, self.crash_loop_window_s = crash_loop_restarts, crash_loop_window_s
        self.error_lines = error_lines
        self.failure: CrashLoop | None = None
        self._failed = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task] = []

    def colour(self, name: str) -> str:
        return COLOURS[self.order.index(name) % len(COLOURS)]

    async def start(self) -> None:
        for name in self.order:
            self._tasks.append(asyncio.create_task(self._keep_running(self.children[name]), name=f"sup-{name}"))

    async def add(self, spec: ProcessSpec) -> None:
        self.children[spec.name] = ChildState(spec)
        self.order.append(spec.name)
        self._tasks.append(asyncio.create_task(self._keep_running(self.children[spec.name])))

    async def _spawn(self, child: ChildState) -> None:
        # SUPERVISOR_ENV: the child takes SIGTERM if this process dies (shared/runtime/parent_death.py)
        env = {**os.environ, **child.spec.env, "PYTHONUNBUFFERED": "1", SUPERVISOR_ENV: str(os.getpid())}
        child.proc = await asyncio.create_subprocess_exec(
            *child.spec.argv, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C goes to us; we stop children in order
        )
        child.started_at = time.monotonic()
        child.ready = not child.spec.ready_line

    async def _keep_running(self, child: ChildState) -> None:
        backoff = 1.0
        logf = open(self.log_dir / f"{child.spec.name}.log", "a", buffering=1)
        try:
            while not self._stopping:
                await self._spawn(child)
                self._say(child.spec.name, f"started pid {child.proc.pid}: {' '.join(child.spec.argv)}")
                await self._pump(child, logf)
                code = await child.proc.wait()
                child.last_exit = code
                if self._stopping:
                    break
                if code == 0:  # a service that ends by itself is done (e.g. trainer at total_steps)
                    child.finished = True
                    self._say(child.spec.name, "finished")
                    break
                if not child.spec.restart:
                    self._say(child.spec.name, f"exited with {code}; not restarted")
                    break
                if self._crash_looping(child):
                    break
                if time.monotonic() - child.started_at > 60:
                    backoff = 1.0  # it ran a while: a fresh failure, not a crash loop
                child.restarts += 1
                self._say(child.spec.name, f"exited with {code}; restart #{child.restarts} in {backoff:.0f}s")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            logf.close()

    async def _pump(self, child: ChildState, logf) -> None:
        assert child.proc and child.proc.stdout
        while True:
            line = await child.proc.stdout.readline()
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            logf.write(text + "\n")
            child.tail.append(text)
            if child.spec.ready_line and child.spec.ready_line in text:
                child.ready = True
            if self.echo:
                self._say(child.spec.name, text)

    def _crash_looping(self, child: ChildState) -> bool:
        """Record an error exit; True (and `failure` set) once the child failed too often too fast."""
        now = time.monotonic()
        child.failures.append(now)
        while child.failures and now - child.failures[0] > self.crash_loop_window_s:
            child.failures.popleft()
        if len(child.failures) < self.crash_loop_restarts:
            return False
        child.crash_loop = True
        lines = [t for t in child.tail if t.strip()][-self.error_lines:]
        if self.failure is None:
            self.failure = CrashLoop(child.spec.name, len(child.failures), self.crash_loop_window_s,
                                     child.last_exit, lines)
            self._failed.set()
        self._say(child.spec.name, f"exited with {child.last_exit}: {len(child.failures)} failures within "
                                   f"{self.crash_loop_window_s:.0f}s, a crash loop; not restarting it")
        return True

    async def wait_failure(self) -> CrashLoop:
        """Return when a child is given up as crash-looping."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    def _say(self, name: str, text: str) -> None:
        if self.console is not None:
            from rich.markup import escape

            self.console.print(f"[{self.colour(name)}]{name:>10}[/] | {escape(text)}", highlight=False)
        else:
            log.info("%s | %s", name, text)

    def status(self) -> dict[str, dict]:
        out = {}
        for name in self.order:
            c = self.children[name]
            running = c.proc is not None and c.proc.returncode is None
            out[name] = {"pid": c.proc.pid if c.proc else None, "running": running, "restarts": c.restarts,
                         "last_exit": c.last_exit, "ready": c.ready, "finished": c.finished,
                         "crash_loop": c.crash_loop}
        return out

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one child (fault tests); it is restarted like any crash."""
        c = self.children[name]
        if c.proc and c.proc.returncode is None:
            c.proc.send_signal(sig)

    async def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every child in reverse start order (the trainer and rollouts before NATS), then SIGKILL
        whatever is still running after `timeout_s`."""
        self._stopping = True
        for name in reversed(self.order):
            c = self.children[name]
            if c.proc and c.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(c.proc.wait(), timeout_s)
                except asyncio.TimeoutError:
                    self._say(name, f"did not stop in {timeout_s:.0f}s; killing")
                    with contextlib.suppress(ProcessLookupError):
                        c.proc.kill()
                    await c.proc.wait()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
