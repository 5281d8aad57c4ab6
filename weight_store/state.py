"""What one weight-store process holds beyond the disk: its Prometheus metrics, the downloads in
progress (retention never deletes a version being read), the uploads in progress (no commit during
one) and a lock per run. `create_app` makes one `StoreState` and puts it into `app.state.store`."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.config import WeightStoreConfig
from weight_store.storage import Storage

log = logging.getLogger("jetrl.weights.server")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.bytes_in = Counter("jetrl_weights_bytes_in", "Bytes received in uploads.", registry=r)
        self.bytes_out = Counter("jetrl_weights_bytes_out", "Bytes sent in downloads.", registry=r)
        self.sendfile_out = Counter("jetrl_weights_bytes_out_sendfile", "Download bytes sent with os.sendfile.",
                                    registry=r)
        self.versions = Gauge("jetrl_weights_versions", "Committed versions held, per run.", ["run"], registry=r)
        self.commits = Counter("jetrl_weights_commits", "Versions committed.", registry=r)
        self.commit_seconds = Histogram("jetrl_weights_commit_seconds", "Latency of a commit.", registry=r,
                                        buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10))
        self.deleted = Counter("jetrl_weights_deleted_versions", "Versions removed by retention.", registry=r)
        self.active = Gauge("jetrl_weights_active_downloads", "Downloads in progress.", registry=r)
        self.delta_bytes = Counter("jetrl_weights_delta_bytes", "Bytes of the deltas written at commit.", registry=r)
        self.delta_full_bytes = Counter("jetrl_weights_delta_full_bytes",
                                        "Bytes of the full versions those deltas stand for.", registry=r)
        self.refused = Counter("jetrl_weights_refused", "Requests refused, by error code.", ["code"], registry=r)


class StoreState:
    """What one service process holds beyond the disk: readers in progress and retention bookkeeping."""

    def __init__(self, cfg: WeightStoreConfig):
        self.cfg = cfg
        self.storage = Storage(cfg.root, fsync=cfg.fsync)
        self.metrics = Metrics()
        self.readers: Tally[tuple[str, int]] = Tally()
        self.retiring: set[tuple[str, int]] = set()
        self.locks: dict[str, asyncio.Lock] = {}
        self.uploading: Tally[tuple[str, int]] = Tally()  # uploads in progress per version
        self.chains: dict[tuple[str, int], list[str]] = {}  # relay fan-out: workers fetching a version, in order
        self.chunk = cfg.chunk_mb << 20

    def lock(self, run: str) -> asyncio.Lock:
        return self.locks.setdefault(run, asyncio.Lock())

    def busy(self, run: str) -> set[int]:
        return {v for (r, v), n in self.readers.items() if r == run and n > 0}

    async def retain(self, run: str) -> list[int]:
        """Delete versions beyond keep_last that are not pinned and not being downloaded."""
        async with self.lock(run):
            victims = await asyncio.to_thread(self.storage.to_retire, run, self.cfg.keep_last, self.busy(run))
            victims = [v for v in victims if self.readers[(run, v)] == 0]  # a reader may have started meanwhile
            self.retiring.update((run, v) for v in victims)
            try:
                for v in victims:
                    self.chains.pop((run, v), None)
                    await asyncio.to_thread(self.storage.delete, run, v)
                    self.metrics.deleted.inc()
                    log.info("retention: deleted version %d of run %s", v, run)
            finally:
                self.retiring.difference_update((run, v) for v in victims)
            self.metrics.versions.labels(run).set(len(await asyncio.to_thread(self.storage.versions, run)))
        return victims

    def reader_done(self, run: str, version: int) -> None:
        key = (run, version)
        self.readers[key] -= 1
        self.metrics.active.dec()
        if self.readers[key] <= 0:
            del self.readers[key]
            asyncio.get_running_loop().create_task(self.retain(run))
