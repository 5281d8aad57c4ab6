"""The two-step agent's data: "What is A * B + C?" for 3-digit A, B and C, reference A*B+C as a string.

2,100 distinct triples drawn with `random.Random(0)` (each uniform in 100..999, in draw order); the first
100 are the held-out set, the next 2,000 the training prompts. `operands` [A, B, C] lets the agent give
credit for each right tool call (the dataset puts it in the task's `metadata`). Generated, so no licence applies.

    python examples/agents/chain/data.py --out examples/data/chain   # train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from shared.io.jsonl import write_split

HELDOUT, TRAIN, SEED = 100, 2000, 0


def triples(n: int, seed: int = SEED) -> list[tuple[int, int, int]]:
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        t = (rng.randint(100, 999), rng.randint(100, 999), rng.randint(100, 999))
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def split(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows)."""
    rows = [{"prompt": f"What is {a} * {b} + {c}?", "reference": str(a * b + c), "operands": [a, b, c]}
            for a, b, c in triples(HELDOUT + TRAIN, seed)]
    return rows[HELDOUT:], rows[:HELDOUT]


def write(out: str | Path, seed: int = SEED) -> dict[str, Path]:
    """train.jsonl and heldout.jsonl under `out`; returns their paths."""
    return write_split(out, *split(seed))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Write the two-step agent's train.jsonl and heldout.jsonl.")
    p.add_argument("--out", default="examples/data/chain", help="Output directory.")
    for name, path in write(p.parse_args().out).items():
        print(f"{name}: {path}")
