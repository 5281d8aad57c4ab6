"""The subtraction task (the sparse-reward benchmark's task): the documented split (random.Random(0) over all
5,050 pairs with B <= A; first 200 held out, next 2,000 train, no overlap), the shipped files are the
writer's output, the example config names them, and the scorer is the addition rule (a negative answer to a
non-negative difference scores nothing)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from examples.subtraction.data import split
from reward_service.scorers import MODES, load_scorer
from shared.io.jsonl import write_split

ROOT = Path(__file__).resolve().parents[2]


def _pairs(rows):
    out = []
    for r in rows:
        words = r["prompt"].split()
        assert r["prompt"] == f"What is {words[2]} - {words[4][:-1]}? Answer with only the number."
        a, b = int(words[2]), int(words[4][:-1])
        assert r["reference"] == str(a - b)
        out.append((a, b))
    return out


def test_split_is_the_documented_one():
    train, heldout = split()
    tr, he = _pairs(train), _pairs(heldout)
    assert len(set(tr)) == 2000 and len(set(he)) == 200 and not set(tr) & set(he)
    assert all(0 <= b <= a <= 99 for a, b in tr + he)
    pairs = [(a, b) for a in range(100) for b in range(a + 1)]  # by hand: A outer, B inner, then shuffled
    assert len(pairs) == 5050
    random.Random(0).shuffle(pairs)
    assert he == pairs[:200] and tr == pairs[200:2200]


def test_shipped_files_and_config(tmp_path):
    shipped = ROOT / "examples" / "data" / "subtraction"
    for p in write_split(tmp_path, *split()).values():
        assert (shipped / p.name).read_bytes() == p.read_bytes(), f"{p.name}: run python examples/subtraction/data.py"
    assert [json.loads(x) for x in (shipped / "heldout.jsonl").read_text().splitlines()] == split()[1]
    cfg = yaml.safe_load((ROOT / "examples" / "sparse_smollm2.yaml").read_text())
    assert cfg["launch"]["dataset"] == "examples/data/subtraction/train.jsonl"
    assert cfg["eval"]["dataset"] == "examples/data/subtraction/heldout.jsonl" and cfg["reward"]["task"] == "subtraction"


def test_scorer():
    score = load_scorer("subtraction")
    assert MODES["subtraction"] == "inline"
    assert score("42", "42", {}).reward == 1.0 and score("It is 42.", "42", {}).reward == 1.0
    assert score("-42", "42", {}).reward == 0.0 and score("50 - 8 = 42", "42", {}).reward == 0.0
    assert score("0", "0", {}).reward == 1.0 and score("", "0", {}).reward == 0.0

