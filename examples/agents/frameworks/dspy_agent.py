"""The calculator task with DSPy's ReAct module, as its docs write a tool-using program.

    command: python examples/agents/frameworks/dspy_agent.py

dspy.LM("openai/<model>", api_base=..., api_key=...) talks chat completions (through LiteLLM). DSPy's
ChatAdapter asks for `[[ ## field ## ]]` sections in plain text; when the model's reply does not parse it
retries once with its JSONAdapter (`response_format` json_schema / json_object). The cache is off: every
call must reach the policy under training (DSPy caches identical requests by default).
"""

from __future__ import annotations

import os

import dspy
from calc import MAX_TURNS, MODEL, calculate, gave_up, read_task
from dspy.utils.exceptions import AdapterParseError


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. (3 + 4) * 2."""
    return calculate(expression)


def main() -> None:
    task = read_task()
    lm = dspy.LM(f"openai/{MODEL}", api_base=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
                 cache=False, num_retries=0)
    dspy.configure(lm=lm)
    react = dspy.ReAct("question -> answer", tools=[calculator], max_iters=MAX_TURNS)
    try:
        print(react(question=task["prompt"]).answer)
    except AdapterParseError as exc:
        gave_up("dspy", exc)


if __name__ == "__main__":
    main()
