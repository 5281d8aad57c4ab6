"""The bus follower of one run: weight announcements, trainer/rollout events and dead letters -> SQL.

- KV `jetrl_weights` key `<run>`: every WeightVersion is recorded and raises the admission bound.
- `jetrl.<run>.events.>` (durable consumer `controller-events-<run>`): events are stored (health ones
  only update the health table); trainer "step" and rollout "metrics" numbers become metric series;
  trainer "groups" and rollout "published" move ledger rows forward (a filtered group keeps the trainer's
  reason); a "published" event's `prompts` go into the prompt memory (memory.py); a trainer "no_signal"
  event sets the run's signal state (no_signal.py); a trainer "guard_tripped" event with action "pause" pauses
  the run (the collapse guard, trainer.guard).
- `jetrl.<run>.dlq.>` (durable `controller-dlq-<run>`): the original message is decoded as a
  PromptTask or TrajectoryGroup to find its group, which becomes dead_lettered.
A redelivered event (stream sequence already stored) changes nothing. Events arriving together are
stored in one transaction (batch_writer.py), each acked after its commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging

import nats
from nats.aio.msg import Msg
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError

from controller import ledger, memory, no_signal
from controller.batch_writer import BatchWriter
from controller.db import (
    DEAD_LETTERED,
    DROPPED_STALE,
    FILTERED,
    RECEIVED,
    TRAINED,
    EventRow,
    Health,
    Metric,
    Run,
    WeightVersionRow,
    now,
)
from controller.release import VersionGate
from shared.contract import codec, subjects
from shared.contract.consumer import ConsumerLoop
from shared.contract.messages import DeadLetter, Event, PromptTask, TrajectoryGroup, WeightVersion

log = logging.getLogger("jetrl.controller.follower")

KV_CHECK_S = 10.0  # a watcher that saw nothing this long is cross-checked with kv.get (heals a stalled watch)


def clean_json(v, depth: int = 0):
    """Event data as JSON both databases accept: no NaN/inf, no bytes, string keys, bounded depth."""
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, (str, bool)) or v is None:
        return v
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else str(v)
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    if depth > 20:
        return "<too deep>"
    if isinstance(v, dict):
        return {str(k): clean_json(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean_json(x, depth + 1) for x in v]
    return str(v)


def _int32(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31 else None


def _numbers(data: dict) -> dict[str, float]:
    return {str(k): float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300}


def _ids(v) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list) else []


def _health_row(run_id: str, ev: Event) -> dict:
    instance = str(ev.instance or ev.data.get("instance") or "")
    return dict(run_id=run_id, service=ev.service[:64], instance=instance[:200],
                status=str(ev.data.get("status", "ok"))[:32], last_seen=ev.time, data=ev.data)


def _event_row(run_id: str, ev: Event, stream: str, seq: int | None) -> dict:
    return dict(run_id=run_id, service=ev.service[:64], kind=ev.kind[:64], instance=ev.instance[:200],
                time=ev.time, data=ev.data, stream=stream, stream_seq=seq or None)


def _metric_rows(run_id: str, ev: Event) -> list[dict]:
    """A trainer "step" or rollout "metrics" event's numbers as metric series points."""
    if ev.kind not in ("step", "metrics"):
        return []
    x = ev.data.get("version", ev.data.get("step")) if ev.kind == "step" else ev.time
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        x = ev.time
    return [dict(run_id=run_id, service=ev.service[:64], name=k[:128], x=float(x), value=v, time=ev.time)
            for k, v in _numbers(ev.data).items()]


def _store_in(s, run_id: str, ev: Event, stream: str, seq: int | None) -> int:
    """One (non-health) event's row, metric series and ledger moves, in the caller's transaction; an
    IntegrityError at the flush means it is stored already (a redelivery). Returns the rows moved."""
    s.add(EventRow(**_event_row(run_id, ev, stream, seq)))
    s.flush()
    s.add_all([Metric(**m) for m in _metric_rows(run_id, ev)])
    return _move_groups(s, run_id, ev)


def _upsert_health(s, rows: list[dict]) -> None:
    """Insert-or-update health rows in one statement (SQLite and PostgreSQL), else one merge each."""
    dialect = s.get_bind().dialect.name
    if dialect not in ("sqlite", "postgresql"):
        for row in rows:
            s.merge(Health(**row))
        return
    stmt = importlib.import_module(f"sqlalchemy.dialects.{dialect}").insert(Health)
    stmt = stmt.on_conflict_do_update(index_elements=["run_id", "service", "instance"],
                                      set_={c: stmt.excluded[c] for c in ("status", "last_seen", "data")})
    s.execute(stmt, rows)


def store_event(Session_, run_id: str, ev: Event, stream: str, seq: int | None) -> bool:
    """Persist one event; returns True when ledger rows moved (admission may have room now)."""
    ev.data = clean_json(ev.data) if isinstance(ev.data, dict) else {}
    if ev.kind == "health":
        for _ in range(3):
            try:
                with Session_.begin() as s:
                    s.merge(Health(**_health_row(run_id, ev)))
                break
            except IntegrityError:  # a concurrent first insert of the same key: merge again
                continue
        return False
    # The event row and the ledger moves it causes commit together: a controller killed in between
    # leaves neither, so the redelivered event does both (a stored row alone would make the redelivery
    # look like a duplicate, and its groups would never move).
    try:
        with Session_.begin() as s:
            moved = _store_in(s, run_id, ev, stream, seq)
    except IntegrityError:
        return False  # already stored: a redelivery
    return moved > 0


def store_events(Session_, run_id: str, batch: list[tuple[Event, str, int | None]]) -> list[bool]:
    """Several events in one transaction (BatchWriter's write_many): their rows and metric points inserted
    in bulk, then their ledger moves in order; the newest health event of each instance is kept. Raises
    (nothing stored) when any of them is stored already: the caller then writes them one by one with
    store_event. Returns, per event, whether ledger rows moved."""
    health, rows, points, stored = {}, [], [], []
    for ev, stream, seq in batch:
        ev.data = clean_json(ev.data) if isinstance(ev.data, dict) else {}
        if ev.kind == "health":
            row = _health_row(run_id, ev)
            health[(row["service"], row["instance"])] = row
        else:
            rows.append(_event_row(run_id, ev, stream, seq))
            points += _metric_rows(run_id, ev)
            stored.append(ev)
    moved = {}
    with Session_.begin() as s:
        if rows:
            s.execute(insert(EventRow), rows)  # a redelivered event's stream sequence raises IntegrityError
        if points:
            s.execute(insert(Metric), points)
        for ev in stored:
            moved[id(ev)] = _move_groups(s, run_id, ev) > 0
        if health:
            _upsert_health(s, list(health.values()))
    return [moved.get(id(ev), False) for ev, _, _ in batch]


def _move_groups(s, run_id: str, ev: Event) -> int:
    """Ledger moves of a trainer "groups" or rollout "published" event, in the caller's transaction."""
    moved = 0
    if ev.kind == "groups":
        version = _int32(ev.data.get("version"))
        moved += ledger.mark_in(s, run_id, _ids(ev.data.get("trained")), TRAINED, trained_version=version)
        moved += ledger.mark_in(s, run_id, _ids(ev.data.get("dropped_stale")), DROPPED_STALE)
        moved += _mark_filtered(s, run_id, _ids(ev.data.get("filtered")), ev.data.get("filtered_reasons"))
    elif ev.kind == "published":
        moved += ledger.mark_in(s, run_id, _ids(ev.data.get("group_ids")), RECEIVED)
        # the same transaction: a redelivery (its event row already stored) records nothing twice
        memory.record(s, run_id, ev.data.get("prompts"), ev.time)
    elif ev.kind == "no_signal" and ev.service == "trainer":
        no_signal.record(s, run_id, ev.data)
    elif ev.kind == "guard_tripped" and ev.service == "trainer" and ev.data.get("action") == "pause":
        # the collapse guard asks to stop releasing (trainer.guard.action pause): resume with POST .../resume
        s.execute(update(Run).where(Run.id == run_id, Run.status == "running").values(status="paused", updated_at=now()))
    return moved


def _mark_filtered(s, run_id: str, group_ids: list[str], reasons) -> int:
    """Filtered groups, each with its reason from `filtered_reasons` ({group id: reason}) when given."""
    by_reason: dict[str | None, list[str]] = {}
    reasons = reasons if isinstance(reasons, dict) else {}
    for g in group_ids:
        r = reasons.get(g)
        by_reason.setdefault(r if isinstance(r, str) and r else None, []).append(g)
    return sum(ledger.mark_in(s, run_id, ids, FILTERED, reason=r) for r, ids in by_reason.items())


def store_dead_letter(Session_, run_id: str, dl: DeadLetter, seq: int | None) -> bool:
    group_id = None
    try:
        orig = codec.decode(dl.original, expect=(PromptTask, TrajectoryGroup))
        group_id = orig.group_id
    except codec.DecodeError:
        # no payload (it would not fit in the letter) or a broken one: prompts and groups are published
        # with their group id as Nats-Msg-Id
        mid = (dl.headers or {}).get(subjects.MSG_ID_HEADER)
        if isinstance(mid, str) and mid.startswith(f"{run_id}:") and len(mid) <= 200:
            group_id = mid
    data = {"source": dl.source, "subject": dl.subject, "reason": dl.reason, "group_id": group_id,
            "delivery_count": dl.delivery_count, "stream": dl.stream, "stream_seq": dl.stream_seq}
    try:
        with Session_.begin() as s:  # the letter's row and its ledger move commit together (see store_event)
            s.add(EventRow(run_id=run_id, service=dl.source[:64], kind="dead_letter", instance="", time=dl.time,
                           data=data, stream=subjects.DLQ_STREAM, stream_seq=seq or None))
            s.flush()
            if group_id is None:
                return False
            return ledger.mark_in(s, run_id, [group_id], DEAD_LETTERED, reason=f"{dl.source}: {dl.reason}") > 0
    except IntegrityError:
        return False


def _short(wv: WeightVersion) -> int:
    """WeightVersion.short as the admission bound reads it: an int32, never below 0."""
    return max(_int32(wv.short) or 0, 0)


def record_version(Session_, run_id: str, wv: WeightVersion) -> None:
    if _int32(wv.version) is None or wv.version < 0:
        log.warning("run %s: weight version %r is out of range; ignored", run_id, wv.version)
        return
    with Session_.begin() as s:
        if s.get(WeightVersionRow, (run_id, wv.version)) is None:
            s.add(WeightVersionRow(run_id=run_id, version=wv.version, step=_int32(wv.step) or 0,
                                   short=_short(wv), manifest_url=wv.manifest_url,
                                   sha256=wv.sha256, created_at=wv.created_at, seen_at=now()))
        s.execute(update(Run).where(Run.id == run_id, Run.current_version < wv.version)
                  .values(current_version=wv.version, updated_at=now()))


class RunFollower:
    def __init__(self, ctl, run_id: str, releaser=None):
        self.ctl, self.run_id, self.releaser = ctl, run_id, releaser
        self.gate = VersionGate(ctl, run_id)
        self.writer = BatchWriter(lambda batch: store_events(ctl.Session, run_id, batch),
                                  lambda item: store_event(ctl.Session, run_id, *item))
        self.loops: list[ConsumerLoop] = []
        self._tasks: list[asyncio.Task] = []
        self._stop = asyncio.Event()

    def start(self) -> None:
        js, nc = self.ctl.js, self.ctl.nc
        ev = ConsumerLoop(js, nc, run=self.run_id, stream=subjects.EVENTS_STREAM, subject=subjects.events_all(self.run_id),
                          durable=subjects.controller_events_consumer(self.run_id), handler=self._on_event,
                          expect=Event, batch=256, max_in_flight=512, source="controller-events")
        dlq = ConsumerLoop(js, nc, run=self.run_id, stream=subjects.DLQ_STREAM, subject=subjects.dlq_all(self.run_id),
                           durable=subjects.controller_dlq_consumer(self.run_id), handler=self._on_dead_letter,
                           expect=DeadLetter, batch=64, max_in_flight=4, source="controller-dlq")
        self.loops = [ev, dlq]
        self._tasks = [asyncio.create_task(lp.run()) for lp in self.loops]
        self._tasks.append(asyncio.create_task(self._watch_weights()))

    async def stop(self) -> None:
        self._stop.set()
        for lp in self.loops:
            lp.stop()
        for t in self._tasks[2:]:
            t.cancel()
        # Bounded (see rollout_service/service.py close): a swallowed cancel must not hang shutdown.
        if not self._tasks:
            return
        done, pending = await asyncio.wait(self._tasks, timeout=15.0)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                log.warning("follower task ended with %r", t.exception())
        for t in pending:
            log.warning("follower task %s did not stop in 15 s", t.get_name())

    async def _freed(self) -> None:
        if self.releaser is not None:
            await self.releaser.refresh()

    @staticmethod
    def _seq(m: Msg) -> int | None:
        return m.metadata.sequence.stream if m.metadata else None

    async def _on_event(self, ev: Event, m: Msg) -> None:
        if await self.writer.submit((ev, subjects.EVENTS_STREAM, self._seq(m))):
            await self._freed()

    async def _on_dead_letter(self, dl: DeadLetter, m: Msg) -> None:
        if await asyncio.to_thread(store_dead_letter, self.ctl.Session, self.run_id, dl, self._seq(m)):
            await self._freed()

    async def _version_seen(self, raw: bytes) -> None:
        try:
            wv = codec.decode(raw, expect=WeightVersion)
        except codec.DecodeError as exc:
            log.warning("run %s: undecodable weight announcement ignored: %s", self.run_id, exc)
            return
        if not await self.gate.admit(wv):  # only versions the weight store holds (release.py, VersionGate)
            return
        await asyncio.to_thread(record_version, self.ctl.Session, self.run_id, wv)
        if self.releaser is not None:
            self.releaser.set_version(wv.version, _int32(wv.step) or 0, _short(wv))

    async def _watch_weights(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            watcher = None
            try:
                kv = await self.ctl.js.key_value(subjects.WEIGHTS_KV_BUCKET)
                watcher = await kv.watch(self.run_id)
                backoff = 0.2
                while not self._stop.is_set():
                    try:
                        entry = await watcher.updates(timeout=KV_CHECK_S)
                    except nats.errors.TimeoutError:
                        with contextlib.suppress(Exception):
                            latest = await kv.get(self.run_id)
                            if latest and latest.value:
                                await self._version_seen(latest.value)
                        continue
                    if entry is None or not getattr(entry, "value", None):
                        continue
                    await self._version_seen(entry.value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("run %s: weights watch failed (%s: %s); retrying in %.1fs", self.run_id,
                            type(exc).__name__, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
