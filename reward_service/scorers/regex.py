"""Regex match: reward 1.0 when the reference pattern matches the completion.

reference: a pattern string (searched anywhere, `re.search`), or a map
`{"pattern": str, "mode": "search" | "match" | "fullmatch", "flags": "imsx"}`.
A pattern can backtrack for ever; the service runs this scorer in its killable process pool.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from reward_service.scorers import Score

_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


@lru_cache(maxsize=256)
def _compile(pattern: str, flags: str) -> re.Pattern:
    value = 0
    for f in flags:
        if f not in _FLAGS:
            raise ValueError(f"unknown regex flag {f!r} (use any of {''.join(_FLAGS)})")
        value |= _FLAGS[f]
    try:
        return re.compile(pattern, value)
    except re.error as exc:
        raise ValueError(f"reference pattern {pattern[:80]!r} is not a valid regex: {exc}") from None


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    mode, flags = "search", ""
    if isinstance(reference, dict):
        pattern = reference.get("pattern")
        mode = reference.get("mode", "search")
        flags = reference.get("flags", "")
        if mode not in ("search", "match", "fullmatch") or not isinstance(flags, str):
            raise ValueError("reference.mode must be search, match or fullmatch and reference.flags a string")
    else:
        pattern = reference
    if not isinstance(pattern, str):
        raise ValueError(f"reference pattern must be a string, got {type(pattern).__name__}")
    m = getattr(_compile(pattern, flags), mode)(completion)
    return Score(1.0 if m else 0.0, {"match": m.group(0)[:200]} if m else {})
