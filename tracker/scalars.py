"""What the tracker logs, under stable names (docs/tracking.md has the table), from bus messages.

Pure functions and a small aggregator: `event_scalars` turns one Event into (version, {name: value});
`RolloutStats` aggregates trajectory groups per policy version (the newest version among a group's
generated tokens) and hands a version's figures over once a newer version's group arrives.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from shared.contract.messages import (
    JUDGE_METRIC_PREFIXES,
    ROLLOUT_STAGES,
    TRAINER_STAGES,
    Event,
    TrajectoryGroup,
)

# trainer "step" data key -> scalar name
STEP_KEYS = {
    "loss": "train/loss", "reward_mean": "train/reward_mean", "entropy": "train/entropy", "kl": "train/kl",
    "clip_frac": "train/clip_frac", "grad_norm": "train/grad_norm", "lr": "train/lr",
    "tokens_per_s": "train/tokens_per_s", "samples": "train/samples", "groups": "train/groups",
    "dropped_stale_samples": "train/dropped_stale_samples", "behav_weight_mean": "train/behav_weight_mean",
    "step_time_s": "train/step_time_s", "wall_s": "time/step_wall_s",
}
EVAL_KEYS = {"reward": "eval/reward", "pass_at_1": "eval/pass_at_1", "pass_at_k": "eval/pass_at_k"}
ROLLOUT_METRIC_KEYS = {"tokens_per_s": "rollout/tokens_per_s", "version_lag": "rollout/version_lag",
                       "in_flight": "rollout/in_flight"}


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def staleness_mean(hist: dict) -> float | None:
    n = sum(int(c) for c in hist.values())
    return sum(int(k) * int(c) for k, c in hist.items()) / n if n else None


def event_scalars(ev: Event) -> tuple[int, dict[str, float]] | None:
    """(version, scalars) of a trainer step, an eval or a rollout weight load; None for other events.
    Rollout "metrics" events are per worker: the sink sums them (`WorkerGauges`)."""
    d = ev.data if isinstance(ev.data, dict) else {}
    v = d.get("version")
    if not isinstance(v, int) or isinstance(v, bool):
        return None
    out: dict[str, float] = {}
    if ev.service == "trainer" and ev.kind == "step":
        out = {name: x for k, name in STEP_KEYS.items() if (x := _num(d.get(k))) is not None}
        # the LLM judge's criteria and win rates (their batch means: trainer_service/metrics.py)
        out.update({f"train/{k}": x for k, v in d.items()
                    if k.startswith(JUDGE_METRIC_PREFIXES) and (x := _num(v)) is not None})
        hist = d.get("staleness_hist")
        if isinstance(hist, dict) and (m := staleness_mean(hist)) is not None:
            out["train/staleness_mean"] = m
        for prefix, stages, key in (("time/trainer/", TRAINER_STAGES, "timings"),
                                    ("time/rollout/", ROLLOUT_STAGES, "rollout_timings")):
            t = d.get(key) if isinstance(d.get(key), dict) else {}
            out.update({prefix + k: x for k in stages if (x := _num(t.get(k))) is not None})
    elif ev.kind == "eval":
        out = {name: x for k, name in EVAL_KEYS.items() if (x := _num(d.get(k))) is not None}
    elif ev.service == "rollout" and ev.kind == "weights":
        out = {f"time/weights/{k}": x for k in ("fetch", "swap") if (x := _num(d.get(f"{k}_s"))) is not None}
    else:
        return None
    return (v, out) if out else None


class WorkerGauges:
    """The latest rollout "metrics" of each worker, summed (tokens/s, in flight) or maxed (version lag)."""

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, float]] = {}

    def update(self, ev: Event) -> dict[str, float]:
        d = ev.data if isinstance(ev.data, dict) else {}
        self.latest[ev.instance or "?"] = {k: x for k in ROLLOUT_METRIC_KEYS if (x := _num(d.get(k))) is not None}
        out: dict[str, float] = {}
        for k, name in ROLLOUT_METRIC_KEYS.items():
            vals = [w[k] for w in self.latest.values() if k in w]
            if vals:
                out[name] = max(vals) if k == "version_lag" else sum(vals)
        return out


class RolloutStats:
    """Trajectory groups aggregated per policy version: reward mean/std, response tokens, truncations."""

    def __init__(self) -> None:
        self._acc: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.newest = -1

    @staticmethod
    def group_version(g: TrajectoryGroup) -> int:
        vs = [int(s.versions[s.loss_mask.astype(bool)].max()) for s in g.samples if s.num_generated]
        return max(vs) if vs else -1

    def add(self, g: TrajectoryGroup) -> list[tuple[int, dict[str, float]]]:
        """Add a group; returns the versions now complete (older than the newest seen), with their scalars."""
        v = self.group_version(g)
        acc = self._acc[v]
        for s in g.samples:
            acc["reward"].append(float(s.reward))
            acc["response"].append(float(s.num_generated))
            acc["tool"].append(float(len(s.tokens) - s.prompt_len - s.num_generated))
            acc["truncated"].append(1.0 if s.finish_reason == "length" else 0.0)
        acc["groups"].append(1.0)
        self.newest = max(self.newest, v)
        return self.flush(before=self.newest)

    def flush(self, before: int | None = None) -> list[tuple[int, dict[str, float]]]:
        """Scalars of every version below `before` (None: all), oldest first; they are forgotten."""
        done = sorted(v for v in self._acc if before is None or v < before)
        out = []
        for v in done:
            a = self._acc.pop(v)
            r = np.asarray(a["reward"])
            out.append((v, {"rollouts/reward_mean": float(r.mean()), "rollouts/reward_std": float(r.std()),
                            "rollouts/response_tokens_mean": float(np.mean(a["response"])),
                            "rollouts/tool_tokens_mean": float(np.mean(a["tool"])),
                            "rollouts/truncated_frac": float(np.mean(a["truncated"])),
                            "rollouts/groups": float(len(a["groups"])), "rollouts/samples": float(len(r))}))
        return out
