"""What the prompt memory says, as the REST views show it (routes/prompts.py): per run, from the run's own
observations, and per dataset, from the memory every run on that data added to (memory.py).

Solve rate of a prompt = its successes / its samples drawn. A histogram counts prompts: `zero` (solve rate
exactly 0), `one` (exactly 1) and `counts[i]` for rates in [edges[i], edges[i+1]) strictly between 0 and 1.
`by_version` is that histogram per bucket of policy versions (an observation's version is the newest one
among its group's tokens), so a reader sees the solve rates move as the run trains.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.db import FILTERED, Dataset, Ledger, PromptMemory, PromptObservation
from controller.memory import CLASSES, UNSEEN, fold, memory_dict, prompt_class

HIST_BINS = 10
NO_SIGNAL_REASON = "no signal"  # a filtered group whose reason contains this was filtered for want of signal


def solve_rate_histogram(rates: Iterable[float], bins: int = HIST_BINS) -> dict:
    """{"edges": [0, 1/bins, ..., 1], "counts": [bins], "zero": n, "one": n} over per-prompt solve rates."""
    edges = [i / bins for i in range(bins + 1)]
    counts, zero, one = [0] * bins, 0, 0
    for r in rates:
        if r <= 0:
            zero += 1
        elif r >= 1:
            one += 1
        else:
            counts[min(bisect.bisect_right(edges, r) - 1, bins - 1)] += 1
    return {"edges": edges, "counts": counts, "zero": zero, "one": one}


def version_buckets(observations: list[dict], buckets: int) -> list[dict]:
    """Observations ({prompt_id, version, drawn, successes}) cut into at most `buckets` equal runs of
    versions from the lowest to the highest seen: per bucket its versions [lo, hi], the prompts observed
    in it, their samples, the pooled solve rate and the histogram of per-prompt solve rates in it."""
    if not observations:
        return []
    lo = min(o["version"] for o in observations)
    hi = max(o["version"] for o in observations)
    width = max(1, math.ceil((hi - lo + 1) / max(1, buckets)))
    per: dict[int, dict[str, list[int]]] = {}
    for o in observations:
        b = (o["version"] - lo) // width
        acc = per.setdefault(b, {}).setdefault(o["prompt_id"], [0, 0])
        acc[0] += o["drawn"]
        acc[1] += o["successes"]
    out = []
    for b in range((hi - lo) // width + 1):
        prompts = per.get(b, {})
        drawn = sum(d for d, _ in prompts.values())
        solved = sum(k for _, k in prompts.values())
        out.append({"versions": [lo + b * width, min(hi, lo + (b + 1) * width - 1)], "prompts": len(prompts),
                    "samples": drawn, "solve_rate": solved / drawn if drawn else None,
                    "histogram": solve_rate_histogram(k / d for d, k in prompts.values() if d > 0)})
    return out


def class_counts(totals: Iterable[dict], unseen: int = 0) -> dict[str, int]:
    """Prompts per class (memory.CLASSES) from per-prompt totals; `unseen` are counted as given."""
    out = dict.fromkeys(CLASSES, 0)
    for m in totals:
        out[prompt_class(m["sampled"], m["successes"], m["last_signal"])] += 1
    out[UNSEEN] += unseen
    return out


def _prompt_row(m: dict) -> dict:
    return {"prompt_id": m["prompt_id"], "sampled": m["sampled"], "successes": m["successes"], "groups": m["groups"],
            "signal_groups": m["signal_groups"], "solve_rate": m["solve_rate"],
            "reward_mean": m["reward_sum"] / m["sampled"] if m["sampled"] else None, "last_version": m["last_version"],
            "last_signal": m["last_signal"], "class": prompt_class(m["sampled"], m["successes"], m["last_signal"])}


def top(totals: Iterable[dict], limit: int) -> list[dict]:
    """The `limit` prompts with the most samples (ties by prompt id)."""
    return sorted(totals, key=lambda m: (-m["sampled"], m["prompt_id"]))[:limit]


def filtered_reasons(s: Session, run_id: str) -> dict:
    """Filtered groups of the run by the trainer's reason ("" = none given), and how many were for want of signal."""
    rows = s.execute(select(Ledger.reason, func.count()).where(Ledger.run_id == run_id, Ledger.state == FILTERED)
                     .group_by(Ledger.reason)).all()
    by = {(r or ""): n for r, n in rows}
    return {"total": sum(by.values()), "no_signal": sum(n for r, n in by.items() if NO_SIGNAL_REASON in r.lower()),
            "by_reason": dict(sorted(by.items(), key=lambda kv: -kv[1])[:50])}


def run_stats(s: Session, run_id: str, limit: int, buckets: int) -> dict:
    """The run's prompts as its own observations saw them."""
    q = select(PromptObservation.prompt_id, PromptObservation.dataset_key, PromptObservation.version,
               PromptObservation.drawn, PromptObservation.successes, PromptObservation.signal,
               PromptObservation.reward_mean).where(PromptObservation.run_id == run_id) \
        .order_by(PromptObservation.time, PromptObservation.group_id)
    obs = [dict(r._mapping) for r in s.execute(q)]
    totals = list(fold(obs, run_id, 0.0).values())
    released = s.scalar(select(func.count(func.distinct(Ledger.prompt_id))).where(Ledger.run_id == run_id)) or 0
    return {"run": run_id, "prompts_released": released, "prompts_observed": len(totals),
            "groups_observed": len(obs), "groups_with_signal": sum(1 for o in obs if o["signal"]),
            "samples_drawn": sum(o["drawn"] for o in obs), "successes": sum(o["successes"] for o in obs),
            "classes": class_counts(totals, unseen=max(0, released - len(totals))),
            "histogram": solve_rate_histogram(m["solve_rate"] for m in totals if m["sampled"] > 0),
            "by_version": version_buckets(obs, buckets), "filtered": filtered_reasons(s, run_id),
            "top": [_prompt_row(m) for m in top(totals, limit)]}


def dataset_stats(s: Session, d: Dataset, limit: int) -> dict:
    """One dataset's prompts as the memory of every run on it holds them."""
    key = d.content_hash[:12]
    mem = list(s.scalars(select(PromptMemory).where(PromptMemory.dataset_key == key)))
    totals = [dict(prompt_id=m.prompt_id, sampled=m.sampled, successes=m.successes, last_signal=m.last_signal)
              for m in mem]
    runs = s.execute(select(PromptObservation.run_id, func.count(), func.sum(PromptObservation.drawn))
                     .where(PromptObservation.dataset_key == key).group_by(PromptObservation.run_id)
                     .order_by(PromptObservation.run_id)).all()
    best = sorted(mem, key=lambda m: (-m.sampled, m.prompt_id))[:limit]
    return {"dataset": d.id, "content_hash": d.content_hash, "num_rows": d.num_rows, "prompts_observed": len(mem),
            "samples_drawn": sum(m.sampled for m in mem), "groups_observed": sum(m.groups for m in mem),
            "groups_with_signal": sum(m.signal_groups for m in mem),
            "classes": class_counts(totals, unseen=max(0, d.num_rows - len(mem))),
            "histogram": solve_rate_histogram(m.solve_rate for m in mem if m.sampled > 0),
            "runs": [{"run": r, "groups": n, "samples_drawn": int(k or 0)} for r, n, k in runs],
            "top": [memory_dict(m) for m in best]}
