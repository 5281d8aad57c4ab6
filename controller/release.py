"""Release with admission control: publish a run's enqueued prompts to `jetrl.<run>.prompts` while the
groups released and not freed stay within (trainer step + max_staleness + 1) * batch_size, and
within total_steps * batch_size when the run has a length (so it ends with nothing in flight).

One `RunReleaser` task per run. Each batch is written to the ledger first (ledger.reserve) and then
published with publish_async under Nats-Msg-Id = group id; the ack watermark (runs.published_seq) is
advanced in the next batch's transaction. The DB write of batch k+1 overlaps the JetStream acks of
batch k. The loop sleeps until something can change the bound: a new weight version, a freed group,
a new enqueue, resume (`wake()`), or poll_interval_s.

Which rows go next: `launch.sampling` of the run's config. `uniform` releases each epoch in its order
(`position`: file order, or shuffled by (seed, epoch)); `learnable-first` reorders the rest of the
current epoch by the prompt memory (sampling.py), releasing every row exactly once per epoch all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import select

from controller import ledger
from controller.db import RELEASED, Enqueue, Ledger, Run, now
from controller.sampling import LearnableFirst
from shared.config import JetrlConfig
from shared.contract import bus, subjects
from shared.contract.messages import PromptTask

log = logging.getLogger("jetrl.controller.release")


def prompt_id_for(content_hash: str, row_index: int) -> str:
    """Prompt ids are unique per dataset content, so two datasets in one run never collide."""
    return f"{content_hash[:12]}-{row_index}"


def _permutation(enq: Enqueue, local_epoch: int, perm_cache: dict) -> np.ndarray:
    key = (enq.id, local_epoch)
    perm = perm_cache.get(key)
    if perm is None:
        perm = np.random.default_rng([enq.shuffle_seed & 0xFFFFFFFF, local_epoch]).permutation(enq.rows_per_epoch)
        if len(perm_cache) > 64:
            perm_cache.clear()
        perm_cache[key] = perm
    return perm


def position(enq: Enqueue, pos: int, perm_cache: dict) -> tuple[int, int]:
    """(epoch, row index) of the `pos`-th prompt of an enqueue: epochs in order, rows shuffled per epoch
    by (shuffle_seed, epoch) when a seed is set, else in file order; `limit` keeps the first rows."""
    local_epoch, k = divmod(pos, enq.rows_per_epoch)
    if enq.shuffle_seed is None:
        return enq.epoch_offset + local_epoch, k
    return enq.epoch_offset + local_epoch, int(_permutation(enq, local_epoch, perm_cache)[k])


def epoch_order(enq: Enqueue, local_epoch: int, perm_cache: dict) -> np.ndarray:
    """Every row index of one epoch in `position`'s order (the order learnable-first breaks ties by)."""
    if enq.shuffle_seed is None:
        return np.arange(enq.rows_per_epoch)
    return _permutation(enq, local_epoch, perm_cache)


@dataclass
class Pending:
    last_seq: int
    subjects_msgs: list[tuple[str, bytes]]
    futures: list[asyncio.Future] = field(default_factory=list)


class VersionGate:
    """Whether the controller acts on an announced weight version (a forged one moves nothing). With
    `controller.verify_weights` (the default) a version raises the admission bound only when the weight
    store holds it with the manifest the announcement names (weight_store.verify.StoreCheck, cached);
    a version below the last one accepted is refused, and a jump past last + 1 only when the store holds
    every version in between (or dropped them by retention: they are older than its oldest). A version
    the store no longer holds because retention retired it (older than its oldest held) is accepted
    unverified: announcements can queue behind a slow check while the trainer runs ahead. A refusal
    is logged and published as a "weights_refused" event of service "controller" naming the version; the
    bound stays where it was. A store that cannot be asked leaves the version undecided (retried on the
    next announcement or KV check), never accepted."""

    def __init__(self, ctl, run_id: str):
        self.ctl, self.run_id = ctl, run_id
        self.last = -1  # the newest version accepted by this process
        self._check = None
        self._refused: set[tuple[int, str]] = set()

    def _store(self):
        if self._check is None:
            from weight_store.client import WeightStoreClient

            self._check = WeightStoreClient(self.ctl.cfg.weights).store_check(self.run_id)
        return self._check

    async def admit(self, wv) -> bool:
        if not getattr(self.ctl.ccfg, "verify_weights", True):
            return True
        if wv.version <= self.last:
            if wv.version < self.last:
                await self._refuse(wv, f"version {wv.version} is below the last accepted version {self.last}")
            return False
        try:
            check = self._store()
            why = await check.refusal(wv)
            if why is not None and wv.run == self.run_id and await check.manifest(wv.version) is None:
                held = await check.source.versions(self.run_id)
                if held and wv.version < min(held):
                    # Retired by the store's retention before this check ran (a backlog of announcements):
                    # it cannot lift the bound past what the store holds, so it is recorded unverified.
                    log.info("run %s: version %d was already retired by the weight store (oldest held %d); "
                             "recorded without its manifest check", self.run_id, wv.version, min(held))
                    why = None
            if why is None and self.last >= 0 and wv.version > self.last + 1:
                held = await self._store().source.versions(self.run_id)
                missing = [k for k in range(max(self.last + 1, min(held, default=0)), wv.version) if k not in held]
                if missing:
                    why = (f"jump from version {self.last} to {wv.version}: the weight store does not hold "
                           f"{missing[:5]}")
        except Exception as exc:
            log.warning("run %s: cannot check version %d with the weight store (%s: %s); not acting on it yet",
                        self.run_id, wv.version, type(exc).__name__, exc)
            return False
        if why is not None:
            await self._refuse(wv, why)
            return False
        self.last = wv.version
        return True

    async def _refuse(self, wv, why: str) -> None:
        key = (wv.version, wv.sha256)
        if key in self._refused:  # the periodic KV check re-reads the same value: report it once
            return
        self._refused.add(key)
        log.error("run %s: refusing announced weight version %d: %s", self.run_id, wv.version, why)
        if self.ctl.js is not None:
            await bus.EventPublisher(self.ctl.js, self.ctl.nc, self.run_id, "controller").emit(
                "weights_refused", {"version": wv.version, "step": wv.step, "error": why, "service": "controller"})


class RunReleaser:
    """The release loop of one run. `ctl` gives Session, js, nc, controller config and dataset readers."""

    def __init__(self, ctl, run_id: str):
        self.ctl, self.run_id = ctl, run_id
        self.subject = subjects.prompts(run_id)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self.current_version = -1
        self.current_step = 0  # the trainer step of current_version (see ledger.admission_bound)
        self.outstanding = 0
        self.short = 0  # WeightVersion.short of current_version (see ledger.admission_bound)
        self._perm_cache: dict = {}
        self._cfg: JetrlConfig | None = None
        self._recount = False
        self._tokens = 0.0
        self._token_time = time.monotonic()
        self._order: LearnableFirst | None = None  # launch.sampling learnable-first (set by run())

    # --- signals ------------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def set_version(self, version: int, step: int, short: int = 0) -> None:
        if version > self.current_version:
            self.current_version, self.current_step, self.short = version, step, short
            self.wake()

    async def refresh(self) -> None:
        """The follower freed groups: the next step re-counts outstanding groups from the ledger. (Only
        the loop's own step touches the count, so a recount can never miss a batch being committed.)"""
        self._recount = True
        self.wake()

    async def _adopt_stored_version(self, version: int) -> None:
        """Start from the newest version the database has seen, unless the follower reports a newer one
        while its step is looked up: `set_version` keeps the newest pair. (Assigning the looked-up step
        after the await paired the follower's newer version with an older step: after a controller
        restart during a burst of trainer steps, the bound fell below the groups already out, nothing
        was released, the trainer starved and no newer version ever came to lift it.)"""
        if version > self.current_version:
            step, short = await asyncio.to_thread(self._announced, version)
            self.set_version(version, step, short)

    def _announced(self, version: int) -> tuple[int, int]:
        with self.ctl.Session() as s:
            return ledger.announced(s, self.run_id, version)

    def _count(self) -> int:
        with self.ctl.Session() as s:
            return ledger.outstanding(s, self.run_id)

    # --- the loop -----------------------------------------------------------------------------
    async def run(self) -> None:
        run, _ = await asyncio.to_thread(self._load)
        if run is None:
            return
        # a (re)started loop reads what each epoch released from the ledger again (sampling.py)
        self._order = LearnableFirst(self.ctl.Session, self.run_id) \
            if self._config(run).launch.sampling == "learnable-first" else None
        await self._adopt_stored_version(run.current_version)
        self.outstanding = await asyncio.to_thread(self._count)
        await self._republish_unconfirmed()
        acked_seq = await asyncio.to_thread(self._published_seq)
        pending: Pending | None = None
        while not self._stop.is_set():
            # load + plan + encode + ledger commit of batch k+1 run in a thread while batch k's acks arrive
            status, batch = await asyncio.to_thread(self._step, acked_seq)
            if status in (None, "stopped"):
                break
            if batch:
                rows, msgs = batch
            if pending is not None:
                await self._confirm(pending)
                acked_seq = pending.last_seq
                pending = None
            if batch:
                pending = await self._send(rows[-1]["seq"], msgs)
                continue
            await asyncio.to_thread(ledger.set_published, self.ctl.Session, self.run_id, acked_seq)
            await self._sleep()
        if pending is not None:
            with contextlib.suppress(Exception):
                await self._confirm(pending)
                await asyncio.to_thread(ledger.set_published, self.ctl.Session, self.run_id, pending.last_seq)

    def _step(self, acked_seq: int):
        """(run status, (ledger rows, messages) or None): the next batch, already committed to the ledger."""
        run, enqueues = self._load()
        if run is None or run.status != "running":
            return (run.status if run else None), None
        if self._recount:
            self._recount = False
            self.outstanding = self._count()
        planned = self._plan(run, enqueues)
        if planned is None:
            return run.status, None
        rows, cursors, msgs = planned
        ledger.reserve(self.ctl.Session, self.run_id, rows, cursors, acked_seq)
        if self._order is not None:
            self._order.commit(rows)
        self.outstanding += len(rows)
        return run.status, (rows, msgs)

    async def _sleep(self) -> None:
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self._delay())

    def _delay(self) -> float:
        rate = self.ctl.ccfg.release_rate
        if rate > 0 and self._tokens < 1:
            return min(self.ctl.ccfg.poll_interval_s, (1 - self._tokens) / rate)
        return self.ctl.ccfg.poll_interval_s

    def _load(self) -> tuple[Run | None, list[Enqueue]]:
        with self.ctl.Session() as s:
            run = s.get(Run, self.run_id)
            if run is None:
                return None, []
            enqs = list(s.scalars(select(Enqueue).where(Enqueue.run_id == self.run_id,
                                                        Enqueue.next_pos < Enqueue.total).order_by(Enqueue.id)))
            return run, enqs

    def _published_seq(self) -> int:
        with self.ctl.Session() as s:
            run = s.get(Run, self.run_id)
            return run.published_seq if run else 0

    def _config(self, run: Run) -> JetrlConfig:
        """The run's config, validated once (a run's config never changes after creation)."""
        if self._cfg is None:
            self._cfg = JetrlConfig.model_validate(run.config)
        return self._cfg

    def budget(self, cfg: JetrlConfig) -> int:
        sc = cfg.schedule
        bound = ledger.admission_bound(self.current_step, sc.max_staleness, sc.batch_size, sc.total_steps,
                                       cfg.trainer.publish_every, self.short)
        return bound - self.outstanding

    def _rate_allowance(self, want: int) -> int:
        rate = self.ctl.ccfg.release_rate
        if rate <= 0:
            return want
        t = time.monotonic()
        self._tokens = min(max(rate, 1.0), self._tokens + (t - self._token_time) * rate)
        self._token_time = t
        n = min(want, int(self._tokens))
        self._tokens -= n
        return n

    def _plan(self, run: Run, enqueues: list[Enqueue]):
        """The next batch: ledger rows, enqueue cursors and encoded messages (None when nothing may go)."""
        if not enqueues:
            return None
        cfg = self._config(run)
        n = min(self.budget(cfg), self.ctl.ccfg.release_batch)
        if n <= 0:
            return None
        n = self._rate_allowance(n)
        if n <= 0:
            return None
        version = max(self.current_version, 0)
        sampling = cfg.rollout.sampling.model_dump(exclude_none=True)
        rows, msgs, cursors = [], [], {}
        seq = run.release_seq
        t = now()
        for enq in enqueues:
            reader, content_hash, name = self.ctl.reader(enq.dataset_id)
            pos = enq.next_pos
            for epoch, idx in self._next_rows(enq, content_hash, n - len(rows)):
                pid = prompt_id_for(content_hash, idx)
                task = PromptTask(run=self.run_id, prompt_id=pid, epoch=epoch, payload=reader.payload(idx),
                                  dataset=name, workflow=cfg.rollout.workflow, group_size=cfg.rollout.group_size,
                                  sampling=sampling, released_at_version=version, released_at=t)
                gid = subjects.group_id(self.run_id, epoch, pid)
                seq += 1
                rows.append(dict(group_id=gid, run_id=self.run_id, enqueue_id=enq.id, epoch=epoch, prompt_id=pid,
                                 row_index=idx, seq=seq, state=RELEASED, released_at_version=version,
                                 released_at=t, updated_at=t))
                msgs.append((gid, bus.encode_checked(self.ctl.nc, task, self.subject)))
                pos += 1
            cursors[enq.id] = pos
            if len(rows) >= n:
                break
        return (rows, cursors, msgs) if rows else None

    def _next_rows(self, enq: Enqueue, content_hash: str, want: int) -> list[tuple[int, int]]:
        """(epoch, row index) of the enqueue's next `want` releases, in launch.sampling's order."""
        if self._order is None:
            return [position(enq, pos, self._perm_cache) for pos in range(enq.next_pos, min(enq.total, enq.next_pos + want))]
        return self._order.next_rows(enq, content_hash, want,
                                     lambda e, local_epoch: epoch_order(e, local_epoch, self._perm_cache))

    # --- publishing ---------------------------------------------------------------------------
    async def _send(self, last_seq: int, msgs: list[tuple[str, bytes]]) -> Pending:
        p = Pending(last_seq=last_seq, subjects_msgs=msgs)
        try:
            for gid, data in msgs:
                p.futures.append(await self.ctl.js.publish_async(
                    self.subject, data, headers={subjects.MSG_ID_HEADER: gid}))
        except Exception as exc:  # confirm() retries the whole batch under the same ids
            log.warning("run %s: publishing a batch failed (%s); will retry", self.run_id, exc)
        return p

    async def _confirm(self, p: Pending) -> None:
        """Wait until JetStream acked every message of the batch, republishing it (same ids) on failure."""
        delay = 0.2
        while True:
            ok = len(p.futures) == len(p.subjects_msgs)
            if ok:
                try:
                    await asyncio.wait_for(asyncio.gather(*p.futures), self.ctl.ccfg.publish_timeout_s)
                    return
                except Exception as exc:
                    log.warning("run %s: JetStream did not ack %d prompts (%s: %s); republishing in %.1fs",
                                self.run_id, len(p.futures), type(exc).__name__, exc, delay)
            for f in p.futures:
                if not f.done():
                    f.cancel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            retry = await self._send(p.last_seq, p.subjects_msgs)
            p.futures = retry.futures

    async def _republish_unconfirmed(self) -> None:
        rows: list[Ledger] = await asyncio.to_thread(ledger.unpublished, self.ctl.Session, self.run_id)
        if not rows:
            return
        log.info("run %s: republishing %d prompts written before a restart (duplicates are dropped by "
                 "Nats-Msg-Id)", self.run_id, len(rows))
        msgs = await asyncio.to_thread(self._rebuild, rows)
        for i in range(0, len(msgs), 1000):
            chunk = msgs[i : i + 1000]
            p = await self._send(rows[min(i + 1000, len(rows)) - 1].seq, chunk)
            await self._confirm(p)
        await asyncio.to_thread(ledger.set_published, self.ctl.Session, self.run_id, rows[-1].seq)

    def _rebuild(self, rows: list[Ledger]) -> list[tuple[str, bytes]]:
        with self.ctl.Session() as s:
            run = s.get(Run, self.run_id)
            cfg = JetrlConfig.model_validate(run.config)
            enqs = {e.id: e for e in s.scalars(select(Enqueue).where(Enqueue.run_id == self.run_id))}
        sampling = cfg.rollout.sampling.model_dump(exclude_none=True)
        out = []
        for r in rows:
            reader, _, name = self.ctl.reader(enqs[r.enqueue_id].dataset_id)
            task = PromptTask(run=self.run_id, prompt_id=r.prompt_id, epoch=r.epoch, payload=reader.payload(r.row_index),
                              dataset=name, workflow=cfg.rollout.workflow, group_size=cfg.rollout.group_size,
                              sampling=sampling, released_at_version=r.released_at_version, released_at=r.released_at)
            out.append((r.group_id, bus.encode_checked(self.ctl.nc, task, self.subject)))
        return out
