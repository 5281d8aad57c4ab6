"""The addition task: "What is A + B? Answer with only the number." for A, B in 0..49, on a real
pretrained chat model (examples/smollm2_addition.yaml; docs/workflows.md, "The addition task").

The split is fixed by code: all 2,500 pairs (A, B), A outer and B inner (`(0, 0), (0, 1), ..., (49, 49)`),
shuffled with `random.Random(0).shuffle`; the first 200 are the held-out set, the next 2,000 the
training prompts, the last 300 unused. Each row is one user message (the rollout's chat template adds
the model's default system prompt) and the reference is the sum as a string. The scorer is
reward_service/scorers/addition.py: reward 1.0 when the first integer in the completion equals A + B.

    python examples/addition/data.py --out examples/data/addition     # writes train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from shared.io.jsonl import write_split

LIMIT = 50  # A and B in 0..LIMIT-1
HELDOUT = 200
TRAIN = 2000
SEED = 0
QUESTION = "What is {a} + {b}? Answer with only the number."


def shuffled_pairs(seed: int = SEED) -> list[tuple[int, int]]:
    """All (A, B) with A, B in 0..49, in the documented order, shuffled with random.Random(seed)."""
    pairs = [(a, b) for a in range(LIMIT) for b in range(LIMIT)]
    random.Random(seed).shuffle(pairs)
    return pairs


def row(a: int, b: int) -> dict:
    return {"prompt": QUESTION.format(a=a, b=b), "reference": str(a + b)}


def split(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): the 200 first shuffled pairs are held out, the next 2,000 train."""
    pairs = shuffled_pairs(seed)
    heldout = [row(a, b) for a, b in pairs[:HELDOUT]]
    train = [row(a, b) for a, b in pairs[HELDOUT:HELDOUT + TRAIN]]
    return train, heldout


def write(out: str | Path, seed: int = SEED) -> dict[str, Path]:
    """Write train.jsonl and heldout.jsonl (one JSON object per line) under `out`; returns their paths."""
    return write_split(out, *split(seed))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write the addition task's train.jsonl and heldout.jsonl.")
    p.add_argument("--out", default="examples/data/addition", help="Output directory.")
    args = p.parse_args(argv)
    for name, path in write(args.out).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
