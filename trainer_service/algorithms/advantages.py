"""Per-sample advantages from the rewards of each group (docs/algorithms.md, "Advantages").

Pure functions over Python lists of rewards; one list per group (groups may differ in size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def group_advantages(groups: Sequence[Sequence[float]], estimator: str = "grpo", eps: float = 1e-6) -> list[list[float]]:
    """Advantages for every sample of every group. `reinforce` uses the mean reward of the whole batch
    as the baseline (REINFORCE with a batch baseline); the others are group-relative."""
    if estimator == "grpo":
        return [grpo(g, eps) for g in groups]
    if estimator == "grpo_nostd":
        return [grpo(g, eps, std_normalise=False) for g in groups]
    if estimator == "rloo":
        return [rloo(g) for g in groups]
    if estimator == "reinforce":
        flat = [r for g in groups for r in g]
        if not flat:
            return [[] for _ in groups]
        baseline = _mean(flat)
        return [[r - baseline for r in g] for g in groups]
    raise ValueError(f"trainer.algorithm.adv_estimator: unknown estimator {estimator!r}; use one of {ESTIMATORS}")
