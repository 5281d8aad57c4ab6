"""Prompt memory without NATS (SQLite and PostgreSQL): rollout "published" events with `prompts` write one
observation per group and add to the per-prompt memory exactly once under redelivery and duplicates,
trainer "no_signal" events set the run's signal state, filtered groups keep their reason, and the pure
pieces (classes, histograms, version buckets, learnable-first order) against hand-worked numbers."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from controller import follower, memory, no_signal, prompt_stats, store
from controller.db import Dataset, Ledger, PromptMemory, PromptObservation, Run, open_database
from controller.sampling import learnable_first, next_unreleased, row_of
from shared.contract import subjects
from shared.contract.messages import Event

RUN = "m1"
H = "abcdef012345"  # a dataset's content hash prefix


def pid(i: int) -> str:
    return f"{H}-{i}"


def gid(i: int, epoch: int = 0, run: str = RUN) -> str:
    return subjects.group_id(run, epoch, pid(i))


@pytest.fixture
def Session(db_url):  # noqa: N802 - a sessionmaker, named like the controller's
    engine, session = open_database(db_url)
    with session.begin() as s:
        s.add(Dataset(name="d", content_hash=H + "0" * 52, source="upload", source_ref="d.jsonl", format="jsonl",
                      mapping={}, num_rows=10, path="/nonexistent"))
        for run in (RUN, "m2"):
            s.add(Run(id=run, config={"run": run}))
    release(session, RUN, range(6), epoch=0)
    yield session
    engine.dispose()


def release(Session, run, rows, epoch, seq0=0):  # noqa: N803
    with Session.begin() as s:
        s.execute(Ledger.__table__.insert(), [
            dict(group_id=gid(i, epoch, run), run_id=run, enqueue_id=1, epoch=epoch, prompt_id=pid(i), row_index=i,
                 seq=seq0 + k + 1, state="released", released_at_version=0, released_at=0.0, updated_at=0.0)
            for k, i in enumerate(rows)])


def entry(i, drawn, successes, signal, version=1, mean=None, epoch=0, run=RUN):
    return {"group_id": gid(i, epoch, run), "prompt_id": pid(i), "drawn": drawn, "successes": successes,
            "reward_mean": successes / drawn if mean is None else mean, "signal": signal, "version": version}


def published(Session, seq, entries, run=RUN, group_ids=None):  # noqa: N803
    data = {"group_ids": group_ids if group_ids is not None else [e["group_id"] for e in entries], "worker": "w0"}
    if entries is not None:
        data["prompts"] = entries
    ev = Event(run=run, service="rollout", kind="published", data=data)
    return follower.store_event(Session, run, ev, subjects.EVENTS_STREAM, seq)


def mem(Session) -> dict[str, PromptMemory]:  # noqa: N803
    with Session() as s:
        return {m.prompt_id: m for m in s.scalars(select(PromptMemory))}


def n_obs(Session) -> int:  # noqa: N803
    with Session() as s:
        return len(list(s.scalars(select(PromptObservation.group_id))))


def test_published_prompts_are_remembered_once_under_redelivery_and_duplicates(Session):  # noqa: N803
    assert published(Session, 1, [entry(0, 4, 2, True), entry(1, 8, 0, False, mean=0.0)])
    assert not published(Session, 1, [entry(0, 4, 2, True), entry(1, 8, 0, False)])  # a redelivery: nothing
    # the rollout published group 0 twice (a crash between publish and ack): the second report, in an event
    # with a new group, counts once; a group the ledger does not know is ignored
    assert published(Session, 2, [entry(0, 4, 2, True), entry(2, 4, 4, False),
                                  {**entry(9, 4, 1, True), "group_id": "m1:0:unknown-9"}])
    m = mem(Session)
    assert (m[pid(0)].sampled, m[pid(0)].successes, m[pid(0)].groups) == (4, 2, 1)
    assert (m[pid(1)].sampled, m[pid(1)].successes, m[pid(1)].solve_rate) == (8, 0, 0.0)
    assert (m[pid(2)].sampled, m[pid(2)].successes, m[pid(2)].solve_rate) == (4, 4, 1.0)
    assert set(m) == {pid(0), pid(1), pid(2)} and n_obs(Session) == 3
    with Session() as s:
        assert {r.group_id: r.state for r in s.scalars(select(Ledger))}[gid(2)] == "received"


def test_an_outcome_before_the_published_event_still_counts_and_old_events_still_move(Session):  # noqa: N803
    # the trainer's report of group 3 overtook the rollout's: the ledger does not move back, the memory counts
    ev = Event(run=RUN, service="trainer", kind="groups", data={"version": 2, "trained": [gid(3)]})
    assert follower.store_event(Session, RUN, ev, subjects.EVENTS_STREAM, 1)
    assert not published(Session, 2, [entry(3, 4, 3, True)])
    assert mem(Session)[pid(3)].sampled == 4
    # an event from an older rollout, without `prompts`, moves its groups and remembers nothing
    assert published(Session, 3, None, group_ids=[gid(4)])
    # malformed entries are skipped, the well-formed one counts
    bad = [{"group_id": gid(5)}, {**entry(5, 4, 5, True)}, {**entry(5, 4, 1, "yes")}, "x", None]
    assert not published(Session, 4, bad + [entry(1, 2, 1, True)], group_ids=[])
    assert set(mem(Session)) == {pid(3), pid(1)}


def test_memory_adds_every_epoch_and_run_and_keeps_the_last_observation(Session):  # noqa: N803
    release(Session, RUN, [0], epoch=1, seq0=10)
    release(Session, "m2", [0], epoch=0)
    assert published(Session, 1, [entry(0, 4, 1, True, version=3)])
    assert published(Session, 2, [entry(0, 8, 8, False, version=5, epoch=1)])
    assert published(Session, 1, [entry(0, 4, 0, False, version=2, run="m2", mean=0.0)], run="m2")
    m = mem(Session)[pid(0)]
    # 4 + 8 + 4 samples, 1 + 8 + 0 successes; the last observation is run m2's (version 2, no signal)
    assert (m.sampled, m.successes, m.groups, m.signal_groups) == (16, 9, 3, 1)
    assert m.solve_rate == pytest.approx(9 / 16) and m.reward_sum == pytest.approx(0.25 * 4 + 1.0 * 8 + 0.0)
    assert (m.last_version, m.last_run, m.last_signal, m.last_successes, m.last_drawn) == (5, "m2", False, 0, 4)
    assert memory.prompt_class(m.sampled, m.successes, m.last_signal) == memory.NO_SIGNAL


def test_filtered_groups_keep_the_trainers_reason(Session):  # noqa: N803
    data = {"version": 1, "trained": [gid(0)], "filtered": [gid(1), gid(2), gid(3)],
            "filtered_reasons": {gid(1): "no signal after 64 samples", gid(2): "no signal after 64 samples"}}
    assert follower.store_event(Session, RUN, Event(run=RUN, service="trainer", kind="groups", data=data),
                                subjects.EVENTS_STREAM, 1)
    with Session() as s:
        reasons = {r.group_id: (r.state, r.reason) for r in s.scalars(select(Ledger))}
        f = prompt_stats.filtered_reasons(s, RUN)
    assert reasons[gid(1)] == ("filtered", "no signal after 64 samples") and reasons[gid(3)] == ("filtered", None)
    assert f == {"total": 3, "no_signal": 2, "by_reason": {"no signal after 64 samples": 2, "": 1}}


def test_no_signal_events_set_the_run_state_by_step_not_by_arrival(Session):  # noqa: N803
    def send(seq, **data):
        ev = Event(run=RUN, service="trainer", kind="no_signal", data=data)
        follower.store_event(Session, RUN, ev, subjects.EVENTS_STREAM, seq)
        with Session() as s:
            return store.run_dict(s, s.get(Run, RUN))["signal"]

    assert send(1, active=True, step=5, since_step=3, groups=24, message="8 steps of zero advantage")["no_signal"]
    # an older report arriving late changes nothing
    sig = send(2, active=False, step=4, since_step=0, groups=0, message="")
    assert sig == {"no_signal": True, "since_step": 3, "step": 5, "groups": 24, "message": "8 steps of zero advantage"}
    assert send(3, active=False, step=9, since_step=3, groups=0, message="signal is back") == \
        {"no_signal": False, "since_step": None, "step": 9, "groups": 0, "message": ""}
    with Session() as s:
        assert no_signal.state(s, "m2") == {"no_signal": False, "since_step": None, "step": None, "groups": None,
                                            "message": ""}


def test_run_and_dataset_stats_hand_computed(Session):  # noqa: N803
    release(Session, RUN, [0, 1], epoch=1, seq0=10)
    release(Session, "m2", [7], epoch=0)
    # run m1: p0 at v1 2/4 signal, p0 at v6 4/4 no signal (epoch 1); p1 0/8; p2 4/4; p3 1/4 signal at v6
    assert published(Session, 1, [entry(0, 4, 2, True, version=1), entry(1, 8, 0, False, version=2),
                                  entry(2, 4, 4, False, version=2)])
    assert published(Session, 2, [entry(0, 4, 4, False, version=6, epoch=1), entry(3, 4, 1, True, version=6)])
    assert published(Session, 1, [entry(7, 2, 1, True, version=0, run="m2")], run="m2")
    with Session() as s:
        st = prompt_stats.run_stats(s, RUN, limit=2, buckets=2)
        ds = prompt_stats.dataset_stats(s, s.scalar(select(Dataset)), limit=1)
    # released in m1: p0..p5 -> 6 prompts; observed p0 (6/8, last no signal), p1 (0/8), p2 (4/4), p3 (1/4, signal)
    assert (st["prompts_released"], st["prompts_observed"], st["groups_observed"]) == (6, 4, 5)
    assert (st["groups_with_signal"], st["samples_drawn"], st["successes"]) == (2, 24, 11)
    assert st["classes"] == {"learnable": 1, "unseen": 2, "no_signal": 1, "never_solved": 1, "always_solved": 1}
    # per-prompt rates 0.75, 0.0, 1.0, 0.25
    h = st["histogram"]
    assert (h["zero"], h["one"], h["counts"]) == (1, 1, [0, 0, 1, 0, 0, 0, 0, 1, 0, 0])
    # versions 1..6 in 2 buckets of 3: [1, 3] holds p0 2/4, p1 0/8, p2 4/4; [4, 6] holds p0 4/4, p3 1/4
    b0, b1 = st["by_version"]
    assert (b0["versions"], b0["prompts"], b0["samples"], b0["solve_rate"]) == ([1, 3], 3, 16, 6 / 16)
    assert (b0["histogram"]["zero"], b0["histogram"]["one"], b0["histogram"]["counts"][5]) == (1, 1, 1)
    assert (b1["versions"], b1["prompts"], b1["samples"], b1["solve_rate"]) == ([4, 6], 2, 8, 5 / 8)
    assert (b1["histogram"]["one"], b1["histogram"]["counts"][2]) == (1, 1)
    # the most sampled: p0 and p1 (8 each, by id)
    assert [(p["prompt_id"], p["sampled"], p["class"]) for p in st["top"]] == \
        [(pid(0), 8, "no_signal"), (pid(1), 8, "never_solved")]
    assert st["filtered"] == {"total": 0, "no_signal": 0, "by_reason": {}}
    # the dataset over both runs: p0..p3 and m2's p7 observed; 10 rows, so 5 unseen
    assert ds["prompts_observed"] == 5 and ds["samples_drawn"] == 26 and ds["groups_with_signal"] == 3
    assert ds["classes"] == {"learnable": 2, "unseen": 5, "no_signal": 1, "never_solved": 1, "always_solved": 1}
    assert ds["runs"] == [{"run": RUN, "groups": 5, "samples_drawn": 24}, {"run": "m2", "groups": 1, "samples_drawn": 2}]
    assert [p["prompt_id"] for p in ds["top"]] == [pid(0)] and ds["top"][0]["reward_mean"] == pytest.approx(6 / 8)


def test_prompt_classes_by_hand():
    assert memory.prompt_class(0, 0, False) == "unseen"
    assert memory.prompt_class(8, 3, True) == "learnable"
    assert memory.prompt_class(8, 0, True) == "learnable"  # a reward spread without a success: still signal
    assert memory.prompt_class(8, 0, False) == "never_solved"
    assert memory.prompt_class(8, 8, False) == "always_solved"
    assert memory.prompt_class(8, 5, False) == "no_signal"
    assert memory.dataset_key("abcdef012345-17") == "abcdef012345" and row_of("abcdef012345-17") == 17
    assert row_of("weird") is None


def test_solve_rate_histogram_and_version_buckets_by_hand():
    h = prompt_stats.solve_rate_histogram([0.0, 0.1, 0.3, 0.3, 0.55, 0.999, 1.0, 1.0], bins=10)
    assert h["edges"][:3] == [0.0, 0.1, 0.2] and h["edges"][-1] == 1.0
    assert (h["zero"], h["one"]) == (1, 2) and h["counts"] == [0, 1, 0, 2, 0, 1, 0, 0, 0, 1]
    h = prompt_stats.solve_rate_histogram([0.25, 0.5, 0.75], bins=2)
    assert h == {"edges": [0.0, 0.5, 1.0], "counts": [1, 2], "zero": 0, "one": 0}
    obs = [dict(prompt_id="a", version=0, drawn=4, successes=1), dict(prompt_id="a", version=1, drawn=4, successes=3),
           dict(prompt_id="b", version=4, drawn=2, successes=2)]
    # versions 0..4 in at most 2 buckets: width 3 -> [0, 2], [3, 4]
    b = prompt_stats.version_buckets(obs, 2)
    assert [x["versions"] for x in b] == [[0, 2], [3, 4]]
    assert (b[0]["prompts"], b[0]["samples"], b[0]["solve_rate"]) == (1, 8, 0.5)  # a: 4/8 pooled
    assert b[0]["histogram"]["counts"][5] == 1 and b[1]["histogram"]["one"] == 1
    assert prompt_stats.version_buckets([], 3) == []


def test_learnable_first_order_by_hand():
    # ranks by row: 0 always (4), 1 learnable (0), 2 unseen (1), 3 never (3), 4 learnable (0), 5 no signal (2)
    ranks = np.array([4, 0, 1, 3, 0, 2], np.int8)
    perm = np.array([3, 5, 0, 4, 2, 1])
    order = learnable_first(perm, ranks)
    assert order.tolist() == [4, 1, 2, 5, 3, 0]  # learnable in perm order (4 before 1), then by class
    released = np.zeros(6, bool)
    released[[1, 5]] = True
    assert next_unreleased(order, released, 3).tolist() == [4, 2, 3]
    assert next_unreleased(order, np.ones(6, bool), 3).tolist() == []
