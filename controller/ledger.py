"""The prompt ledger: where every released group stands, and the counts admission control uses.

A group (one prompt of one epoch, id `<run>:<epoch>:<prompt_id>`) is written here *before* it is
published, in the same transaction that advances its enqueue's cursor, so a controller that dies at any
point neither forgets nor re-releases it: on restart the rows with `seq > runs.published_seq` (written,
maybe not acked by JetStream) are published again under the same Nats-Msg-Id, which JetStream drops
as duplicates. States only move forward:

    released -> received (rollout published its trajectory) -> trained | dropped_stale | filtered
    released | received -> dead_lettered

with one exception: the trainer's outcomes (trained, dropped_stale, filtered) follow the lineage of the
final model, so a later report of a group replaces an earlier one. A trainer that resumes from a
checkpoint reads the groups it decided after that checkpoint again and decides them again (a group
trained into a discarded version may now be dropped as stale, since versions only grow). dead_lettered
is final.

Accounting: released = trained + dropped_stale + filtered + dead_lettered + in flight (released, received).
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from controller.db import (
    DEAD_LETTERED,
    DROPPED_STALE,
    FILTERED,
    FREED_STATES,
    LEDGER_STATES,
    RECEIVED,
    RELEASED,
    TRAINED,
    Enqueue,
    Ledger,
    Run,
    WeightVersionRow,
    now,
)

# new state -> the states a group may be in before it. A trainer outcome may replace another one
# (the latest report wins: see the module docstring); nothing leaves dead_lettered.
TRAINER_OUTCOMES = (TRAINED, DROPPED_STALE, FILTERED)
TRANSITIONS: dict[str, tuple[str, ...]] = {
    RECEIVED: (RELEASED,),
    TRAINED: (RELEASED, RECEIVED, *TRAINER_OUTCOMES),
    DROPPED_STALE: (RELEASED, RECEIVED, *TRAINER_OUTCOMES),
    FILTERED: (RELEASED, RECEIVED, *TRAINER_OUTCOMES),
    DEAD_LETTERED: (RELEASED, RECEIVED),
}


def counts(session: Session, run_id: str) -> dict[str, int]:
    rows = session.execute(
        select(Ledger.state, func.count()).where(Ledger.run_id == run_id).group_by(Ledger.state)
    ).all()
    out = {s: 0 for s in LEDGER_STATES}
    out.update({state: n for state, n in rows})
    return out


def summary(session: Session, run_id: str) -> dict:
    c = counts(session, run_id)
    released = sum(c.values())
    in_flight = c[RELEASED] + c[RECEIVED]
    return {
        "released": released,
        "in_flight": in_flight,
        "awaiting_trajectory": c[RELEASED],
        "trajectory_received": c[RECEIVED],
        "trained": c[TRAINED],
        "dropped_stale": c[DROPPED_STALE],
        "filtered": c[FILTERED],
        "dead_lettered": c[DEAD_LETTERED],
        "outstanding": released - sum(c[s] for s in FREED_STATES),
        "balanced": released == c[TRAINED] + c[DROPPED_STALE] + c[FILTERED] + c[DEAD_LETTERED] + in_flight,
    }


def outstanding(session: Session, run_id: str) -> int:
    """Groups that count against the admission bound: released and not dropped/filtered/dead-lettered."""
    return session.scalar(
        select(func.count()).select_from(Ledger).where(Ledger.run_id == run_id, Ledger.state.not_in(FREED_STATES))
    ) or 0


def admission_bound(steps: int, max_staleness: int, batch_size: int, total_steps: int = 0,
                    publish_every: int = 1, short: int = 0) -> int:
    """Groups that may be released and not freed (trained ones count): (steps + (max_staleness + 1) x
    publish_every) x batch_size - short, where `steps` is the trainer's optimizer step of the newest announced
    version (0 before any) and `short` how many groups those steps trained short of full batches (the
    version's WeightVersion.short: drained last batches, controller/completion.py). With one version per step and full batches
    that is AReaL's (version + max_staleness + 1) x batch_size. Steps, not versions: a trainer resumed from
    an older checkpoint numbers its versions on after the highest announced one while its lineage has
    trained fewer batches; counted in versions, the window grew by the lost steps and groups outlived the
    staleness bound (measured: 15-20 % dropped after a trainer kill). Never more than total_steps x
    batch_size - short when the run has a length (total_steps > 0): the trainer stops after total_steps
    steps, so a group released beyond that would never be trained and the run would end with groups in
    flight (measured before `short`: a run paced by its enqueues drained a smaller batch mid-run and ended
    at total_steps with 4 groups received and never trained)."""
    bound = (max(steps, 0) + (max_staleness + 1) * publish_every) * batch_size
    if total_steps > 0:
        bound = min(bound, total_steps * batch_size)
    return bound - max(short, 0)


def run_bound(session: Session, run_id: str, config: dict, version: int) -> tuple[int, int]:
    """(step of announced `version`, admission bound) of a run from its stored config dict."""
    sched = config.get("schedule", {}) or {}
    step, short = announced(session, run_id, version)
    return step, admission_bound(step, sched.get("max_staleness", 4), sched.get("batch_size", 8),
                                 sched.get("total_steps", 0), (config.get("trainer") or {}).get("publish_every", 1),
                                 short)


def announced(session: Session, run_id: str, version: int) -> tuple[int, int]:
    """(step, short) recorded with announced `version` ((0, 0) when there is none): WeightVersion.step/short."""
    if version < 0:
        return 0, 0
    row = session.execute(select(WeightVersionRow.step, WeightVersionRow.short).where(
        WeightVersionRow.run_id == run_id, WeightVersionRow.version == version)).first()
    return (row[0] or 0, row[1] or 0) if row is not None else (0, 0)


def reserve(Session_: sessionmaker, run_id: str, rows: list[dict], cursors: dict[int, int], acked_seq: int) -> None:
    """Write a batch of ledger rows, advance enqueue cursors and the run's seq counters, atomically."""
    with Session_.begin() as s:
        if rows:
            s.execute(Ledger.__table__.insert(), rows)  # Core executemany: no ORM bookkeeping per row
        for enqueue_id, pos in cursors.items():
            s.execute(update(Enqueue).where(Enqueue.id == enqueue_id).values(next_pos=pos))
        values: dict = {"published_seq": acked_seq}
        if rows:
            values["release_seq"] = rows[-1]["seq"]
        s.execute(update(Run).where(Run.id == run_id).values(**values))


def set_published(Session_: sessionmaker, run_id: str, acked_seq: int) -> None:
    with Session_.begin() as s:
        s.execute(update(Run).where(Run.id == run_id, Run.published_seq < acked_seq).values(published_seq=acked_seq))


def unpublished(Session_: sessionmaker, run_id: str) -> list[Ledger]:
    """Rows written but maybe not acked by JetStream (a crash between the two): publish them again."""
    with Session_() as s:
        run = s.get(Run, run_id)
        if run is None:
            return []
        return list(s.scalars(select(Ledger).where(Ledger.run_id == run_id, Ledger.seq > run.published_seq)
                              .order_by(Ledger.seq)))


def mark_in(s: Session, run_id: str, group_ids: list[str], state: str, *,
            trained_version: int | None = None, reason: str | None = None) -> int:
    """Move groups to `state` if they may (TRANSITIONS), inside the caller's transaction `s` (so the
    event that decided it and the move commit together); returns how many moved. Unknown ids are ignored."""
    if not group_ids:
        return 0
    values: dict = {"state": state, "updated_at": now()}
    if trained_version is not None:
        values["trained_version"] = trained_version
    if reason is not None:
        values["reason"] = reason[:2000]
    moved = 0
    for i in range(0, len(group_ids), 500):
        chunk = [str(g) for g in group_ids[i : i + 500]]
        res = s.execute(update(Ledger).where(Ledger.run_id == run_id, Ledger.group_id.in_(chunk),
                                             Ledger.state.in_(TRANSITIONS[state])).values(**values))
        moved += res.rowcount or 0
    return moved


def mark(Session_: sessionmaker, run_id: str, group_ids: list[str], state: str, *,
         trained_version: int | None = None, reason: str | None = None) -> int:
    """`mark_in` in a transaction of its own."""
    with Session_.begin() as s:
        return mark_in(s, run_id, group_ids, state, trained_version=trained_version, reason=reason)
