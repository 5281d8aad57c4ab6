"""Adaptive sampling: keep sampling a prompt whose group has no reward spread (rollout.adaptive).

GRPO learns only from groups whose rewards differ; where the policy rarely succeeds, almost every group
of `group_size` is all failures and trains on nothing. With `rollout.adaptive.max_samples` = M the worker
draws the prompt's group as usual, and while every draw so far has the same reward and fewer than M were
drawn, draws another round (`round_size`, default group_size). Then:

- the draws have a spread: the group sent to the trainer keeps `group_size` of them, a balanced subset
  (as many above the mean of all draws as below, as far as the draws allow; the rest chosen uniformly at
  random within each side), and carries the mean and std of *all* draws as its advantage baseline
  (TrajectoryGroup.adaptive). This is Reinforce-Ada's balanced variant (Xiong et al. 2025, "Reinforce-Ada:
  An Adaptive Sampling Framework for Reinforce-Style LLM Training", arXiv 2510.04996: fixed-size groups with
  enforced reward diversity, baselines from the statistics of the whole adaptive phase).
- with `weights: inclusion` each kept sample also carries a weight, the inverse of its chance
  to be kept, scaled to the group: w = (g / n) * (n_side / k_side) for g kept of n drawn, k_side kept of the
  n_side draws on its side of the mean. The trainer multiplies the sample's advantage by it. Then
  E[sum over kept of w_i * A_i * grad log pi_i] = (g / n) * sum over all draws of A_i * grad log pi_i:
  the kept group's policy gradient is an unbiased (Horvitz-Thompson) estimate of the gradient the whole
  set of draws would give, scaled to g samples, with its true mean as baseline. `weights: draws` (the default) leaves
  out g / n: w = n_side / k_side, an unbiased estimate of the gradient of training on all n draws, weighing
  as n samples (a lone success in 64 draws keeps its whole advantage instead of g / n of it). (`weights:
  none` is the published estimator, which over-weights the rare side.) Hand-computed in
  tests/rollout/test_adaptive.py.
- `stop: yield` (the default) also stops a prompt early when another round of it is not worth a fresh
  prompt: the worker keeps, over its recent prompts, how often each round found the first spread (round 1:
  a fresh prompt's group; round k: a prompt that had none in k - 1 rounds), per draw. Before each extra
  round it draws a plausible rate for that round and for round 1 from their Beta posteriors (Thompson
  sampling, so a round whose record is short or stale still gets tried) and draws the round only if its
  rate per draw is at least round 1's. Where the prompts that fail a round are mostly prompts the policy
  never solves, the budget goes to fresh prompts instead; where they are as likely to yield as fresh ones,
  it keeps sampling them. `stop: spread` always samples up to M.
- no spread after M draws (or stopped early): the first group_size draws go out with `signal: false`; the trainer records the
  group as filtered, "no signal after M samples" (the ledger keeps the reason), and trains nothing on it.

Every draw is generated and scored like any other (same engine, versions and staleness); the extra draws
count in `adaptive.drawn`, the rollout metrics and the controller's prompt memory.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from shared.config.rollout import AdaptiveConfig
from shared.contract.messages import Sample


def has_spread(rewards: Sequence[float], eps: float = 1e-6) -> bool:
    """Whether the rewards differ by more than eps (a group with a nonzero advantage)."""
    return bool(rewards) and max(rewards) - min(rewards) > eps


def reward_stats(rewards: Sequence[float]) -> tuple[float, float]:
    """(mean, population std) of the rewards: the GRPO baseline and scale over every draw."""
    n = len(rewards)
    mean = sum(rewards) / n
    return mean, math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)


def balanced_subset(rewards: Sequence[float], size: int, rng: random.Random, weights: str = "draws",
                    eps: float = 1e-6) -> list[tuple[int, float]]:
    """(index, weight) of `size` draws kept from `rewards`, in draw order. Sides: above the mean of all
    draws, and at or below it; the upper side gets half of `size` (at least one), the lower the rest, each
    side giving what it has and the other making up the difference; uniform within a side. weight =
    (size / n) * (n_side / k_side) for `inclusion`, n_side / k_side for `draws`, 1.0 for `none` (see the
    module docstring)."""
    n = len(rewards)
    if size >= n:
        return [(i, 1.0) for i in range(n)]
    mean = sum(rewards) / n
    high = [i for i, r in enumerate(rewards) if r > mean + eps]
    low = [i for i, r in enumerate(rewards) if r <= mean + eps]
    k_high = min(len(high), max(1, size // 2)) if high else 0
    k_low = min(len(low), size - k_high)
    k_high = min(len(high), size - k_low)
    out: list[tuple[int, float]] = []
    for side, k in ((high, k_high), (low, k_low)):
        if k == 0:
            continue
        w = {"inclusion": (size / n) * (len(side) / k), "draws": len(side) / k}.get(weights, 1.0)
        out += [(i, w) for i in rng.sample(side, k)]
    return sorted(out)


class RoundYield:
    """A worker's record of how often each round found a prompt's first spread, over its last `window`
    prompts that reached the round; `worth(k)` decides whether round k (k >= 2) is drawn (`stop: yield`)."""

    def __init__(self, window: int = 256):
        self.window = window
        self.outcomes: dict[int, deque] = {}  # round -> (found a spread, draws in the round)

    def record(self, round_index: int, draws: int, found: bool) -> None:
        self.outcomes.setdefault(round_index, deque(maxlen=self.window)).append((found, draws))

    def rate(self, round_index: int, rng: random.Random) -> float:
        """A draw from the Beta(found + 1, missed + 1) posterior of the round's chance to find a spread,
        divided by its mean draws: a plausible spread-per-draw rate."""
        seen = self.outcomes.get(round_index, ())
        found = sum(1 for f, _ in seen if f)
        draws = sum(d for _, d in seen) / len(seen) if seen else 1.0
        return rng.betavariate(found + 1, len(seen) - found + 1) / draws

    def worth(self, round_index: int, rng: random.Random) -> bool:
        return self.rate(round_index, rng) >= self.rate(1, rng)


@dataclass
class Drawn:
    """What adaptive sampling produced for one prompt: the group to send and the account of every draw."""

    samples: list[Sample]
    drawn: int
    rounds: int
    successes: int
    mean: float
    std: float
    signal: bool

    def account(self) -> dict:
        """TrajectoryGroup.adaptive."""
        return {"drawn": self.drawn, "rounds": self.rounds, "successes": self.successes, "mean": self.mean,
                "std": self.std, "signal": self.signal}


async def sample_adaptively(draw: Callable[[int, int], Awaitable[list[Sample]]], group_size: int,
                            cfg: AdaptiveConfig, rng: random.Random, record: RoundYield | None = None) -> Drawn:
    """Draw rounds with `draw(count, offset)` (offset = samples drawn before it: seeds and indices shift by
    it) until the rewards have a spread or cfg.max_samples were drawn, or (cfg.stop == "yield", with the
    worker's `record`) another round is not worth a fresh prompt; then form the group (module docstring)."""
    budget = max(cfg.max_samples, group_size)
    step = cfg.round_size or group_size
    pool: list[Sample] = list(await draw(group_size, 0))
    rounds = 1
    found = has_spread([s.reward for s in pool], cfg.eps)
    if record is not None:
        record.record(1, len(pool), found)
    while not found and len(pool) < budget:
        if record is not None and cfg.stop == "yield" and not record.worth(rounds + 1, rng):
            break
        more = await draw(min(step, budget - len(pool)), len(pool))
        pool += more
        rounds += 1
        found = has_spread([s.reward for s in pool], cfg.eps)
        if record is not None:
            record.record(rounds, len(more), found)
    rewards = [s.reward for s in pool]
    mean, std = reward_stats(rewards)
    signal = found
    if signal:
        kept = [replace(pool[i], weight=w) for i, w in balanced_subset(rewards, group_size, rng, cfg.weights, cfg.eps)]
    else:
        kept = pool[:group_size]
    return Drawn(samples=kept, drawn=len(pool), rounds=rounds,
                 successes=sum(r >= cfg.success_reward for r in rewards), mean=mean, std=std, signal=signal)
