"""Follow a run's weight announcements and swap each new version into the engine, mid-flight.

Two small loops: the watcher records the newest announced version (KV watch, every update in order);
the updater fetches the newest one from the weight store and calls `engine.update_weights` between
decode steps, skipping versions that were superseded while it fetched. Generation never stops for it.
`lag` (newest announced - engine version) is what the staleness gate of the consumer reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from rollout_service.engines.base import Engine
from shared.messages import WeightVersion

log = logging.getLogger("jetrl.rollout.weights")

WatchFn = Callable[[], AsyncIterator[WeightVersion]]
FetchFn = Callable[[str, int], Awaitable[Path]]
LatestFn = Callable[[], Awaitable[WeightVersion | None]]


class WeightFollower:
    def __init__(self, engine: Engine, run: str, watch: WatchFn, fetch: FetchFn, latest: LatestFn | None = None,
                 retry_s: float = 1.0):
        self.engine, self.run_id, self._watch, self._fetch, self._latest = engine, run, watch, fetch, latest
        self.latest = -1  # newest announced version seen (-1: none yet)
        self.swaps = 0
        self.fetch_errors = 0
        self.retry_s = retry_s
        self._changed = asyncio.Event()

    @property
    def lag(self) -> int:
        return max(0, self.latest - self.engine.version)

    async def prime(self, timeout_s: float = 10.0) -> None:
        """Read the newest announcement once, so the staleness gate is right before the first fetch."""
        if self._latest is None:
            return
        try:
            wv = await asyncio.wait_for(self._latest(), timeout_s)
        except Exception as exc:
            log.warning("run %s: reading the latest weight version failed (%s: %s)", self.run_id,
                        type(exc).__name__, exc)
            return
        if wv is not None and wv.version > self.latest:
            self.latest = wv.version
            self._changed.set()

    async def run(self) -> None:
        await asyncio.gather(self._watcher(), self._updater())

    async def _watcher(self) -> None:
        wait = self.retry_s
        while True:
            try:
                async for wv in self._watch():
                    wait = self.retry_s
                    if wv.version > self.latest:
                        self.latest = wv.version
                        self._changed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("weight watch of run %s failed (%s: %s); re-watching in %.1fs", self.run_id,
                            type(exc).__name__, exc, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 10.0)

    async def _updater(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            while self.latest > self.engine.version:
                target = self.latest
                try:
                    path = await self._fetch(self.run_id, target)
                    await self.engine.update_weights(target, path=str(path))
                    self.swaps += 1
                    log.info("run %s: engine now on version %d", self.run_id, target)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.fetch_errors += 1
                    log.warning("run %s: could not load version %d (%s: %s); retrying in %.1fs", self.run_id,
                                target, type(exc).__name__, exc, self.retry_s)
                    await asyncio.sleep(self.retry_s)


def weight_store_source(cfg, js) -> tuple[WatchFn, FetchFn, LatestFn, Callable[[], Awaitable[None]]]:
    """watch/fetch/latest/close backed by weight_store.announce and weight_store.client."""
    from weight_store.announce import latest, watch
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(cfg.weights)
    return (lambda: watch(js, cfg.run)), client.fetch, (lambda: latest(js, cfg.run)), client.close
