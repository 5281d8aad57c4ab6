"""The subtraction task: "What is A - B? Answer with only the number." for 0 <= B <= A <= 99, on a real
pretrained chat model (examples/sparse_smollm2.yaml; docs/reward.md, "The subtraction task"). Chosen as a
task where SmolLM2-135M-Instruct succeeds rarely rather than never: greedy held-out accuracy a few percent,
each prompt solved now and then when sampled (bench/sparse_task_probe.py measures both).

The split is fixed by code: all 5,050 pairs (A, B) with B <= A, A outer and B inner (`(0, 0), (1, 0), (1, 1),
..., (99, 99)`), shuffled with `random.Random(0).shuffle`; the first 200 are the held-out set, the next
2,000 the training prompts, the rest unused. The reference is A - B as a string; the scorer is the
addition task's (reward_service/scorers/addition.py: 1.0 when the first integer in the completion equals it).

    python examples/subtraction/data.py --out examples/data/subtraction     # writes train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import random

from shared.io.jsonl import write_split

LIMIT = 100  # 0 <= B <= A <= LIMIT-1
HELDOUT = 200
TRAIN = 2000
SEED = 0
QUESTION = "What is {a} - {b}? Answer with only the number."


def shuffled_pairs(seed: int = SEED) -> list[tuple[int, int]]:
    """All (A, B) with 0 <= B <= A <= 99, in the documented order, shuffled with random.Random(seed)."""
    pairs = [(a, b) for a in range(LIMIT) for b in range(a + 1)]
    random.Random(seed).shuffle(pairs)
    return pairs


def row(a: int, b: int) -> dict:
    return {"prompt": QUESTION.format(a=a, b=b), "reference": str(a - b)}


def split(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): the 200 first shuffled pairs are held out, the next 2,000 train."""
    pairs = shuffled_pairs(seed)
    return [row(a, b) for a, b in pairs[HELDOUT:HELDOUT + TRAIN]], [row(a, b) for a, b in pairs[:HELDOUT]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write the subtraction task's train.jsonl and heldout.jsonl.")
    p.add_argument("--out", default="examples/data/subtraction", help="Output directory.")
    args = p.parse_args(argv)
    for name, path in write_split(args.out, *split()).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
