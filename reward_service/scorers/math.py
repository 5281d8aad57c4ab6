"""Math answers by equivalence, with the math-verify package (LaTeX and expression equivalence).

The reference is parsed as gold (a bare answer is wrapped in $...$), the completion as the prediction
(math-verify finds \\boxed{}, "the answer is", or the last expression), and `verify` checks
equivalence with sympy. math-verify's own time limit uses SIGALRM, which only works in a main
thread: the service runs this scorer in its process pool, where each job runs in a main thread and a
worker that overruns is killed.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from reward_service.scorers import Score, ScorerError

# math-verify's own limit (whole seconds): a backstop one second past the engine's, which in the
# process pool kills the worker first and reports the timeout as an error.
TIMEOUT_S = 6


def configure(cfg: Any) -> None:
    global TIMEOUT_S
    try:
        import math_verify  # noqa: F401
    except ImportError:
        raise ScorerError("the math task needs the math-verify package: pip install 'jetrl[math]'") from None
    TIMEOUT_S = math.ceil(cfg.scorer_timeout_s) + 1


def _gold_text(reference: Any) -> str:
    if isinstance(reference, bool) or not isinstance(reference, (str, int, float)):
        raise ValueError(f"reference must be a string or number, got {type(reference).__name__}")
    text = str(reference).strip()
    if not text:
        raise ValueError("reference is empty")
    if "$" in text or "\\(" in text or "\\[" in text or "\\boxed" in text:
        return text
    return f"${text}$"


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    from math_verify import parse, verify

    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(_gold_text(reference), parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math-verify could not parse the reference {str(reference)[:80]!r}")
    pred = parse(completion, parsing_timeout=timeout)
    if not pred:
        return Score(0.0, {"parsed": False})
    ok = verify(gold, pred, timeout_seconds=timeout)
    return Score(1.0 if ok else 0.0, {"parsed": True})


def warmup() -> None:
    """Called by each pool worker before it takes jobs: math-verify's first call imports and builds a lot."""
    score("$\\boxed{\\frac{1}{2}}$", "0.5")
