"""When a run's work ends: the dataset is released, its last partial batch is trained, the run is complete.

A run's data is what its enqueues hold. Once every enqueue is fully released, the trainer may be left
holding fewer than `batch_size` groups with nothing else coming: it would wait for ever (issue 34: the sort
demo's 10,000 prompts left 16 groups behind the 128-group batch and sat still for 13 minutes). The
controller sees it in the ledger and says so on the bus:

- **drain** (`jetrl.<run>.events.controller`, kind "drain"): every enqueue is fully released, no group is
  still waiting for its trajectory, and some groups were received but not yet decided by the trainer.
  The event carries their ids (`group_ids`, at most DRAIN_IDS). The trainer (trainer_service/drain.py)
  trains what it holds as one smaller last batch once it holds all of them. The event is repeated every
  DRAIN_REPEAT_S while the state lasts, so a trainer started or restarted later still hears it.
- **run_complete** (kind "run_complete"): every enqueue is fully released and nothing is in flight: every
  group is trained, dropped as stale, filtered or dead-lettered. Sent once per completion (a new enqueue
  reopens the run; it completes again when that is done). `GET /v1/runs/{run}` shows `progress.state`;
  `jetrl up` and `jetrl demo` stop with their summary when it says complete.

A run whose trainer stops at `schedule.total_steps` first ends that way, as before; its admission bound
never released more than total_steps x batch_size groups.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller import ledger
from controller.db import RECEIVED, Enqueue, EventRow, Ledger
from shared.contract import bus

log = logging.getLogger("jetrl.controller.completion")

DRAIN_REPEAT_S = 5.0  # a drain event is repeated this often while the trainer still holds groups
DRAIN_IDS = 4096  # at most this many group ids in one drain event (the admission window is smaller in practice)
CHECK_S = 1.0  # how often the watch looks at the ledger


def released(s: Session, run_id: str) -> tuple[int, int]:
    """(prompts enqueued, prompts released) over the run's enqueues."""
    enqueued, pos = s.execute(
        select(func.coalesce(func.sum(Enqueue.total), 0), func.coalesce(func.sum(Enqueue.next_pos), 0))
        .where(Enqueue.run_id == run_id)).one()
    return int(enqueued), int(pos)


def progress(s: Session, run_id: str) -> dict:
    """{"state", "enqueued", "ledger": ledger.summary}: state is "no data" (nothing enqueued), "releasing"
    (an enqueue has rows left), "draining" (all released, groups still in flight) or "complete"."""
    enqueued, released_pos = released(s, run_id)
    summ = ledger.summary(s, run_id)
    if not enqueued:
        state = "no data"
    elif released_pos < enqueued:
        state = "releasing"
    elif summ["in_flight"]:
        state = "draining"
    else:
        state = "complete"
    return {"state": state, "enqueued": enqueued, "ledger": summ}


def drain_ids(s: Session, run_id: str, limit: int = DRAIN_IDS) -> list[str]:
    """The groups whose trajectories arrived and which the trainer has not decided yet."""
    return list(s.scalars(select(Ledger.group_id).where(Ledger.run_id == run_id, Ledger.state == RECEIVED)
                          .order_by(Ledger.seq).limit(limit)))


def completed_since(s: Session, run_id: str) -> float | None:
    """When the run's last run_complete event was sent, if after its newest enqueue (else None)."""
    last_enqueue = s.scalar(select(func.max(Enqueue.created_at)).where(Enqueue.run_id == run_id)) or 0.0
    t = s.scalar(select(func.max(EventRow.time)).where(EventRow.run_id == run_id, EventRow.kind == "run_complete",
                                                       EventRow.service == "controller"))
    return t if t is not None and t >= last_enqueue else None


class CompletionWatch:
    """One run's drain and run_complete events (see the module docstring)."""

    def __init__(self, ctl, run_id: str):
        self.ctl, self.run_id = ctl, run_id
        self._stop = asyncio.Event()
        self._last_drain = 0.0
        self._announced = False  # a run_complete sent by this process for the current data

    def stop(self) -> None:
        self._stop.set()

    def _look(self) -> tuple[dict | None, list[str], bool]:
        with self.ctl.Session() as s:
            enqueued, pos = released(s, self.run_id)
            if not enqueued or pos < enqueued:  # still releasing (or nothing to): no ledger count needed
                return None, [], False
            p = progress(s, self.run_id)
            ids = drain_ids(s, self.run_id) if p["state"] == "draining" and not p["ledger"]["awaiting_trajectory"] else []
            done_before = completed_since(s, self.run_id) is not None if p["state"] == "complete" else False
        return p, ids, done_before

    async def run(self) -> None:
        events = bus.EventPublisher(self.ctl.js, self.ctl.nc, self.run_id, "controller")
        while not self._stop.is_set():
            try:
                await self.check(events)
            except Exception as exc:  # the database or NATS is away for a moment: look again
                log.warning("run %s: completion check failed (%s: %s)", self.run_id, type(exc).__name__, exc)
            try:
                await asyncio.wait_for(self._stop.wait(), CHECK_S)
            except asyncio.TimeoutError:
                pass

    async def check(self, events) -> None:
        p, ids, done_before = await asyncio.to_thread(self._look)
        if p is None or p["state"] != "complete":
            self._announced = False
        if p is None:
            return
        if ids and time.monotonic() - self._last_drain >= DRAIN_REPEAT_S:
            self._last_drain = time.monotonic()
            log.info("run %s: every prompt is released; the trainer holds the last %d group(s): drain",
                     self.run_id, len(ids))
            await events.emit("drain", {"group_ids": ids, "received": p["ledger"]["trajectory_received"],
                                        "released": p["ledger"]["released"]})
        if p["state"] == "complete" and not self._announced and not done_before:
            self._announced = True
            led = p["ledger"]
            log.info("run %s complete: %d released, %d trained, %d dropped as stale, %d filtered, %d dead-lettered",
                     self.run_id, led["released"], led["trained"], led["dropped_stale"], led["filtered"],
                     led["dead_lettered"])
            await events.emit("run_complete", {"enqueued": p["enqueued"], **{
                k: led[k] for k in ("released", "trained", "dropped_stale", "filtered", "dead_lettered")}})
