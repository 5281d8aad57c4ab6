"""The demo task `maxdigit`: "max 3 8 1 5 2 =" -> "8" (the largest of five digits).

The largest digit is drawn uniformly from 0-9 and the other four uniformly from 0..largest, then
shuffled. With five uniform digits the largest would be 9 for 41 % of prompts and 2-6 for under 10 %:
measured here, the policy then learned 9/8/7 and stalled at 0.85 held-out, the rare maxima starved of
signal; a constant "9" would also score 0.41. With a uniform largest digit, any constant answer scores
0.1 and every answer gets its share of the gradient. The scorer is reward_service/scorers/maxdigit.py (reward 1.0 when the completion,
after leading whitespace, starts with the reference digit).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DIGITS = 5


def make_row(rng: random.Random, digits: int = DIGITS) -> dict:
    """One prompt: {"prompt": "max d1 d2 ... =", "reference": "<largest digit>"}."""
    top = rng.randrange(10)
    ds = [rng.randint(0, top) for _ in range(digits - 1)] + [top]
    rng.shuffle(ds)
    return {"prompt": "max " + " ".join(map(str, ds)) + " =", "reference": str(max(ds))}


def make_rows(n: int, seed: int, digits: int = DIGITS, exclude: set[str] | None = None,
              unique: bool = True) -> list[dict]:
    """`n` rows from `seed`, none whose prompt is in `exclude` (keeps a held-out set disjoint from training).

    unique=True: no prompt twice (the held-out set). unique=False: draws with replacement, so the
    training stream keeps the task's distribution: prompts with a small largest digit are few (one with
    largest 0, 31 with largest 1), and a unique training set would run out of them and never teach them.
    Asking for more unique prompts than remain is an error."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    exclude = exclude or set()
    if unique and n > 10**digits - len(exclude):
        raise ValueError(f"only {10**digits - len(exclude)} distinct {digits}-digit prompts remain, asked for {n}")
    rng = random.Random(seed)
    out: list[dict] = []
    seen = set(exclude)
    while len(out) < n:
        row = make_row(rng, digits)
        if row["prompt"] in (seen if unique else exclude):
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
    """Write `train.jsonl` (drawn with replacement) and `heldout.jsonl` (unique prompts, none of which
    is in train.jsonl) into `out_dir`; returns both paths."""
    held = make_rows(heldout, seed=seed + 1_000_003)
    tr = make_rows(train, seed=seed, exclude={r["prompt"] for r in held}, unique=False)
    d = Path(out_dir)
    return write_jsonl(tr, d / "train.jsonl"), write_jsonl(held, d / "heldout.jsonl")
