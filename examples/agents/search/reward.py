"""The search agent's reward: 1 when the final answer names the right country, else 0.

The answer is what follows the last "Answer:" in the agent's final message (case and surrounding
punctuation ignored); a final message without one scores 0, as does an episode that ran out of turns
while still searching. Also usable by the reward service as a custom scorer
(`reward.scorer: examples.agents.search.reward:score`, run from the repository root).
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    found = _ANSWER.findall(text or "")
    if not found:
        return None
    return found[-1].strip().strip(" .!\"'*").strip()


def score_answer(text: str, reference: str) -> tuple[float, dict]:
    answer = extract_answer(text)
    if answer is None:
        return 0.0, {"answered": 0}
    return (1.0 if answer.lower() == str(reference).lower() else 0.0), {"answered": 1}


def score(completion: str, reference, payload: dict | None = None) -> tuple[float, dict]:
    """Reward-service scorer signature."""
    return score_answer(completion, reference)
