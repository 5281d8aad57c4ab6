"""The demo tasks: `maxdigit`, "max 3 8 1 5 2 =" -> "8" (the largest of five digits, one answer token),
and `sort`, "sort 3 8 1 5 2 0 =" -> "012358" (six digits in ascending order, six answer tokens).

maxdigit:

The largest digit is drawn uniformly from 0-9 and the other four uniformly from 0..largest, then
shuffled. With five uniform digits the largest would be 9 for 41 % of prompts and 2-6 for under 10 %:
measured here, the policy then learned 9/8/7 and stalled at 0.85 held-out, the rare maxima starved of
signal; a constant "9" would also score 0.41. With a uniform largest digit, any constant answer scores
0.1 and every answer gets its share of the gradient. The scorer is reward_service/scorers/maxdigit.py (reward 1.0 when the completion,
after leading whitespace, starts with the reference digit).

Held-out and training prompts come from two fixed halves of the prompt space, split by a hash of the
prompt (`is_heldout`: one prompt in ten), and both are drawn with replacement, so each keeps the task's
distribution. The split matters for the small classes: only 31 prompts have largest digit 1 and one has
largest 0. Drawing 200 *unique* held-out prompts first and excluding them from training (as the demo
did) took 18 of the 31 and the 0 prompt: training saw largest 1 at 4.7 % and largest 0 never, and runs
ended at 0.845-0.905 held-out, answering "2" to every all-0/1 prompt (per-class eval of version 500).

sort: six digits drawn uniformly (10^6 prompts, no rare classes); the scorer is
reward_service/scorers/sortdigits.py (the fraction of positions right, so a random digit string scores
~0.1). A multi-token answer generated token by token is what makes staleness matter: the one-token
maxdigit ends the same whatever the off-policy correction does. Same hash split as maxdigit.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

from shared.io.jsonl import write_jsonl, write_split  # noqa: F401  (write_split: the task writers' import)

DIGITS = 5
TASKS = ("maxdigit", "sort")
TASK_DIGITS = {"maxdigit": 5, "sort": 6}  # default digits per prompt
HELDOUT_ONE_IN = 10  # the share of the prompt space kept for held-out evaluation


def is_heldout(prompt: str) -> bool:
    """Whether `prompt` belongs to the held-out side of the split (a stable hash, same on every machine).
    The one prompt with largest digit 0 ("max 0 0 0 0 0 =") falls on the training side."""
    return zlib.crc32(prompt.encode()) % HELDOUT_ONE_IN == 0


def make_row(rng: random.Random, digits: int = DIGITS, task: str = "maxdigit") -> dict:
    """One prompt: maxdigit {"prompt": "max d1 d2 ... =", "reference": "<largest digit>"};
    sort {"prompt": "sort d1 d2 ... =", "reference": "<the digits sorted, no spaces>"}."""
    if task == "sort":
        ds = [rng.randrange(10) for _ in range(digits)]
        return {"prompt": "sort " + " ".join(map(str, ds)) + " =", "reference": "".join(map(str, sorted(ds)))}
    top = rng.randrange(10)
    ds = [rng.randint(0, top) for _ in range(digits - 1)] + [top]
    rng.shuffle(ds)
    return {"prompt": "max " + " ".join(map(str, ds)) + " =", "reference": str(max(ds))}


def make_rows(n: int, seed: int, digits: int = DIGITS, side: str = "any", unique: bool = True,
              task: str = "maxdigit") -> list[dict]:
    """`n` rows from `seed`. side="train" / "heldout" keeps only prompts on that side of the split
    (`is_heldout`); "any" takes every prompt.

    unique=True: no prompt twice. unique=False: draws with replacement, so a stream keeps the task's
    distribution (a unique set would run out of the few prompts with a small largest digit).
    Asking for more unique prompts than exist is an error."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if side not in ("any", "train", "heldout"):
        raise ValueError(f"side must be any, train or heldout, got {side!r}")
    if unique and side == "any" and n > 10**digits:
        raise ValueError(f"only {10**digits} distinct {digits}-digit prompts exist, asked for {n}")
    if unique and side != "any":
        available = sum((is_heldout(p) == (side == "heldout")) for p in _all_prompts(digits, task))
        if n > available:
            raise ValueError(f"only {available} distinct {digits}-digit {side} prompts exist, asked for {n}")
    rng = random.Random(seed)
    out: list[dict] = []
    seen: set[str] = set()
    while len(out) < n:
        row = make_row(rng, digits, task)
        if side != "any" and is_heldout(row["prompt"]) != (side == "heldout"):
            continue
        if unique and row["prompt"] in seen:
            continue
        seen.add(row["prompt"])
        out.append(row)
    return out


def _all_prompts(digits: int, task: str = "maxdigit"):
    word = "sort" if task == "sort" else "max"
    for i in range(10**digits):
        yield f"{word} " + " ".join(str(i).zfill(digits)) + " ="


def write_dataset(out_dir: str | Path, train: int = 4000, heldout: int = 200, seed: int = 0,
                  task: str = "maxdigit") -> tuple[Path, Path]:
    """Write `train.jsonl` and `heldout.jsonl` of `task` into `out_dir`, each drawn with replacement from its
    own side of the split (no held-out prompt is ever trained on); returns both paths."""
    digits = TASK_DIGITS.get(task, DIGITS)
    held = make_rows(heldout, seed=seed + 1_000_003, digits=digits, side="heldout", unique=False, task=task)
    tr = make_rows(train, seed=seed, digits=digits, side="train", unique=False, task=task)
    d = Path(out_dir)
    return write_jsonl(tr, d / "train.jsonl"), write_jsonl(held, d / "heldout.jsonl")
