"""The demo task `maxdigit`: "max 3 8 1 5 2 =" -> "8" (the largest of five random digits).

Small enough for the tiny character-level policy to learn on two CPU cores in minutes, hard enough
that chance is low: a model that emits a random digit scores ~0.1, one that emits any digit of the
prompt ~0.33. The scorer is reward_service/scorers/maxdigit.py (reward 1.0 when the completion,
after leading whitespace, starts with the reference digit).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DIGITS = 5


def make_row(rng: random.Random, digits: int = DIGITS) -> dict:
    """One prompt: {"prompt": "max d1 d2 ... =", "reference": "<largest digit>"}."""
    ds = [rng.randrange(10) for _ in range(digits)]
    return {"prompt": "max " + " ".join(map(str, ds)) + " =", "reference": str(max(ds))}


def make_rows(n: int, seed: int, digits: int = DIGITS, exclude: set[str] | None = None) -> list[dict]:
    """`n` rows from `seed`, none whose prompt is in `exclude` (keeps a held-out set disjoint from training).

    With 5 digits there are 100,000 distinct prompts; asking for more than remain is an error."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    exclude = exclude or set()
    if n > 10**digits - len(exclude):
        raise ValueError(f"only {10**digits - len(exclude)} distinct {digits}-digit prompts remain, asked for {n}")
    rng = random.Random(seed)
    out: list[dict] = []
    seen = set(exclude)
    while len(out) < n:
        row = make_row(rng, digits)
        if row["prompt"] in seen:
            continue
        seen.add(row["prompt"])
        out.append(row)
    return out


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return p


def write_dataset(out_dir: str | Path, train: int = 4000, heldout: int = 200, seed: int = 0) -> tuple[Path, Path]:
    """Write `train.jsonl` and `heldout.jsonl` (disjoint prompts) into `out_dir`; returns both paths."""
    held = make_rows(heldout, seed=seed + 1_000_003)
    tr = make_rows(train, seed=seed, exclude={r["prompt"] for r in held})
    d = Path(out_dir)
    return write_jsonl(tr, d / "train.jsonl"), write_jsonl(held, d / "heldout.jsonl")
