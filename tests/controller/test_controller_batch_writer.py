"""Group commit of the controller's event intake (controller/batch_writer.py, follower.store_events):
events submitted together are written in one transaction, each handler gets its own result after the
commit, a batch holding a redelivered event is written again one by one (nothing lost, nothing twice),
and health events become one row per instance, the newest."""

from __future__ import annotations

import asyncio

import pytest
from controller_helpers import released_ledger
from sqlalchemy import event, func, select

from controller import follower
from controller.batch_writer import BatchWriter
from controller.db import EventRow, Health, Ledger, Metric
from shared.contract import subjects
from shared.contract.messages import Event

RUN = "b1"


async def test_items_submitted_together_are_written_in_one_batch_each_with_its_result():
    calls = []

    def many(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    w = BatchWriter(many, lambda x: pytest.fail("no fallback expected"))
    results = await asyncio.gather(*(w.submit(i) for i in range(50)))
    assert results == [i * 10 for i in range(50)]
    assert sum(len(c) for c in calls) == 50 and len(calls) <= 2  # the first alone, or all in one
    assert w.items == 50


async def test_a_failing_batch_is_written_one_by_one_and_a_failing_item_fails_only_its_own_handler():
    def many(items):
        raise ValueError("duplicate in batch")

    def one(x):
        if x == 3:
            raise KeyError("stored already")
        return x

    w = BatchWriter(many, one, max_batch=4)
    results = await asyncio.gather(*(w.submit(i) for i in range(8)), return_exceptions=True)
    assert [r for i, r in enumerate(results) if i != 3] == [0, 1, 2, 4, 5, 6, 7]
    assert isinstance(results[3], KeyError)
    assert w.fallbacks >= 2  # batches of at most 4


@pytest.fixture
def Session(tmp_path):  # noqa: N802
    engine, session = released_ledger(tmp_path, RUN, 6)
    session.commits = 0

    def count(_s):
        session.commits += 1

    event.listen(session, "after_commit", count)
    yield session
    engine.dispose()


def ev(kind: str, service: str = "rollout", **data) -> Event:
    return Event(run=RUN, service=service, kind=kind, instance=data.pop("instance", "w0"), data=data)


def gid(p: str) -> str:
    return f"{RUN}:0:{p}"


def test_store_events_writes_rows_points_ledger_moves_and_one_health_row_per_instance(Session):  # noqa: N803
    batch = [
        (ev("health", status="ok", instance="w0", version=1), subjects.EVENTS_STREAM, 1),
        (ev("published", group_ids=[gid("p0"), gid("p1")]), subjects.EVENTS_STREAM, 2),
        (ev("metrics", tokens_per_s=5.0, in_flight=2), subjects.EVENTS_STREAM, 3),
        (ev("groups", service="trainer", version=1, trained=[gid("p0")], dropped_stale=[], filtered=[]),
         subjects.EVENTS_STREAM, 4),
        (ev("health", status="ok", instance="w0", version=2), subjects.EVENTS_STREAM, 5),
        (ev("health", status="ok", instance="w1", version=0), subjects.EVENTS_STREAM, 6),
        (ev("metrics", tokens_per_s=7.0, in_flight=1), subjects.EVENTS_STREAM, 7),
    ]
    moved = follower.store_events(Session, RUN, batch)
    assert moved == [False, True, False, True, False, False, False]
    assert Session.commits == 1
    with Session() as s:
        assert s.scalar(select(func.count()).select_from(EventRow)) == 4  # health events are not rows
        assert s.scalar(select(func.count()).select_from(Metric)) == 4  # 2 numbers x 2 metrics events
        health = {h.instance: h.data["version"] for h in s.scalars(select(Health))}
        states = {r.prompt_id: r.state for r in s.scalars(select(Ledger))}
    assert health == {"w0": 2, "w1": 0}  # the newest of each instance
    assert states["p0"] == "trained" and states["p1"] == "received" and states["p2"] == "released"
    # health again: updated in place, not a second row
    follower.store_events(Session, RUN, [(ev("health", status="ok", instance="w1", version=9), subjects.EVENTS_STREAM, 8)])
    with Session() as s:
        assert {h.instance: h.data["version"] for h in s.scalars(select(Health))} == {"w0": 2, "w1": 9}


async def test_a_batch_with_a_redelivered_event_stores_each_event_once_through_the_fallback(Session):  # noqa: N803
    follower.store_event(Session, RUN, ev("published", group_ids=[gid("p2")]), subjects.EVENTS_STREAM, 10)
    w = BatchWriter(lambda b: follower.store_events(Session, RUN, b),
                    lambda item: follower.store_event(Session, RUN, *item))
    items = [
        (ev("published", group_ids=[gid("p3")]), subjects.EVENTS_STREAM, 11),
        (ev("published", group_ids=[gid("p2")]), subjects.EVENTS_STREAM, 10),  # redelivered: stored already
        (ev("groups", service="trainer", version=2, trained=[gid("p3")], dropped_stale=[], filtered=[]),
         subjects.EVENTS_STREAM, 12),
    ]
    results = await asyncio.gather(*(w.submit(it) for it in items))
    assert results == [True, False, True]
    assert w.fallbacks == 1
    with Session() as s:
        seqs = sorted(s.scalars(select(EventRow.stream_seq)))
        states = {r.prompt_id: r.state for r in s.scalars(select(Ledger))}
    assert seqs == [10, 11, 12]
    assert states["p2"] == "received" and states["p3"] == "trained"
