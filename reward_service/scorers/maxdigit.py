"""The demo task: prompt "max 3 8 1 5 2 =", reference "8" (the largest digit).

Reward 1.0 when the completion, after stripping leading whitespace, starts with the reference digit.
"""

from __future__ import annotations

from typing import Any

from reward_service.scorers import Score


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    if isinstance(reference, int) and not isinstance(reference, bool):
        reference = str(reference)
    if not isinstance(reference, str) or len(reference) != 1 or not reference.isdigit():
        raise ValueError(f"reference must be one digit such as '8', got {reference!r}")
    return Score(1.0 if completion.lstrip().startswith(reference) else 0.0)
