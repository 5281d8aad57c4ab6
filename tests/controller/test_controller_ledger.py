"""The ledger on its own (SQLite, no NATS): trainer outcomes follow the latest report, dead letters are
final, an event and the ledger moves it causes commit together, and the admission bound's cap."""

from __future__ import annotations

import pytest
from controller_helpers import released_ledger
from sqlalchemy import event, select

from controller import follower, ledger
from controller.db import Ledger
from shared.contract import codec, subjects
from shared.contract.messages import DeadLetter, Event, PromptTask, WeightVersion

RUN = "l1"


@pytest.fixture
def Session(tmp_path):  # noqa: N802 - a sessionmaker, named like the controller's
    engine, session = released_ledger(tmp_path, RUN, 4)
    yield session
    engine.dispose()


def states(Session) -> dict[str, tuple[str, int | None]]:  # noqa: N803
    with Session() as s:
        return {r.prompt_id: (r.state, r.trained_version) for r in s.scalars(select(Ledger))}


def groups(seq: int, version: int, trained=(), dropped=()) -> tuple[Event, int]:
    ev = Event(run=RUN, service="trainer", kind="groups",
               data={"version": version, "trained": [f"{RUN}:0:{p}" for p in trained],
                     "dropped_stale": [f"{RUN}:0:{p}" for p in dropped], "filtered": []})
    return ev, seq


def store(Session, item) -> bool:  # noqa: N803
    ev, seq = item
    return follower.store_event(Session, RUN, ev, subjects.EVENTS_STREAM, seq)


def test_trainer_outcomes_follow_the_latest_report_and_dead_letters_are_final(Session):  # noqa: N803
    assert store(Session, groups(1, 3, trained=["p0", "p1"]))
    # after a resume from an older checkpoint: p0 trained again into a newer version, p1 now too stale
    assert store(Session, groups(2, 5, trained=["p0"], dropped=["p1"]))
    st = states(Session)
    assert st["p0"] == ("trained", 5) and st["p1"][0] == "dropped_stale"
    task = PromptTask(run=RUN, prompt_id="p2", epoch=0, payload={"prompt": "max 1 2 =", "reference": "2"})
    dl = DeadLetter(run=RUN, source=f"rollout-{RUN}", subject=subjects.prompts(RUN), reason="max_deliver",
                    original=codec.encode(task), stream=subjects.PROMPTS_STREAM, stream_seq=3)
    assert follower.store_dead_letter(Session, RUN, dl, 7)
    assert not store(Session, groups(3, 6, trained=["p2"]))  # a dead letter stays one
    ev = Event(run=RUN, service="rollout", kind="published", data={"group_ids": [f"{RUN}:0:p0"]})
    assert not follower.store_event(Session, RUN, ev, subjects.EVENTS_STREAM, 4)  # never back to received
    assert states(Session)["p2"][0] == "dead_lettered" and states(Session)["p0"][0] == "trained"


def test_an_event_and_the_ledger_moves_it_causes_commit_together(Session):  # noqa: N803
    """A controller killed between storing a "groups" event and moving its groups must not leave the event
    stored alone: the redelivery would look like a duplicate and the groups would stay in flight."""
    engine = Session.kw["bind"]

    def crash(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("UPDATE PROMPT_LEDGER"):
            raise RuntimeError("killed while moving the ledger")

    event.listen(engine, "before_cursor_execute", crash)
    with pytest.raises(RuntimeError):
        store(Session, groups(1, 1, trained=["p0"]))
    event.remove(engine, "before_cursor_execute", crash)
    assert store(Session, groups(1, 1, trained=["p0"]))  # the redelivery (same stream sequence) moves it
    assert states(Session)["p0"] == ("trained", 1)
    assert not store(Session, groups(1, 1, trained=["p0"]))  # and a second one is a duplicate


def test_admission_bound_is_capped_by_the_length_of_the_run():
    assert ledger.admission_bound(-1, 4, 16) == 80
    assert ledger.admission_bound(10, 4, 16) == 240
    assert ledger.admission_bound(10, 4, 16, total_steps=12) == 192
    assert ledger.admission_bound(0, 4, 16, total_steps=100) == 80


def test_admission_bound_counts_trainer_steps_and_versions_per_publish():
    # steps 10, max_staleness 4, batch 16: (10 + 5) x 16; publishing every 2 steps, 5 versions = 10 steps
    assert ledger.admission_bound(10, 4, 16) == 240
    assert ledger.admission_bound(10, 4, 16, publish_every=2) == (10 + 10) * 16
    # synchronous: one batch beyond what is trained
    assert ledger.admission_bound(7, 0, 8) == 64


def test_the_bound_takes_off_what_drained_steps_trained_short_of_a_batch(Session):  # noqa: N803
    # steps 2, max_staleness 0, batch 2, total 3: (2 + 1) x 2 = 6, capped at 3 x 2 = 6, less 1 short
    assert ledger.admission_bound(2, 0, 2, total_steps=3, short=1) == 5
    assert ledger.admission_bound(2, 0, 2, total_steps=2, short=1) == 3  # the 3 trained: nothing more to release
    assert ledger.admission_bound(2, 4, 2) == ledger.admission_bound(2, 4, 2, short=0) == (2 + 5) * 2
    # the announcement carries it (WeightVersion.short); the row keeps it with the step
    follower.record_version(Session, RUN, WeightVersion(run=RUN, version=2, step=2, short=1))
    cfg = {"schedule": {"batch_size": 2, "max_staleness": 0, "total_steps": 3}}
    with Session() as s:
        assert ledger.announced(s, RUN, 2) == (2, 1) and ledger.announced(s, RUN, 5) == (0, 0)
        assert ledger.run_bound(s, RUN, cfg, 2) == (2, 5)


def test_a_database_made_before_a_column_was_added_gets_it(tmp_path):
    import sqlite3

    from controller.db import open_database

    path = tmp_path / "old.db"
    engine, _ = open_database(f"sqlite:///{path}")
    engine.dispose()
    with sqlite3.connect(path) as c:  # as a controller before 0.11.1 made it
        c.execute("ALTER TABLE weight_versions DROP COLUMN short")
        c.execute("INSERT INTO weight_versions (run_id, version, step, manifest_url, sha256, created_at, seen_at) "
                  "VALUES ('old', 3, 3, '', '', 0, 0)")
    engine, Session = open_database(f"sqlite:///{path}")  # noqa: N806
    with Session() as s:
        assert ledger.announced(s, "old", 3) == (3, 0)
    follower.record_version(Session, "old", WeightVersion(run="old", version=4, step=4, short=2))
    with Session() as s:
        assert ledger.announced(s, "old", 4) == (4, 2)
    engine.dispose()
