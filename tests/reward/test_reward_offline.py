"""`jetrl reward score`: JSONL in, the same rows out with reward and error; bad rows are kept."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from launcher.cli import build_app
from reward_service.offline import OfflineFields, score_file
from shared.config import RewardConfig


async def test_rows_are_written_back_with_reward_and_error(tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [{"id": 1, "completion": "#### 18", "reference": "#### 18"},
            {"id": 2, "completion": "The answer is 7.", "reference": "8"},
            {"id": 3, "reference": "8"},
            {"id": 4, "completion": "#### 1", "reference": "#### x"}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n\n")
    summary = await score_file(RewardConfig(task="gsm8k"), str(src), str(tmp_path / "out.jsonl"))
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r.get("id") for r in out] == [1, 2, 3, 4, None]
    assert [r["reward"] for r in out] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert out[0]["error"] is None and out[1]["error"] is None
    assert "'completion' is missing" in out[2]["error"]
    assert "not a number" in out[3]["error"]
    assert "line 5 is not JSON" in out[4]["error"]
    assert summary.rows == 5 and summary.errors == 3


async def test_field_names_are_configurable(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "max is 8", "gold": "8", "meta": {}}) + "\n")
    fields = OfflineFields(completion="text", reference="gold", payload="meta")
    await score_file(RewardConfig(task="exact"), str(src), str(tmp_path / "o.jsonl"), fields)
    assert json.loads((tmp_path / "o.jsonl").read_text())["reward"] == 0.0
    await score_file(RewardConfig(task="regex"), str(src), str(tmp_path / "o.jsonl"), fields, concurrency=2)
    assert json.loads((tmp_path / "o.jsonl").read_text())["reward"] == 1.0


def test_the_cli_scores_a_file_and_names_a_missing_input(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "3", "reference": "3"}) + "\n")
    runner = CliRunner()
    ok = runner.invoke(build_app(), ["reward", "score", "--task", "maxdigit", "--input", str(src)])
    assert ok.exit_code == 0, ok.output
    assert "scored 1 rows, mean reward 1.0000" in ok.output
    assert json.loads((tmp_path / "in.scored.jsonl").read_text())["reward"] == 1.0
    missing = runner.invoke(build_app(), ["reward", "score", "--task", "exact", "--input", str(tmp_path / "no")])
    assert missing.exit_code == 1 and "no such file" in missing.output
    bad = runner.invoke(build_app(), ["reward", "score", "--task", "nope", "--input", str(src)])
    assert bad.exit_code == 2 and "no built-in scorer" in bad.output
