"""The controller process: database, NATS connection, and per run a releaser, a bus follower and a
completion watch (completion.py).

`Controller(cfg)` opens the database (schema created at start-up). `await start()` connects to NATS
in the background (the REST API answers meanwhile; health says "connecting"), makes sure the streams
exist, and starts every run's tasks. Runs created later are started by `run_changed(run_id)`, which
the API calls from its worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

from sqlalchemy import select

from controller.completion import CompletionWatch
from controller.datasets import DatasetReader, private_dir
from controller.db import Dataset, Run, open_database
from controller.follower import RunFollower
from controller.metrics import ControllerMetrics
from controller.release import RunReleaser
from controller.rollouts import Tokenizers
from shared.config import JetrlConfig
from shared.contract import bus

log = logging.getLogger("jetrl.controller")


class Controller:
    def __init__(self, cfg: JetrlConfig):
        self.cfg = cfg
        self.ccfg = cfg.controller
        self.engine, self.Session = open_database(self.ccfg.db_url)
        self.metrics = ControllerMetrics(self.Session)
        self.tokenizers = Tokenizers()  # the rollout viewer's, one per run config
        self.data_dir = Path(self.ccfg.data_dir)
        for sub in ("", "datasets", "uploads"):  # 0700 whatever the umask: datasets are the user's data
            private_dir(self.data_dir / sub)
        self.nc = None
        self.js = None
        self.nats_state = "not started"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.releasers: dict[str, RunReleaser] = {}
        self.followers: dict[str, RunFollower] = {}
        self.watches: dict[str, CompletionWatch] = {}  # drain / run_complete (completion.py)
        self._watch_tasks: list[asyncio.Task] = []
        self._tasks: dict[str, asyncio.Task] = {}
        self._readers: dict[int, tuple[DatasetReader, str, str]] = {}
        self._readers_lock = threading.Lock()
        self._start_task: asyncio.Task | None = None
        self._weight_store = None  # one client for the diagnosis' store probes (evidence.py)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._start_task = asyncio.create_task(self._connect())

    async def _connect(self) -> None:
        self.nats_state = "connecting"
        self.nc = await bus.connect(self.cfg.nats, name="jetrl-controller")
        self.js = self.nc.jetstream()
        while True:
            try:
                await bus.ensure_streams(self.js, self.cfg.streams)
                break
            except Exception as exc:
                log.warning("cannot create JetStream streams yet (%s); retrying", exc)
                await asyncio.sleep(1.0)
        self.nats_state = "connected"
        with self.Session() as s:
            runs = list(s.scalars(select(Run.id)))
        for run_id in runs:
            self._activate(run_id)

    async def close(self) -> None:
        if self._start_task is not None:
            self._start_task.cancel()
            with contextlib.suppress(BaseException):
                await self._start_task
        for r in self.releasers.values():
            r.stop()
        for f in self.followers.values():
            await f.stop()
        for w in self.watches.values():
            w.stop()
        if self._watch_tasks:
            await asyncio.wait(self._watch_tasks, timeout=10.0)
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._weight_store is not None:
            with contextlib.suppress(Exception):
                await self._weight_store.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5.0)
        for reader, _, _ in self._readers.values():
            reader.close()
        self.engine.dispose()

    @property
    def ready(self) -> bool:
        return self.nats_state == "connected"

    def _activate(self, run_id: str) -> None:
        if not self.ready:
            return  # _connect() activates every run once connected
        rel = self.releasers.get(run_id)
        if rel is not None and not self._tasks[run_id].done():
            rel.wake()
            return
        rel = RunReleaser(self, run_id)
        self.releasers[run_id] = rel
        self._tasks[run_id] = asyncio.create_task(self._supervise(rel))
        if run_id not in self.followers:
            fol = RunFollower(self, run_id, rel)
            self.followers[run_id] = fol
            fol.start()
        else:
            self.followers[run_id].releaser = rel
        if run_id not in self.watches:
            self.watches[run_id] = CompletionWatch(self, run_id)
            self._watch_tasks.append(asyncio.create_task(self.watches[run_id].run()))

    async def _supervise(self, rel: RunReleaser) -> None:
        """Run a releaser; one that crashed (database down, a bug) starts over after a pause: the ledger
        tells it where it was, and unconfirmed prompts are republished under their ids."""
        while True:
            try:
                await rel.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("run %s: release loop failed; restarting in 2 s", rel.run_id)
                await asyncio.sleep(2.0)
                if rel._stop.is_set():
                    return

    def run_changed(self, run_id: str) -> None:
        """Thread-safe: a run was created, resumed, paused, stopped or got an enqueue."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._activate, run_id)

    def weight_store(self):
        """The weight-store client the diagnosis probes with (made on first use, closed with the controller)."""
        if self._weight_store is None:
            from weight_store.client import WeightStoreClient

            self._weight_store = WeightStoreClient(self.cfg.weights)
        return self._weight_store

    # --- datasets for the releaser ------------------------------------------------------------
    def reader(self, dataset_id: int) -> tuple[DatasetReader, str, str]:
        with self._readers_lock:
            hit = self._readers.get(dataset_id)
            if hit is None:
                with self.Session() as s:
                    d = s.get(Dataset, dataset_id)
                if d is None:
                    raise LookupError(f"dataset {dataset_id} vanished from the database")
                hit = (DatasetReader(d.path), d.content_hash, d.name)
                self._readers[dataset_id] = hit
            return hit

    # --- bus reads ----------------------------------------------------------------------------
    async def queue_depths(self, run_id: str) -> dict:
        """Prompts waiting / being generated, trajectories waiting for the trainer, dead letters."""
        from nats.js.errors import NotFoundError

        from shared.contract import subjects

        if not self.ready:
            return {"nats": self.nats_state}
        out: dict = {"nats": "connected"}

        async def consumer(stream: str, durable: str, key: str) -> None:
            try:
                ci = await self.js.consumer_info(stream, durable, timeout=2.0)
                out[key] = {"pending": ci.num_pending, "ack_pending": ci.num_ack_pending,
                            "redelivered": ci.num_redelivered, "consumer": durable}
            except NotFoundError:
                out[key] = {"pending": None, "ack_pending": None, "consumer": None}
            except Exception as exc:
                out[key] = {"error": f"{type(exc).__name__}: {exc}"}

        async def subject_count(stream: str, subject: str, key: str) -> None:
            try:
                si = await self.js.stream_info(stream, subjects_filter=subject)
                out[key] = sum((si.state.subjects or {}).values())
            except Exception as exc:
                out[key] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(
            consumer(subjects.PROMPTS_STREAM, subjects.rollout_consumer(run_id), "prompts"),
            consumer(subjects.TRAJECTORIES_STREAM, subjects.trainer_consumer(run_id), "trajectories"),
            subject_count(subjects.PROMPTS_STREAM, subjects.prompts(run_id), "prompts_in_stream"),
            subject_count(subjects.DLQ_STREAM, subjects.dlq_all(run_id), "dead_letters_in_stream"),
        )
        return out
