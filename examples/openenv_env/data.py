"""Prompt rows for the guessing game served by examples/openenv_env/server.py: one row per game (a seed).

    python -m examples.openenv_env.data --out examples/data/openenv     # train.jsonl (100), heldout.jsonl (20)

A row (jetrl's dataset format: `prompt`, `reference`, `metadata`; controller/datasets.py):

    {"prompt": "Guessing game 17. Reply with one whole number: your guess.",
     "reference": "8",
     "metadata": {"reset": {"seed": 17, "low": 1, "high": 20, "max_guesses": 5}}}

`metadata.reset` is what the OpenEnv adapter passes to the environment's reset (over the WebSocket), so every
episode of a group plays the same game. The reference is the secret (secret_for(seed, low, high)), only for
reading rollouts: the reward comes from the environment. Training games use seeds 0..99, held-out games
seeds 1000..1019 (no held-out seed is trained on; secrets repeat, the range being small).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.io.jsonl import write_split

from .environment import secret_for

LOW, HIGH, MAX_GUESSES = 1, 20, 5
TRAIN_SEEDS, HELDOUT_SEEDS = range(0, 100), range(1000, 1020)


def row(seed: int, low: int = LOW, high: int = HIGH, max_guesses: int = MAX_GUESSES) -> dict:
    return {"prompt": f"Guessing game {seed}. Reply with one whole number: your guess.",
            "reference": str(secret_for(seed, low, high)),
            "metadata": {"reset": {"seed": seed, "low": low, "high": high, "max_guesses": max_guesses}}}


def split() -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows)."""
    return [row(s) for s in TRAIN_SEEDS], [row(s) for s in HELDOUT_SEEDS]


def write(out: str | Path) -> dict[str, Path]:
    return write_split(out, *split())


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Write the guessing game's train.jsonl and heldout.jsonl.")
    p.add_argument("--out", default="examples/data/openenv", help="Output directory.")
    for name, path in write(p.parse_args().out).items():
        print(f"{name}: {path}")
