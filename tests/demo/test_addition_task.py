"""The addition task: the documented split (random.Random(0) over all 2,500 pairs; first 200 held out,
next 2,000 train, no overlap), the shipped files are the writer's output, and the scorer's rule."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import yaml

from examples.addition.data import split, write
from reward_service.scorers import BUILTIN, MODES, load_scorer

ROOT = Path(__file__).resolve().parents[2]


def _pairs(rows):
    out = []
    for r in rows:
        words = r["prompt"].split()
        assert r["prompt"] == f"What is {words[2]} + {words[4][:-1]}? Answer with only the number."
        a, b = int(words[2]), int(words[4][:-1])
        assert r["reference"] == str(a + b)
        out.append((a, b))
    return out


def test_split_is_the_documented_one():
    train, heldout = split()
    assert len(train) == 2000 and len(heldout) == 200
    tr, he = _pairs(train), _pairs(heldout)
    assert not set(tr) & set(he) and len(set(tr)) == 2000 and len(set(he)) == 200
    assert all(0 <= x < 50 for p in tr + he for x in p)
    # By hand: A outer, B inner, shuffled with Python's random.Random(0); held-out first.
    pairs = [(a, b) for a in range(50) for b in range(50)]
    random.Random(0).shuffle(pairs)
    assert he == pairs[:200] and tr == pairs[200:2200]


def test_shipped_files_are_the_writers_output(tmp_path):
    paths = write(tmp_path)
    shipped = ROOT / "examples" / "data" / "addition"
    for p in paths.values():
        assert (shipped / p.name).read_bytes() == p.read_bytes(), f"{p.name}: run python examples/addition/data.py"
    rows = [json.loads(x) for x in (shipped / "heldout.jsonl").read_text().splitlines()]
    assert rows == split()[1]


def test_scorer_rewards_the_first_integer_only():
    assert BUILTIN["addition"] and MODES["addition"] == "inline"
    score = load_scorer("addition")
    assert score("57", "57", {}).reward == 1.0
    assert score(" The answer is 57.", "57", {}).reward == 1.0
    assert score("57 + 1 = 58", 57, {}).reward == 1.0
    assert score("1 + 56 = 57", "57", {}).reward == 0.0  # the first integer is 1
    assert score("-3", "-3", {}).reward == 1.0 and score("-57", "57", {}).reward == 0.0
    assert score("fifty-seven", "57", {}).reward == 0.0
    assert score("570", "57", {}).reward == 0.0


def test_example_config_enqueues_its_training_file_and_up_names_a_missing_one(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / "smollm2_addition.yaml").read_text())
    assert cfg["launch"]["dataset"] == "examples/data/addition/train.jsonl"
    assert cfg["eval"]["dataset"] == "examples/data/addition/heldout.jsonl" and cfg["reward"]["task"] == "addition"
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(ROOT / "examples" / "smollm2_addition.yaml"),
                          "--run-dir", str(tmp_path / "run"), "launch.dataset=nowhere.jsonl"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "launch.dataset 'nowhere.jsonl': no such file" in out.stderr
