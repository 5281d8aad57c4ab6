"""The judge example (examples/judge_smollm2.yaml, examples/judge_vllm.yaml): the shipped rows are the
writer's output, both configs load, and their judges build (rubric, templates, backend settings)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from reward_service.judge.judge import Judge
from shared.config import JetrlConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_rows_are_the_writers_output(tmp_path):
    spec = importlib.util.spec_from_file_location("judge_data", ROOT / "examples" / "judge" / "data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    train, heldout = mod.write(tmp_path)
    shipped = ROOT / "examples" / "data" / "judge"
    assert train.read_text() == (shipped / "train.jsonl").read_text()
    assert heldout.read_text() == (shipped / "heldout.jsonl").read_text()
    assert len(train.read_text().splitlines()) == 100 and len(heldout.read_text().splitlines()) == 20
    assert not set(train.read_text().splitlines()) & set(heldout.read_text().splitlines())


def test_the_example_configs_load_and_their_judges_build():
    for name, backend, parser in (("judge_smollm2.yaml", "local", "yes_no"), ("judge_vllm.yaml", "vllm", "score_line")):
        cfg = load_config(JetrlConfig, str(ROOT / "examples" / name), [])
        j = cfg.reward.judge
        assert cfg.reward.task == "judge" and j.backend == backend and j.parser == parser
        assert [c.name for c in j.rubric] == ["polite", "helpful", "concise"]
        judge = Judge(j)
        assert [w for _, _, w in judge.criteria] == [1, 2, 1]
