"""The addition task (examples/addition/data.py): reward 1.0 when the first integer in the completion
(regex `-?\\d+`) equals the reference sum, else 0.0. "12", " 12.", "The answer is 12" score 1 for 12;
"1 + 11 = 12" scores 0 (its first integer is 1)."""

from __future__ import annotations

import re
from typing import Any

from reward_service.scorers import Score

_INT = re.compile(r"-?\d+")


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    if isinstance(reference, bool) or not isinstance(reference, (int, str)):
        raise ValueError(f"reference must be an integer or its decimal string such as '57', got {reference!r}")
    try:
        want = int(reference)
    except ValueError:
        raise ValueError(f"reference must be an integer or its decimal string such as '57', got {reference!r}") from None
    m = _INT.search(completion)
    return Score(1.0 if m is not None and int(m.group()) == want else 0.0, {"answered": float(m is not None)})
