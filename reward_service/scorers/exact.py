"""Exact match: reward 1.0 when the completion equals the reference (or one of a list of references).

Both sides are stripped of ASCII whitespace only (space, \\t, \\n, \\r, \\f, \\v) so that every
implementation of the protocol (the Node.js example too) agrees byte for byte; no case folding or
unicode normalisation. The reference must be a string or a list of strings.
"""

from __future__ import annotations

from typing import Any

from reward_service.scorers import Score

WHITESPACE = " \t\n\r\f\v"


def references(reference: Any) -> list[str]:
    if isinstance(reference, str):
        return [reference]
    if isinstance(reference, list) and reference and all(isinstance(r, str) for r in reference):
        return reference
    raise ValueError(f"reference must be a string or a non-empty list of strings, got {type(reference).__name__}")


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    text = completion.strip(WHITESPACE)
    for ref in references(reference):
        if text == ref.strip(WHITESPACE):
            return Score(1.0)
    return Score(0.0)
