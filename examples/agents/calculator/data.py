"""The calculator agent's data: "What is A * B?" for 3-digit A and B, reference A*B as a string.

2,200 distinct pairs drawn with `random.Random(0)` (A and B uniform in 100..999, in draw order); the first
200 are the held-out set, the next 2,000 the training prompts. Generated, so no licence applies.

    python examples/agents/calculator/data.py --out examples/data/calculator   # train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from shared.io.jsonl import write_split

HELDOUT, TRAIN, SEED = 200, 2000, 0


def pairs(n: int, seed: int = SEED) -> list[tuple[int, int]]:
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        p = (rng.randint(100, 999), rng.randint(100, 999))
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def split(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows)."""
    rows = [{"prompt": f"What is {a} * {b}?", "reference": str(a * b)} for a, b in pairs(HELDOUT + TRAIN, seed)]
    return rows[HELDOUT:], rows[:HELDOUT]


def write(out: str | Path, seed: int = SEED) -> dict[str, Path]:
    """train.jsonl and heldout.jsonl under `out`; returns their paths."""
    return write_split(out, *split(seed))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Write the calculator agent's train.jsonl and heldout.jsonl.")
    p.add_argument("--out", default="examples/data/calculator", help="Output directory.")
    for name, path in write(p.parse_args().out).items():
        print(f"{name}: {path}")
