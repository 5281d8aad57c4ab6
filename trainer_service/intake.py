"""Intake: trajectory groups from JetStream into a buffer, and optimizer batches out of it.

Exactly-once across crashes (docs/trainer.md): the TRAJECTORIES stream has limits retention, so acks
do not delete anything and the consumer's own position is not trusted after a crash. Instead every
checkpoint records `position()`: the stream sequence below which every group of this run is finished
(trained, dropped as stale, filtered or a duplicate), plus the ids of recently finished groups. On
resume the durable consumer is re-created to start at position + 1 and finished ids are skipped; the
groups that were buffered but not trained at checkpoint time are read again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from nats.js import api

from shared.config import JetrlConfig
from shared.contract import subjects
from shared.contract.consumer import ConsumerLoop
from shared.contract.messages import Sample, TrajectoryGroup
from trainer_service.algorithms.staleness import is_fresh, rewards_all_equal, staleness, urgency_order

log = logging.getLogger("jetrl.trainer.intake")


@dataclass
class Batch:
    """Groups of one optimizer step, with their fresh samples, and what was dropped on the way."""

    groups: list[TrajectoryGroup] = field(default_factory=list)
    fresh: list[list[Sample]] = field(default_factory=list)  # per group: the samples to train
    dropped_stale: list[str] = field(default_factory=list)  # group ids with no fresh sample
    dropped_stale_samples: int = 0
    filtered: list[str] = field(default_factory=list)  # group ids without a reward spread, not trained
    filtered_reasons: dict[str, str] = field(default_factory=dict)  # group id -> why (the ledger keeps it)
    staleness_hist: Counter = field(default_factory=Counter)  # staleness of trained samples
    partial: bool = False  # smaller than batch_size: the run's last batch, or schedule.batch_wait_s (Intake.take_partial)
    version: int = -1  # the trainer version it was formed at (staleness is counted from it)


@dataclass
class IntakeState:
    position: int = 0
    finished: list[str] = field(default_factory=list)


def filter_reason(group: TrajectoryGroup, cfg: JetrlConfig) -> str | None:
    """Why a group is not trained at all (None: it goes to the buffer): no samples; adaptive sampling
    found no reward spread within its budget; all rewards equal under trainer.algorithm.dynamic_filter."""
    if not group.samples:
        return "no samples"
    if group.adaptive and not group.adaptive.get("signal", True):
        return f"no signal after {group.adaptive['drawn']} samples"
    a = cfg.trainer.algorithm
    # a group with draw statistics (adaptive sampling, an online session's moving baseline) has its spread
    # judged on them above, not on its own samples (one online session is a group of one)
    if a.dynamic_filter and not group.adaptive and rewards_all_equal([s.reward for s in group.samples],
                                                                      a.dynamic_filter_eps):
        return "no reward spread (trainer.algorithm.dynamic_filter)"
    return None


class Intake:
    def __init__(self, cfg: JetrlConfig, js, nc, state: IntakeState | None = None):
        self.cfg, self.js, self.nc = cfg, js, nc
        t, s = cfg.trainer, cfg.schedule
        self.max_buffered = t.max_buffered_groups or 4 * s.batch_size
        self.buffer: list[tuple[int, TrajectoryGroup]] = []  # (stream seq, group), in arrival order
        self.arrived_at: dict[str, float] = {}  # group id -> when it entered the buffer (schedule.batch_wait_s)
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.last_seq = 0
        # Outcomes since the last batch (reported with it).
        self.filtered: list[str] = []
        self.filtered_reasons: dict[str, str] = {}
        self.dropped_stale: list[str] = []
        self.dropped_stale_samples = 0
        self.duplicates = 0
        self.discarded: list[tuple[int, int]] = []  # version ranges (lo, hi] a rollback threw away (guard.py)
        self._arrived = asyncio.Event()
        if state is not None:
            self.last_seq = state.position
            for gid in state.finished:
                self.finished[gid] = None
        self.loop = ConsumerLoop(
            js, nc, run=cfg.run, stream=subjects.TRAJECTORIES_STREAM, subject=subjects.trajectories(cfg.run),
            durable=subjects.trainer_consumer(cfg.run), handler=self._handle, expect=TrajectoryGroup,
            source="trainer", batch=1, max_in_flight=1, ack_wait_s=t.ack_wait_s,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.last_seq + 1,
            can_fetch=lambda: len(self.buffer) < self.max_buffered,
        )
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """(Re)create the durable consumer at the recorded position and start consuming."""
        try:
            await self.js.delete_consumer(subjects.TRAJECTORIES_STREAM, subjects.trainer_consumer(self.cfg.run))
        except Exception:  # not there yet
            pass
        self._task = asyncio.create_task(self.loop.run())

    async def stop(self) -> None:
        self.loop.stop()
        if self._task is not None:
            await asyncio.wait_for(self._task, timeout=10)

    # --- consuming ------------------------------------------------------------------------------

    def _finish(self, gid: str) -> None:
        self.arrived_at.pop(gid, None)
        self.finished[gid] = None
        self.finished.move_to_end(gid)
        while len(self.finished) > self.cfg.trainer.dedup_window:
            self.finished.popitem(last=False)

    async def _handle(self, group: TrajectoryGroup, msg) -> None:
        seq = msg.metadata.sequence.stream if msg.metadata else self.last_seq + 1
        self.last_seq = max(self.last_seq, seq)
        gid = group.group_id
        if gid in self.finished or any(g.group_id == gid for _, g in self.buffer):
            self.duplicates += 1
            log.info("duplicate group %s (seq %d) skipped", gid, seq)
            return
        why = filter_reason(group, self.cfg) or self._discarded_reason(group)
        if why is not None:
            self.filtered.append(gid)
            self.filtered_reasons[gid] = why
            self._finish(gid)
            return
        self.buffer.append((seq, group))
        self.arrived_at[gid] = time.monotonic()
        self._arrived.set()

    def _discarded_reason(self, group: TrajectoryGroup) -> str | None:
        """Why a group is discarded: a token of it came from a version a rollback threw away."""
        if not self.discarded:
            return None
        for s in group.samples:
            used = s.versions[s.loss_mask.astype(bool)]
            for lo, hi in self.discarded:
                if ((used > lo) & (used <= hi)).any():
                    return f"generated by version(s) {lo + 1}..{hi}, discarded by a rollback"
        return None

    def discard_versions(self, lo: int, hi: int) -> None:
        """Versions lo+1..hi were rolled back: their groups, buffered or still to come, are filtered."""
        self.discarded.append((lo, hi))
        keep = []
        for seq, g in self.buffer:
            why = self._discarded_reason(g)
            if why is None:
                keep.append((seq, g))
            else:
                self.filtered.append(g.group_id)
                self.filtered_reasons[g.group_id] = why
                self._finish(g.group_id)
        self.buffer = keep

    def position(self) -> IntakeState:
        """Where a resumed trainer must start: below `position` everything is finished; `finished`
        holds the ids to skip above it (and the dedup window)."""
        pos = (min(seq for seq, _ in self.buffer) - 1) if self.buffer else self.last_seq
        return IntakeState(position=pos, finished=list(self.finished))

    # --- batching -------------------------------------------------------------------------------

    def _drop_stale(self, version: int) -> None:
        """Drop the buffered groups that can never become fresh again (reported with the next batch)."""
        s = self.cfg.schedule
        still: list[tuple[int, TrajectoryGroup]] = []
        for seq, g in self.buffer:
            if any(is_fresh(version, x, s.max_staleness) for x in g.samples):
                still.append((seq, g))
            else:
                self.dropped_stale.append(g.group_id)
                self.dropped_stale_samples += len(g.samples)
                self._finish(g.group_id)
        self.buffer = still

    def _try_batch(self, version: int) -> Batch | None:
        s = self.cfg.schedule
        self._drop_stale(version)
        if len(self.buffer) < s.batch_size:
            return None
        picked = set(urgency_order([g.samples for _, g in self.buffer])[: s.batch_size])
        take = [x for i, x in enumerate(self.buffer) if i in picked]
        self.buffer = [x for i, x in enumerate(self.buffer) if i not in picked]
        return self._batch_of(take, version)

    def _batch_of(self, take: list[tuple[int, TrajectoryGroup]], version: int) -> Batch:
        s = self.cfg.schedule
        batch = self._outcomes()
        batch.version = version
        for _, g in take:
            fresh = [x for x in g.samples if is_fresh(version, x, s.max_staleness)]
            batch.groups.append(g)
            batch.fresh.append(fresh)
            batch.dropped_stale_samples += len(g.samples) - len(fresh)
            for x in fresh:
                batch.staleness_hist[staleness(version, x)] += 1
            self._finish(g.group_id)
        return batch

    def held(self) -> set[str]:
        """The ids of the groups in the buffer."""
        return {g.group_id for _, g in self.buffer}

    def decided(self, group_id: str) -> bool:
        """Whether the group was trained, dropped, filtered or skipped here (within the dedup window)."""
        return group_id in self.finished

    def wait_left(self) -> float:
        """Seconds until the oldest held group has waited schedule.batch_wait_s (inf: off, or none held)."""
        limit = self.cfg.schedule.batch_wait_s
        if not limit or not self.arrived_at:  # arrived_at holds exactly the buffered groups (_finish pops)
            return math.inf
        return min(self.arrived_at.values()) + limit - time.monotonic()

    def waited_out(self) -> bool:
        """Whether a group has waited schedule.batch_wait_s for its batch: train what is held."""
        return self.wait_left() <= 0

    def take_partial(self, version: int) -> Batch | None:
        """Everything buffered as one batch, smaller than `batch_size` (the run's data ended: drain.py; or
        a group waited schedule.batch_wait_s), or None when nothing fresh is left."""
        self._drop_stale(version)
        if not self.buffer:
            return None
        take, self.buffer = self.buffer, []
        batch = self._batch_of(take, version)
        batch.partial = True
        return batch

    def take_outcomes(self) -> Batch | None:
        """Drops and filter outcomes recorded since the last batch (to report them without a batch)."""
        if not (self.dropped_stale or self.filtered):
            return None
        return self._outcomes()

    def _outcomes(self) -> Batch:
        """A batch holding the drops and filter outcomes recorded so far, which are cleared."""
        out = Batch(dropped_stale=self.dropped_stale, dropped_stale_samples=self.dropped_stale_samples,
                    filtered=self.filtered, filtered_reasons=self.filtered_reasons)
        self.dropped_stale, self.dropped_stale_samples, self.filtered, self.filtered_reasons = [], 0, [], {}
        return out

    async def next_batch(self, version: int, timeout_s: float | None = None, cut_short: bool = True) -> Batch | None:
        """The next batch of `batch_size` groups with at least one fresh sample each (the oldest
        generations first, see staleness.urgency_order), or None after `timeout_s` without one. Stale
        samples are removed; all-stale groups are dropped. With schedule.batch_wait_s and `cut_short`, what
        is held once the oldest held group has waited that long (a partial batch)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if self._task is not None and self._task.done():
                exc = None if self._task.cancelled() else self._task.exception()
                raise RuntimeError(f"trajectory consumer stopped unexpectedly: {exc!r}")
            self._arrived.clear()
            b = self._try_batch(version)
            if b is None and cut_short and self.waited_out():
                b = self.take_partial(version)
            if b is not None:
                return b
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            wait = min(remaining or 5.0, 5.0, self.wait_left() if cut_short else 5.0)
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=max(wait, 0.01))
            except asyncio.TimeoutError:
                pass
