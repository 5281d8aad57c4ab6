"""What the framework examples share: the episode's task and the calculator tool, as plain Python.

The task is the calculator example's (examples/agents/calculator): "What is A * B?" for two 3-digit numbers,
given by the rollout worker as one line of JSON on stdin (`prompt`, `reference`, ...). The agent prints its
answer and exits; it does not score itself: the reward service (`reward.task: addition`) scores the content
of the episode's last completion against `reference`. Nothing here knows jetrl's endpoint: each example
reaches it only through the base URL and key the worker puts in its environment (OPENAI_BASE_URL,
OPENAI_API_KEY).
"""

from __future__ import annotations

import json
import sys

from rollout_service.tools.base import ToolError
from rollout_service.tools.calculator import evaluate

INSTRUCTIONS = ("You are a helpful assistant with a calculator. Call the calculator tool to work out the "
                "product, then answer with the number only.")
MODEL = "policy"  # any name: the endpoint serves the policy under training whatever the agent asks for
MAX_TURNS = 3  # model calls an episode may take before the agent gives up (the answer is then wrong)
DESCRIPTION = "Evaluate an arithmetic expression, e.g. (3 + 4) * 2."


def read_task() -> dict:
    """The episode's task: the prompt task's payload as JSON on stdin."""
    return json.loads(sys.stdin.readline())


def calculate(expression: str) -> str:
    """The calculator tool's reply: the value, or an error the model can read."""
    try:
        value = evaluate(str(expression))
    except ToolError as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


def gave_up(framework: str, exc: BaseException) -> None:
    """The model did not finish the task within the framework's limits (too many turns, output the framework
    cannot parse): a wrong answer, not a broken agent, so the episode ends normally and scores 0. Errors of
    the endpoint (HTTP 4xx/5xx) are not caught anywhere: they fail the episode."""
    print(f"{framework}: the model gave no answer: {type(exc).__name__}: {exc}"[:500], file=sys.stderr)
