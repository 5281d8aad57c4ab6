"""The collapse guard (trainer.guard): a step's statistics against the recent history of the run.

Pure: `Guard.observe(step, stats)` takes one step's statistics (the trainer's "step" event fields: entropy,
capped_frac, clip_frac, grad_norm, reward_mean) and returns None, or a trip: {"step", "since_step",
"reasons", "evidence"} once some check has failed `consecutive` steps in a row. The checks
(GuardConfig documents each threshold):

- entropy below `entropy_ratio` x its median over the window (a policy collapsing onto one answer);
- capped_frac above `max_capped_frac` (behaviour importance weights capped or masked: the policy has
  moved too far from the one that generated its data);
- clip_frac above `max_clip_frac`;
- grad_norm above `grad_norm_ratio` x its median;
- reward_mean more than `reward_drop` below its median.

The history holds only steps that passed every check, so a collapse does not become the baseline it is
judged against. No check runs before `min_history` good steps.
"""

from __future__ import annotations

import statistics
from collections import deque

from shared.config.trainer import GuardConfig


def _num(stats: dict, key: str) -> float | None:
    v = stats.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def failures(cfg: GuardConfig, history: list[dict], stats: dict) -> dict[str, dict]:
    """{check name: {"value", "limit"}} of the checks `stats` fails against `history` (good steps)."""
    out: dict[str, dict] = {}
    if len(history) < cfg.min_history:
        return out

    def median(key: str) -> float | None:
        xs = [x for x in (_num(h, key) for h in history) if x is not None]
        return statistics.median(xs) if xs else None

    ent, med = _num(stats, "entropy"), median("entropy")
    if cfg.entropy_ratio > 0 and ent is not None and med is not None and med > 0 and ent < cfg.entropy_ratio * med:
        out["entropy"] = {"value": ent, "limit": cfg.entropy_ratio * med, "median": med}
    capped = _num(stats, "capped_frac")
    if cfg.max_capped_frac < 1 and capped is not None and capped > cfg.max_capped_frac:
        out["capped_frac"] = {"value": capped, "limit": cfg.max_capped_frac}
    clip = _num(stats, "clip_frac")
    if cfg.max_clip_frac < 1 and clip is not None and clip > cfg.max_clip_frac:
        out["clip_frac"] = {"value": clip, "limit": cfg.max_clip_frac}
    gn, med = _num(stats, "grad_norm"), median("grad_norm")
    if cfg.grad_norm_ratio > 0 and gn is not None and med is not None and med > 0 and gn > cfg.grad_norm_ratio * med:
        out["grad_norm"] = {"value": gn, "limit": cfg.grad_norm_ratio * med, "median": med}
    r, med = _num(stats, "reward_mean"), median("reward_mean")
    if cfg.reward_drop > 0 and r is not None and med is not None and r < med - cfg.reward_drop:
        out["reward_mean"] = {"value": r, "limit": med - cfg.reward_drop, "median": med}
    return out


class Guard:
    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.history: deque[dict] = deque(maxlen=cfg.window)
        self.streak: list[tuple[int, dict]] = []  # (step, its failures) of the current failing streak

    def observe(self, step: int, stats: dict) -> dict | None:
        failed = failures(self.cfg, list(self.history), stats)
        if not failed:
            self.history.append(stats)
            self.streak = []
            return None
        self.streak.append((step, failed))
        if len(self.streak) < self.cfg.consecutive:
            return None
        trip = {"step": step, "since_step": self.streak[0][0], "reasons": sorted(failed),
                "evidence": {str(s): f for s, f in self.streak}}
        self.streak = []
        return trip

    def reset(self) -> None:
        """After a rollback: the streak is over; the good history stays the baseline."""
        self.streak = []
