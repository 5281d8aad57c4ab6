"""Per-sample advantages from the rewards of each group (docs/algorithms.md, "Advantages").

Pure functions over Python lists of rewards; one list per group (groups may differ in size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ESTIMATORS = ("grpo", "grpo_nostd", "rloo", "reinforce")


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def grpo(rewards: Sequence[float], eps: float = 1e-6, std_normalise: bool = True) -> list[float]:
    """GRPO (DeepSeekMath): (r_i - mean(r)) / (std(r) + eps), population std; Dr. GRPO drops the std."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mu = _mean(rewards)
    centred = [r - mu for r in rewards]
    if not std_normalise:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(rewards))
    return [c / (std + eps) for c in centred]


def rloo(rewards: Sequence[float]) -> list[float]:
    """RLOO (Ahmadian et al. 2024): r_i - mean of the other n-1 rewards = n/(n-1) (r_i - mean)."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


@dataclass(frozen=True)
class DrawStats:
    """Every draw of an adaptively sampled prompt (rollout_service/adaptive.py): n draws, their mean and
    population std. The group holds fewer samples than it stands for."""

    n: int
    mean: float
    std: float


def from_draws(rewards: Sequence[float], d: DrawStats, estimator: str, eps: float = 1e-6) -> list[float]:
    """Advantages of a group's kept samples against the statistics of all n draws: grpo (r - mean) / (std +
    eps), grpo_nostd r - mean, rloo r - (n mean - r) / (n - 1) (leave-one-out over every draw)."""
    if d.n < 2:
        return [0.0] * len(rewards)
    if estimator == "grpo":
        return [(r - d.mean) / (d.std + eps) for r in rewards]
    if estimator == "grpo_nostd":
        return [r - d.mean for r in rewards]
    if estimator == "rloo":
        return [r - (d.n * d.mean - r) / (d.n - 1) for r in rewards]
    raise ValueError(f"from_draws: {estimator!r} is not a group-relative estimator")


def group_advantages(groups: Sequence[Sequence[float]], estimator: str = "grpo", eps: float = 1e-6,
                     draws: Sequence[DrawStats | None] | None = None,
                     weights: Sequence[Sequence[float]] | None = None) -> list[list[float]]:
    """Advantages for every sample of every group. `reinforce` uses the mean reward of the whole batch
    as the baseline (REINFORCE with a batch baseline; a group with `draws` counts with its draws' mean);
    the others are group-relative, against `draws[i]` where given (adaptive sampling) instead of the group's
    own rewards. `weights[i][j]` multiplies sample j's advantage (adaptive sampling's inclusion weights)."""
    draws = list(draws) if draws is not None else [None] * len(groups)
    if estimator == "reinforce":
        flat = [r if d is None else d.mean for g, d in zip(groups, draws, strict=True) for r in g]
        baseline = _mean(flat) if flat else 0.0
        out = [[r - baseline for r in g] for g in groups]
    elif estimator in ("grpo", "grpo_nostd", "rloo"):
        out = []
        for g, d in zip(groups, draws, strict=True):
            if d is not None:
                out.append(from_draws(g, d, estimator, eps))
            elif estimator == "rloo":
                out.append(rloo(g))
            else:
                out.append(grpo(g, eps, std_normalise=estimator == "grpo"))
    else:
        raise ValueError(f"trainer.algorithm.adv_estimator: unknown estimator {estimator!r}; use one of {ESTIMATORS}")
    if weights is not None:
        out = [[a * w for a, w in zip(adv, ws, strict=True)] for adv, ws in zip(out, weights, strict=True)]
    return out
