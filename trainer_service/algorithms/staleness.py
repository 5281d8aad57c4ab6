"""Which samples may be trained: the staleness bound and DAPO's dynamic filter (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.contract.messages import Sample


def staleness(current_version: int, sample: Sample) -> int:
    """Trainer version now minus the oldest policy version among the sample's generated tokens.

    A sample without generated tokens has staleness 0 (it carries no gradient anyway)."""
    oldest = sample.oldest_version()
    return 0 if oldest < 0 else current_version - oldest


def is_fresh(current_version: int, sample: Sample, max_staleness: int) -> bool:
    """True when the sample may be trained: staleness <= max_staleness (the bound itself is allowed)."""
    return staleness(current_version, sample) <= max_staleness


def urgency_order(groups: Sequence[Sequence[Sample]]) -> list[int]:
    """Indexes of `groups` (each a list of samples), the group whose oldest generated token is oldest
    first, ties in the given (arrival) order. Training the nearest-to-stale groups first drops fewer:
    groups arrive in completion order, so a long-tail group released early lands behind groups released
    after it and, trained in arrival order, can outlive the bound. Groups without generated tokens first."""
    def oldest(samples: Sequence[Sample]) -> int:
        return min((s.oldest_version() for s in samples), default=-1)

    return sorted(range(len(groups)), key=lambda i: oldest(groups[i]))


def rewards_all_equal(rewards: Sequence[float], eps: float = 1e-6) -> bool:
    """DAPO dynamic sampling: a group whose rewards are all equal has zero group-relative advantage."""
    return len(rewards) > 0 and max(rewards) - min(rewards) <= eps
