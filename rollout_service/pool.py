"""Several rollout workers in one process (`rollout.service.workers_per_process`, `jetrl rollout --workers K`).

Hundreds of workers as hundreds of processes cost hundreds of Python interpreters, NATS connections,
announcement watches and downloads of every weight version. A pool runs K `RolloutWorker`s as asyncio
tasks of one process. Each keeps what makes it a worker: its own engine, prompt consumer (a pull
subscription on the run's durable consumer), staleness gate, reward client and id (`<base>-<i>`), so the
controller, the ledger and the trainer see K workers. What they share is what would only be repeated:

- one NATS connection;
- one watch of the run's weight announcements (`Broadcast`), read by every worker's WeightFollower;
- one WeightStoreClient, and one fetch per version for all workers (`fetch_once`): a version is
  downloaded (or rebuilt from its delta) and checked once per process, not once per worker (measured at
  256 workers in 4 processes: 64 workers checking the same files each took a version 0.5 s to reach);
- the tools (MCP servers started once per process), the tokenizer, and one /metrics endpoint whose series carry a `worker` label (`PoolCollector`).

The workers live and die together: SIGTERM stops them all (tasks in flight finish); a worker that ends
with an error (its engine died) stops the others, and the process exits with that error for its
supervisor to restart — the prompts it held are redelivered by JetStream as for any dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from rollout_service.service import RolloutWorker, worker_id
from shared.config import JetrlConfig
from shared.contract import bus
from shared.runtime.telemetry import start_metrics

log = logging.getLogger("jetrl.rollout.pool")


class Broadcast:
    """One async iterator (a watch) read once, every item handed to each subscriber in order.

    The source starts with the first subscriber. A subscriber joining later first gets the newest item
    so far (a watch's first item is the newest announcement: a late reader must not miss it). When the
    source fails or ends, each subscriber's iterator raises (or ends) the same way and the source is
    started again by the next subscription, which is what a WeightFollower does after a failed watch:
    re-watch after a back-off."""

    def __init__(self, source: Callable[[], AsyncIterator[Any]]):
        self._source = source
        self._queues: set[asyncio.Queue] = set()
        self._pump: asyncio.Task | None = None
        self._last: tuple[Any] | None = None  # (newest item,) of the running source

    def __call__(self) -> AsyncIterator[Any]:
        return self._subscribe()

    async def _subscribe(self) -> AsyncIterator[Any]:
        q: asyncio.Queue = asyncio.Queue()
        self._queues.add(q)
        if self._pump is None or self._pump.done():
            self._last = None
            self._pump = asyncio.create_task(self._run())
        elif self._last is not None:
            q.put_nowait(("item", self._last[0]))
        try:
            while True:
                kind, item = await q.get()
                if kind == "item":
                    yield item
                elif kind == "error":
                    raise item
                else:
                    return
        finally:
            self._queues.discard(q)

    async def _run(self) -> None:
        try:
            async for item in self._source():
                self._last = (item,)
                for q in list(self._queues):
                    q.put_nowait(("item", item))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for q in list(self._queues):
                q.put_nowait(("error", exc))
            return
        for q in list(self._queues):
            q.put_nowait(("end", None))

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump


class PoolCollector:
    """The metrics of every worker of the pool as one set of families, each series labelled `worker`."""

    def __init__(self, workers: list[RolloutWorker]):
        self.workers = workers

    def collect(self):
        merged: dict[str, Metric] = {}
        for w in self.workers:
            for fam in w.metrics.registry.collect():
                m = merged.get(fam.name)
                if m is None:
                    m = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                m.samples.extend(Sample(s.name, {**s.labels, "worker": w.instance}, s.value, s.timestamp, s.exemplar)
                                 for s in fam.samples)
        yield from merged.values()


def fetch_once(fetch: Callable, keep: int = 4) -> Callable:
    """`fetch(run, version)` run once per version for all callers: the first call fetches, the others
    await its result (a path, or the same error). A failed fetch is tried again by the next call; the
    newest `keep` versions' results are remembered."""
    results: dict[tuple[str, int], asyncio.Future] = {}

    async def once(run: str, version: int):
        key = (run, version)
        fut = results.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = results[key] = asyncio.ensure_future(fetch(run, version))
            for old in sorted(results, key=lambda k: k[1])[:-keep]:
                if results[old].done():
                    del results[old]
        return await asyncio.shield(fut)

    return once


def worker_ids(base: str | None, count: int) -> list[str]:
    """`count` worker ids: `base` itself for one worker, `<base>-<i>` for more (base: host-pid-random)."""
    base = base or worker_id()
    return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]


class WorkerPool:
    """K RolloutWorkers sharing one process's connection, announcement watch, weight client and tokenizer."""

    def __init__(self, cfg: JetrlConfig, count: int | None = None, *, instance: str | None = None,
                 tools=None, tokenizer=None, engine_factory: Callable[[], Any] | None = None):
        self.cfg = cfg
        self.count = count or cfg.rollout.service.workers_per_process
        self.ids = worker_ids(instance, self.count)
        self.tools, self.tokenizer, self.engine_factory = tools, tokenizer, engine_factory
        self.workers: list[RolloutWorker] = []
        self.nc = None
        self._closers: list[Callable] = []
        self._stopping = False

    async def start(self) -> None:
        cfg = self.cfg
        from shared.model.tinymodel import load_tokenizer

        tokenizer = self.tokenizer or await asyncio.to_thread(load_tokenizer, cfg.model.tokenizer or cfg.model.path)
        if self.tools is None:  # one registry for the pool
            from rollout_service.tools import build_tools

            self.tools = build_tools(cfg.rollout.tools)
        if cfg.rollout.tools.mcp and not self.tools.mcp_started:  # started once for the pool, closed with it
            from rollout_service.tools.mcp_tools import start_mcp_tools

            self._closers.append(await start_mcp_tools(cfg.rollout.tools, self.tools))
        self.nc = await bus.connect(cfg.nats, name=f"rollout-pool-{self.ids[0]}")
        weights = None
        if cfg.rollout.service.follow_weights:
            from rollout_service.weight_sync import weight_store_source

            watch, fetch, latest, close = weight_store_source(cfg, self.nc.jetstream())
            self._closers.append(close)
            shared_watch = Broadcast(watch)
            self._closers.append(shared_watch.close)

            once = fetch_once(fetch)

            async def fetch_quiet(run: str, version: int):  # the same fetch, without the byte counters
                return await once(run, version)

            once.stats = fetch.stats  # reported by the first worker only: one download, counted once
            weights = [(shared_watch, once if i == 0 else fetch_quiet, latest) for i in range(self.count)]
        # Each worker serves no /metrics of its own: the pool serves all of them on the configured port.
        wcfg = cfg.model_copy(update={"telemetry": cfg.telemetry.model_copy(update={"metrics_port": -1})})
        from rollout_service.engines import make_engine

        for i, wid in enumerate(self.ids):
            engine = self.engine_factory() if self.engine_factory else make_engine(cfg)
            self.workers.append(RolloutWorker(wcfg, engine=engine, tokenizer=tokenizer, tools=self.tools,
                                              weights=weights[i] if weights else None, instance=wid, nc=self.nc))
        # Started one after another: a failing start (the engine) is reported once, not K times at once.
        for w in self.workers:
            await w.start()
        if cfg.telemetry.metrics_port >= 0:
            registry = CollectorRegistry()
            registry.register(PoolCollector(self.workers))
            start_metrics(cfg.telemetry, registry)
        log.info("rollout pool: %d workers (%s .. %s) in one process", self.count, self.ids[0], self.ids[-1])

    def stop(self) -> None:
        self._stopping = True
        for w in self.workers:
            w.stop()

    async def run(self) -> None:
        """Serve until stop(); the first worker to end with an error stops the rest, and is raised."""
        if not self.workers:
            await self.start()
        tasks = [asyncio.create_task(w.run()) for w in self.workers]
        error: BaseException | None = None
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    exc = t.exception() if not t.cancelled() else None
                    if exc is not None and error is None:
                        error = exc
                        log.error("rollout pool: worker %s ended with %s: %s; stopping the pool",
                                  self.workers[tasks.index(t)].instance, type(exc).__name__, exc)
                        self.stop()
                    elif error is None and not self._stopping:
                        log.warning("rollout pool: worker %s stopped; stopping the pool",
                                    self.workers[tasks.index(t)].instance)
                        self.stop()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.close()
        if error is not None:
            raise error

    async def close(self) -> None:
        for close in self._closers:
            with contextlib.suppress(Exception):
                await close()
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await bus.flush(self.nc, timeout=5)
            with contextlib.suppress(Exception):
                await self.nc.close()


async def serve_pool(cfg: JetrlConfig, count: int | None = None, **parts: Any) -> None:
    """Run a pool until SIGTERM / SIGINT (then every worker finishes its tasks in flight)."""
    import signal

    pool = WorkerPool(cfg, count, **parts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, pool.stop)
    await pool.run()
