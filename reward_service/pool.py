"""A process pool whose workers can be killed: CPU-heavy scorers with hard time limits.

concurrent.futures cannot stop a running task; here each worker is a process with a pipe, a job is
one completion, and a job that overruns its time limit gets its worker SIGKILLed and replaced (the
other jobs keep running). Workers fork from a forkserver that has already imported the scorer, so
a replacement starts in milliseconds rather than re-importing sympy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Any

from reward_service.scorers import Score, call_scorer, load_scorer

log = logging.getLogger("jetrl.reward.pool")


def _worker_main(conn: Connection, ref: str, cfg_json: str) -> None:
    """A worker: score one completion per message until the pipe closes."""
    import importlib
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    fn = load_scorer(ref)
    module = importlib.import_module(fn.__module__)
    configure = getattr(module, "configure", None)
    if configure is not None and cfg_json:
        from shared.config import RewardConfig

        configure(RewardConfig.model_validate_json(cfg_json))
    warmup = getattr(module, "warmup", None)
    if warmup is not None:  # first-call costs (lazy imports, caches) before the worker takes jobs
        warmup()
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        s = call_scorer(fn, *job)
        try:
            conn.send((s.reward, s.metrics, s.error))
        except Exception as exc:  # metrics that cannot be pickled
            conn.send((s.reward, {}, s.error or f"scorer metrics could not be sent: {exc}"))


class _Worker:
    def __init__(self, ctx: Any, ref: str, cfg_json: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, ref, cfg_json), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(120) or self.conn.recv() != "ready":  # blocking: called in a thread
            self.kill()
            raise RuntimeError(f"scorer worker for {ref!r} did not start (exit code {self.proc.exitcode})")

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class ProcessPool:
    """`size` worker processes running scorer `ref`; `await run(completion, reference, payload, timeout)`."""

    def __init__(self, size: int, ref: str, cfg_json: str = "", preload: list[str] | None = None):
        self.size, self.ref, self.cfg_json = size, ref, cfg_json
        self._ctx = mp.get_context("forkserver")
        module = ref.partition(":")[0]
        self._ctx.set_forkserver_preload(["reward_service.scorers", module, *(preload or [])])
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self.restarts = 0

    async def start(self) -> None:
        for _ in range(self.size):
            w = await asyncio.to_thread(_Worker, self._ctx, self.ref, self.cfg_json)
            self._all.add(w)
            self._idle.put_nowait(w)

    async def _replace(self, w: _Worker) -> None:
        self._all.discard(w)
        await asyncio.to_thread(w.kill)
        self.restarts += 1
        fresh = await asyncio.to_thread(_Worker, self._ctx, self.ref, self.cfg_json)
        self._all.add(fresh)
        self._idle.put_nowait(fresh)

    async def run(self, completion: str, reference: Any, payload: dict, timeout: float) -> Score:
        w = await self._idle.get()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        fd = w.conn.fileno()
        try:
            w.conn.send((completion, reference, payload))
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, timeout)
            finally:
                loop.remove_reader(fd)
            reward, metrics, error = w.conn.recv()
        except asyncio.TimeoutError:
            await self._replace(w)
            return Score(0.0, {}, f"scorer timed out after {timeout:g}s (its worker process was killed)")
        except (EOFError, OSError, BrokenPipeError):
            code = w.proc.exitcode
            await self._replace(w)
            return Score(0.0, {}, f"scorer process died (exit code {code})")
        except asyncio.CancelledError:
            await asyncio.shield(self._replace(w))
            raise
        self._idle.put_nowait(w)
        return Score(reward, metrics, error)

    async def close(self) -> None:
        for w in list(self._all):
            with contextlib.suppress(Exception):
                w.conn.send(None)
        await asyncio.to_thread(lambda: [w.kill() for w in list(self._all)])
        self._all.clear()
