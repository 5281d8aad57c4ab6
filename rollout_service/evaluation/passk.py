"""The evaluation's maths as pure functions: unbiased pass@k, and the summary (mean reward, pass@1,
pass@k) of per-prompt sample rewards."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `c` solved out of `n` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    version: int
    reward: float  # mean reward over every sample of every prompt
    pass_at_1: float
    pass_at_k: float
    k: int
    n: int  # prompts
    dataset: str = ""
    errors: int = 0  # samples whose scoring failed (they count as reward 0)
    seconds: float = 0.0
    # agent workflows: the share of episodes with at least one tool call, model calls and tool calls per episode
    tool_call_rate: float | None = None
    calls_per_episode: float | None = None
    tool_calls_per_episode: float | None = None
    per_prompt: list[list[float]] = field(default_factory=list, repr=False)
    completions: list[list[str]] = field(default_factory=list, repr=False)  # the decoded samples, per prompt

    def event_data(self) -> dict:
        d = asdict(self)
        d.pop("per_prompt")
        d.pop("completions")
        return d

    def line(self) -> str:
        agent = ("" if self.tool_call_rate is None else
                 f", tool calls in {self.tool_call_rate:.3f} of episodes, {self.calls_per_episode:.2f} model calls and "
                 f"{self.tool_calls_per_episode:.2f} tool calls each")
        return (f"version {self.version}: reward {self.reward:.3f}, pass@1 {self.pass_at_1:.3f}, "
                f"pass@{self.k} {self.pass_at_k:.3f} on {self.n} prompts ({self.errors} scoring errors, "
                f"{self.seconds:.1f} s){agent}")


def summarise(version: int, per_prompt: list[list[float]], success: float, errors: int = 0,
              dataset: str = "", seconds: float = 0.0) -> EvalResult:
    """Mean reward and pass@1 / pass@k (k = samples per prompt) of per-prompt sample rewards."""
    if not per_prompt:
        raise ValueError("summarise: no prompts")
    k = len(per_prompt[0])
    if k == 0 or any(len(r) != k for r in per_prompt):
        raise ValueError("summarise: every prompt needs the same, non-zero number of samples")
    solved = [sum(1 for x in r if x >= success) for r in per_prompt]
    n = len(per_prompt)
    return EvalResult(
        version=version,
        reward=sum(sum(r) for r in per_prompt) / (n * k),
        pass_at_1=sum(pass_at_k(k, c, 1) for c in solved) / n,
        pass_at_k=sum(pass_at_k(k, c, k) for c in solved) / n,
        k=k, n=n, dataset=dataset, errors=errors, seconds=seconds, per_prompt=per_prompt,
    )
