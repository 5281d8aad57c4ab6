"""Prompt memory: what the rollouts saw of each prompt, kept in SQL across runs and restarts.

A rollout "published" event carries, per group, `prompts: [{group_id, prompt_id, drawn, successes,
reward_mean, signal, version}]` (docs/protocol.md). The follower hands it to `record` inside the
transaction that stores the event and moves the ledger, which

- writes one `prompt_observations` row per group the run's ledger knows and that has none yet (INSERT ...
  ON CONFLICT DO NOTHING on the group id): a redelivered event, a second event naming the same group (a
  group published twice) or a concurrent duplicate count once. The prompt id and epoch are the ledger's,
  not the event's;
- adds the observations it wrote to `prompt_memory`, one row per prompt id (sampled += drawn, successes,
  groups, groups with signal, reward sum; the last observation's signal / successes / drawn / run; the
  newest version), as one upsert, so two followers adding to one prompt both count.

Prompt ids are `<dataset content hash[:12]>-<row>` (release.py `prompt_id_for`): the same data has the
same ids in every run, so a second run reads what the first one learnt about each prompt.

`prompt_class` sorts a prompt into one of CLASSES; learnable-first release (sampling.py) goes in that order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqlalchemy import Float, case, cast, select

from controller.db import Ledger, PromptMemory, PromptObservation, now, upsert

log = logging.getLogger("jetrl.controller.memory")

LEARNABLE = "learnable"  # the last observation's rewards had a spread
UNSEEN = "unseen"  # never observed
NO_SIGNAL = "no_signal"  # seen, last observation without spread, neither never nor always solved
NEVER_SOLVED = "never_solved"  # sampled > 0, no success
ALWAYS_SOLVED = "always_solved"  # sampled > 0, every sample a success
CLASSES = (LEARNABLE, UNSEEN, NO_SIGNAL, NEVER_SOLVED, ALWAYS_SOLVED)  # learnable-first release order
RANK = {c: i for i, c in enumerate(CLASSES)}


def prompt_class(sampled: int, successes: int, last_signal: bool) -> str:
    """The class of a prompt from its memory (sampled = 0: never observed)."""
    if sampled <= 0:
        return UNSEEN
    if last_signal:
        return LEARNABLE
    if successes <= 0:
        return NEVER_SOLVED
    if successes >= sampled:
        return ALWAYS_SOLVED
    return NO_SIGNAL


def dataset_key(prompt_id: str) -> str:
    """The dataset part of a prompt id (`<hash[:12]>-<row>` -> the hash prefix)."""
    head, sep, _ = prompt_id.rpartition("-")
    return (head if sep else prompt_id)[:64]


def _int(v, lo: int = 0) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v < 2**31 else None


def parse(records) -> list[dict]:
    """The well-formed entries of a "published" event's `prompts` field, by group id (a malformed entry
    is skipped with a warning: it says nothing reliable about its prompt)."""
    out: dict[str, dict] = {}
    bad = 0
    for r in records if isinstance(records, list) else []:
        if not isinstance(r, dict) or not isinstance(r.get("group_id"), str) or len(r["group_id"]) > 200:
            bad += 1
            continue
        drawn, successes = _int(r.get("drawn")), _int(r.get("successes"))
        mean = r.get("reward_mean")
        version = _int(r.get("version"), lo=-1)
        if drawn is None or successes is None or successes > drawn or not isinstance(r.get("signal"), bool) \
                or isinstance(mean, bool) or not isinstance(mean, (int, float)):
            bad += 1
            continue
        out[r["group_id"]] = {"drawn": drawn, "successes": successes, "reward_mean": float(mean),
                              "signal": r["signal"], "version": -1 if version is None else version}
    if bad:
        log.warning("a published event had %d malformed prompts entries; skipped", bad)
    return list({"group_id": g, **v} for g, v in out.items())


def record(s, run_id: str, records, time: float | None = None) -> int:
    """Write the observations of a "published" event's `prompts` and add them to the memory, in the
    caller's transaction `s`; returns how many observations were new."""
    entries = parse(records)
    if not entries:
        return 0
    t = now() if time is None else time  # the observations' time (the event's); the memory's is now()
    known: dict[str, tuple[str, int]] = {}
    ids = [e["group_id"] for e in entries]
    for i in range(0, len(ids), 500):
        q = select(Ledger.group_id, Ledger.prompt_id, Ledger.epoch).where(Ledger.run_id == run_id,
                                                                          Ledger.group_id.in_(ids[i:i + 500]))
        known.update({g: (p, ep) for g, p, ep in s.execute(q)})
    rows = [dict(group_id=e["group_id"], run_id=run_id, prompt_id=known[e["group_id"]][0],
                 dataset_key=dataset_key(known[e["group_id"]][0]), epoch=known[e["group_id"]][1], drawn=e["drawn"],
                 successes=e["successes"], reward_mean=e["reward_mean"], signal=e["signal"], version=e["version"],
                 time=t) for e in entries if e["group_id"] in known]
    new: set[str] = set()
    for i in range(0, len(rows), 200):
        stmt = upsert(s, PromptObservation.__table__, rows[i:i + 200], ["group_id"], {})
        new.update(s.scalars(stmt.returning(PromptObservation.group_id)))
    fresh = [r for r in rows if r["group_id"] in new]
    if fresh:
        totals = list(fold(fresh, run_id, now()).values())
        for i in range(0, len(totals), 200):
            s.execute(_add_to_memory(s, totals[i:i + 200]))
    return len(fresh)


def fold(observations: Iterable[dict], run_id: str, t: float) -> dict[str, dict]:
    """Memory increments per prompt id from observation rows (in order: the last one is the `last_*`)."""
    out: dict[str, dict] = {}
    for o in observations:
        m = out.get(o["prompt_id"])
        if m is None:
            m = out[o["prompt_id"]] = dict(prompt_id=o["prompt_id"], dataset_key=o["dataset_key"], sampled=0,
                                           successes=0, groups=0, signal_groups=0, reward_sum=0.0, solve_rate=0.0,
                                           last_version=-1, last_run=run_id, updated_at=t)
        m["sampled"] += o["drawn"]
        m["successes"] += o["successes"]
        m["groups"] += 1
        m["signal_groups"] += int(o["signal"])
        m["reward_sum"] += o["reward_mean"] * o["drawn"]
        m["last_version"] = max(m["last_version"], o["version"])
        m.update(last_signal=o["signal"], last_successes=o["successes"], last_drawn=o["drawn"])
        m["solve_rate"] = m["successes"] / m["sampled"] if m["sampled"] else 0.0
    return out


def _add_to_memory(s, totals: list[dict]):
    t = PromptMemory.__table__.c

    def set_(ex):
        sampled, successes = t.sampled + ex.sampled, t.successes + ex.successes
        return {"sampled": sampled, "successes": successes, "groups": t.groups + ex.groups,
                "signal_groups": t.signal_groups + ex.signal_groups, "reward_sum": t.reward_sum + ex.reward_sum,
                "solve_rate": case((sampled > 0, cast(successes, Float) / sampled), else_=0.0),
                "last_version": case((ex.last_version > t.last_version, ex.last_version), else_=t.last_version),
                "last_run": ex.last_run, "last_signal": ex.last_signal, "last_successes": ex.last_successes,
                "last_drawn": ex.last_drawn, "updated_at": ex.updated_at}

    return upsert(s, PromptMemory.__table__, totals, ["prompt_id"], set_)


def memory_dict(m) -> dict:
    """One prompt's memory as the REST views show it."""
    return {"prompt_id": m.prompt_id, "sampled": m.sampled, "successes": m.successes, "groups": m.groups,
            "signal_groups": m.signal_groups, "solve_rate": m.solve_rate,
            "reward_mean": m.reward_sum / m.sampled if m.sampled else None, "last_version": m.last_version,
            "last_run": m.last_run, "last_signal": m.last_signal, "last_successes": m.last_successes,
            "last_drawn": m.last_drawn, "class": prompt_class(m.sampled, m.successes, m.last_signal),
            "always_solved": m.sampled > 0 and m.successes == m.sampled,
            "never_solved": m.sampled > 0 and m.successes == 0, "updated_at": m.updated_at}


def classes_since(s, key: str, since: float) -> list[tuple[str, str]]:
    """(prompt id, class) of one dataset's prompts whose memory changed at or after `since`."""
    q = select(PromptMemory.prompt_id, PromptMemory.sampled, PromptMemory.successes, PromptMemory.last_signal) \
        .where(PromptMemory.dataset_key == key, PromptMemory.updated_at >= since)
    return [(p, prompt_class(n, k, bool(sig))) for p, n, k, sig in s.execute(q)]
