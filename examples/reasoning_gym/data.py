"""reasoning-gym tasks as jetrl prompt rows, the tasks' generators and scorers unmodified
(`pip install "reasoning-gym>=0.1.25"`; scorer: reward_service/scorers/reasoning_gym.py, reward task
`reasoning_gym`; example config: examples/reasoning_gym_smollm2.yaml).

    python -m examples.reasoning_gym.data --tasks leg_counting,basic_arithmetic --size 200 --seed 0 \\
        --out examples/data/reasoning_gym          # writes train.jsonl, heldout.jsonl

For each task, training entries are `reasoning_gym.create_dataset(task, size=SIZE, seed=SEED)[0:SIZE]`;
held-out entries come from seed `SEED + 1_000_003` (a dataset of 10 x HELDOUT entries, taken in order),
skipping any whose question is also a training question, so no held-out prompt is ever trained on. Each
split is shuffled with `random.Random(SEED)` (tasks interleaved). A row:

    {"prompt": "<question>\\n\\nGive your final answer inside <answer></answer> tags, ...",
     "reference": {"task": "leg_counting", "config": {"size": 200, "seed": 0}, "entry": {question, answer, metadata}},
     "metadata": {"task": "leg_counting", "source_index": 17, "split": "train"}}

The reference holds everything the scorer needs -- the entry as generated and the create_dataset arguments --
so scoring never regenerates. A task whose scorer would evaluate the model's answer as code is refused
(reward_service/scorers/reasoning_gym.py, "Safety").
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from reward_service.scorers.reasoning_gym import INSTRUCTION, task_names, unsafe_reason
from shared.io.jsonl import write_split

HELDOUT_SEED_OFFSET = 1_000_003


def _plain(entry: dict) -> dict:
    """The entry as plain JSON (tuples become lists); raises ValueError if it holds anything JSON cannot."""
    try:
        return json.loads(json.dumps(entry, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"entry {entry.get('metadata', {}).get('source_index')} is not plain JSON: {exc}") from None


def row(task: str, config: dict, entry: dict, split: str) -> dict:
    meta = entry.get("metadata") or {}
    return {
        "prompt": f"{entry['question'].rstrip()}\n\n{INSTRUCTION}",
        "reference": {"task": task, "config": dict(config), "entry": _plain(entry)},
        "metadata": {"task": task, "source_index": meta.get("source_index"), "split": split},
    }


def task_rows(task: str, size: int, heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of one task."""
    import reasoning_gym

    train_cfg = {"size": size, "seed": seed}
    train_ds = reasoning_gym.create_dataset(task, **train_cfg)
    train = [row(task, train_cfg, train_ds[i], "train") for i in range(size)]
    seen = {r["reference"]["entry"]["question"] for r in train}
    held_cfg = {"size": max(10 * heldout, 1), "seed": seed + HELDOUT_SEED_OFFSET}
    held_ds = reasoning_gym.create_dataset(task, **held_cfg)
    held: list[dict] = []
    for i in range(held_cfg["size"]):
        if len(held) >= heldout:
            break
        entry = held_ds[i]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            held.append(row(task, held_cfg, entry, "heldout"))
    if len(held) < heldout:
        raise SystemExit(f"{task}: only {len(held)} of {heldout} held-out questions differ from the training "
                         "ones; ask for fewer")
    return train, held


def build(tasks: list[str], size: int, heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    known = set(task_names())
    for t in tasks:
        if t not in known:
            raise SystemExit(f"unknown reasoning-gym task {t!r}; known: {', '.join(sorted(known))}")
        why = unsafe_reason(t)
        if why:
            raise SystemExit(why)
    train: list[dict] = []
    held: list[dict] = []
    for t in tasks:
        tr, he = task_rows(t, size, heldout, seed)
        train += tr
        held += he
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write reasoning-gym tasks as train.jsonl and heldout.jsonl.")
    p.add_argument("--tasks", default="", help="Comma-separated reasoning-gym dataset names, e.g. leg_counting,basic_arithmetic.")
    p.add_argument("--size", type=int, default=200, help="Training entries per task.")
    p.add_argument("--heldout", type=int, default=50, help="Held-out entries per task.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the training entries (held-out: seed + 1000003).")
    p.add_argument("--out", default="examples/data/reasoning_gym", help="Output directory.")
    p.add_argument("--list", action="store_true", help="Print the tasks that can be scored safely and exit.")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(t for t in task_names() if not unsafe_reason(t)))
        return
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or args.size < 1 or args.heldout < 0:
        p.error("need at least one task, --size >= 1 and --heldout >= 0")
    train, held = build(tasks, args.size, args.heldout, args.seed)
    for name, path in write_split(Path(args.out), train, held).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
