"""The support-reply task: an open-ended task judged by a model (examples/judge_smollm2.yaml, docs/reward.md,
"The judge"). Each row asks for a short reply to a customer's message; there is no reference answer, the
reward comes from the judge's rubric.

All 10 x 12 (product, problem) pairs, shuffled with random.Random(0): the first 20 held out, the other 100
the training prompts. `python examples/judge/data.py` rewrites examples/data/judge/ (committed; a test
checks they agree)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PRODUCTS = ["headphones", "laptop", "coffee maker", "running shoes", "phone case", "desk lamp", "backpack",
            "blender", "winter jacket", "e-reader"]
PROBLEMS = ["arrived broken", "has not arrived after two weeks", "was charged to my card twice",
            "is the wrong colour", "stopped working after a day", "came without the charger",
            "is too small", "arrived with a missing part", "was delivered to the wrong address",
            "has a scratch on it", "is not what the picture showed", "cannot be returned on your website"]


def rows() -> list[dict]:
    out = [{"prompt": f"A customer writes: \"My order ({p}) {q}.\" Write a short, polite reply to the customer.",
            "reference": ""} for p in PRODUCTS for q in PROBLEMS]
    random.Random(0).shuffle(out)
    return out


def write(out_dir: Path) -> tuple[Path, Path]:
    data = rows()
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout, train = out_dir / "heldout.jsonl", out_dir / "train.jsonl"
    heldout.write_text("".join(json.dumps(r) + "\n" for r in data[:20]))
    train.write_text("".join(json.dumps(r) + "\n" for r in data[20:]))
    return train, heldout


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "judge"))
    print(*write(Path(ap.parse_args().out)))
