"""The demo task `sort`: prompt "sort 3 8 1 5 2 0 =", reference "012358" (the digits in ascending order).

Partial credit: the reward is the fraction of the reference's positions the completion gets right,
comparing the completion (after leading whitespace) character by character with the reference; a
missing character counts as wrong, characters past the reference's length are ignored. A uniformly
random digit string scores 0.1 on average.
"""

from __future__ import annotations

from typing import Any

from reward_service.scorers import Score


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    if not isinstance(reference, str) or not reference or not reference.isdigit():
        raise ValueError(f"reference must be a non-empty string of digits such as '012358', got {reference!r}")
    answer = completion.lstrip()[: len(reference)]
    right = sum(a == b for a, b in zip(answer, reference, strict=False))
    return Score(right / len(reference), {"exact": float(answer == reference)})
