"""A small verifiers environment (the `verifiers` package's own classes, nothing jetrl-specific): addition of
numbers up to two digits, one turn. `vf.load_environment("examples.verifiers_env")` builds it; jetrl trains
it through rollout_service/environments/verifiers_env.py (examples/verifiers_smollm2.yaml).

The question is "What is A + B? Answer with only the number." for A and B in `low`..`high` (default 0..49),
the answer A + B as a string, and no system prompt (the model's chat template may add its own), as in
jetrl's own addition task (docs/reward.md), which SmolLM2-135M learns. Held-out pairs (the eval_dataset) and
training pairs are distinct, drawn with `random.Random(seed)`. The rubric's one reward function gives 1.0
when the first integer of the last assistant message (what the parser extracts) is the answer, else 0.0.
The datasets are built in code (`datasets.Dataset.from_list`): nothing is downloaded.
examples/verifiers_env/tools.py is the tool-calling variant.
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset


def first_integer(text: str) -> str:
    """The first integer in `text` ('' when there is none): what the parser extracts from a reply."""
    m = re.search(r"-?\d+", text or "")
    return m.group(0) if m else ""


def correct_answer(completion, answer, parser) -> float:
    """1.0 when the parsed final answer is the reference answer."""
    return 1.0 if parser.parse_answer(completion) == str(answer) else 0.0


def addition_rows(n_train: int, n_eval: int, low: int, high: int, seed: int, question: str):
    """(train rows, eval rows): distinct pairs (A, B) drawn with random.Random(seed), the eval rows first."""
    n, space = n_train + n_eval, (high - low + 1) ** 2
    if n > space:
        raise ValueError(
            f"A, B in {low}..{high} make {space} pairs, fewer than the {n_train} + {n_eval} asked for"
        )
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, b) not in seen:
            seen.add((a, b))
            rows.append(
                {"question": question.format(a=a, b=b), "answer": str(a + b), "info": {"a": a, "b": b}}
            )
    return rows[n_eval:], rows[:n_eval]


def load_environment(
    num_train: int = 200,
    num_eval: int = 50,
    low: int = 0,
    high: int = 49,
    seed: int = 0,
    system_prompt: str | None = None,
) -> vf.Environment:
    train, held = addition_rows(
        num_train, num_eval, low, high, seed, "What is {a} + {b}? Answer with only the number."
    )
    parser = vf.Parser(extract_fn=first_integer)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(train),
        eval_dataset=Dataset.from_list(held),
        system_prompt=system_prompt,
        parser=parser,
        rubric=vf.Rubric(funcs=[correct_answer], parser=parser),
    )
