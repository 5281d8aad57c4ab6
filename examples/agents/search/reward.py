"""The search agent's reward: 1 when the final answer names the right country; else partial credit for
the searches that found passages (episode_reward), or 0 for the answer alone (score_answer).

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


SEARCH_CREDIT = 0.1  # per search that found passages, for at most two: a wrong answer scores at most 0.2


def episode_reward(final: str, reference: str, searches_found: int) -> float:
    """1.0 for the right country; otherwise SEARCH_CREDIT for each search that found passages (up to two)."""
    right, _ = score_answer(final, reference)
    return 1.0 if right == 1.0 else SEARCH_CREDIT * min(searches_found, 2)


def score(completion: str, reference, payload: dict | None = None) -> tuple[float, dict]:
    """Reward-service scorer signature."""
    return score_answer(completion, reference)
