"""The tool-calling variant of examples/verifiers_env: a `vf.ToolEnv` whose one tool is the Python function
`add`. `vf.load_environment("examples.verifiers_env.tools")` builds it.

The question is "What is A + B? Call the add tool, then answer with only the number." for 4-digit A and B;
the model may call `add(a, b)` (verifiers runs the function and returns its result as a tool message)
and ends the episode by answering without a tool call, within `max_turns` model turns. The reward is the
single-turn environment's: 1.0 when the first integer of the last assistant message is A + B.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

from examples.verifiers_env import addition_rows, correct_answer, first_integer

SYSTEM_PROMPT = "Add numbers with the add tool, then reply with the result only."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def load_environment(
    num_train: int = 200,
    num_eval: int = 50,
    low: int = 1000,
    high: int = 9999,
    seed: int = 0,
    max_turns: int = 3,
) -> vf.Environment:
    train, held = addition_rows(
        num_train,
        num_eval,
        low,
        high,
        seed,
        "What is {a} + {b}? Call the add tool, then answer with only the number.",
    )
    parser = vf.Parser(extract_fn=first_integer)
    return vf.ToolEnv(
        tools=[add],
        max_turns=max_turns,
        dataset=Dataset.from_list(train),
        eval_dataset=Dataset.from_list(held),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=vf.Rubric(funcs=[correct_answer], parser=parser),
    )
