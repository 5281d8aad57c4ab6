"""Scorers: plain functions `fn(completion: str, reference, payload: dict) -> float | (float, dict) | Score`.

A scorer scores ONE completion; the engine (reward_service/engine.py) runs it over a group, catches
its exceptions and enforces time limits. A scorer module may define `configure(reward_cfg)` (called
at start and in each pool worker) and `warmup()` (called in each pool worker before it takes jobs).
Built-in scorers are named by task; a custom scorer is named by import path
'package.module:function' (config `reward.scorer`). Each built-in declares where it runs best (`MODES`): `inline` in the event loop (cheap, linear-time pure Python), `thread` (waits on
a subprocess) or `process` (CPU-heavy: a killable process pool).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from shared.runtime.refs import load_ref

ScorerFn = Callable[[str, Any, dict], Any]


@dataclass
class Score:
    """The outcome of scoring one completion. `error` set means the scorer could not score it (reward 0)."""

    reward: float = 0.0
    metrics: dict = field(default_factory=dict)
    error: str | None = None


# task name -> import path of its scorer
BUILTIN: dict[str, str] = {
    "gsm8k": "reward_service.scorers.gsm8k:score",
    "math": "reward_service.scorers.math:score",
    "exact": "reward_service.scorers.exact:score",
    "regex": "reward_service.scorers.regex:score",
    "code": "reward_service.scorers.code:score",
    "maxdigit": "reward_service.scorers.maxdigit:score",
    "sort": "reward_service.scorers.sortdigits:score",
    "addition": "reward_service.scorers.addition:score",
    "subtraction": "reward_service.scorers.addition:score",  # the same rule: the first integer is the answer
    "reasoning_gym": "reward_service.scorers.reasoning_gym:score",
}

# Where each built-in runs when `reward.executor` is `auto`. Custom scorers run in threads.
MODES: dict[str, str] = {
    "gsm8k": "inline",
    "exact": "inline",
    "maxdigit": "inline",
    "sort": "inline",
    "addition": "inline",
    "subtraction": "inline",
    "regex": "process",  # a user pattern can backtrack for ever: only a process can be killed
    "math": "process",  # sympy is CPU-heavy and can hang; math-verify's own alarm works in a main thread
    "code": "thread",  # the sandbox is a subprocess with its own limits; the thread only waits on it
    "reasoning_gym": "process",  # third-party scorers of any cost (string distances, ...): a killable process
}


JUDGE = "judge"  # task (or reward.scorer) served by the LLM judge, reward_service/judge/


def is_judge(task: str, scorer: str = "") -> bool:
    """Whether `task` / `reward.scorer` name the LLM judge: task `judge` with no custom scorer, or scorer `judge`."""
    return scorer == JUDGE or (task == JUDGE and not scorer)


class GroupFailed(RuntimeError):
    """A group scorer could not score the group at all (the judge gave no answer): the request gets `error`."""


class ScorerError(ValueError):
    """A scorer name or import path that cannot be resolved."""


def scorer_ref(task: str, scorer: str = "") -> str:
    """Import path of the scorer serving `task`: the custom one if given, else the built-in."""
    if scorer:
        return scorer
    if task not in BUILTIN:
        raise ScorerError(
            f"reward task {task!r} has no built-in scorer (built-ins: {', '.join(sorted(BUILTIN))}); "
            "set reward.scorer to 'package.module:function'"
        )
    return BUILTIN[task]


_CACHE: dict[str, ScorerFn] = {}


def load_scorer(ref: str) -> ScorerFn:
    """Import 'package.module:function' and return the callable (cached)."""
    fn = _CACHE.get(ref)
    if fn is not None:
        return fn
    if ref in BUILTIN:
        ref = BUILTIN[ref]
    obj = load_ref(ref, error=ScorerError)
    if not callable(obj):
        raise ScorerError(f"scorer {ref!r} is a {type(obj).__name__}, not a callable")
    _CACHE[ref] = obj
    return obj


def to_score(value: Any) -> Score:
    """Normalise what a scorer returned: a number, (number, metrics) or a Score."""
    if isinstance(value, Score):
        out = value
    elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        out = Score(reward=value[0], metrics=value[1])
    else:
        out = Score(reward=value)
    if isinstance(out.reward, bool) or not isinstance(out.reward, (int, float)):
        return Score(0.0, {}, f"scorer returned {type(out.reward).__name__}, expected a number")
    reward = float(out.reward)
    if not isfinite(reward):
        return Score(0.0, out.metrics, f"scorer returned a non-finite reward ({reward})")
    return Score(reward, out.metrics if isinstance(out.metrics, dict) else {}, out.error)


def call_scorer(fn: ScorerFn, completion: str, reference: Any, payload: dict) -> Score:
    """Run a scorer on one completion; an exception becomes a Score with the error and reward 0."""
    try:
        return to_score(fn(completion, reference, payload))
    except Exception as exc:  # a scorer failure is a result, never a crash
        return Score(0.0, {}, f"{type(exc).__name__}: {exc}"[:2000])
