"""Replay (trainer_service/replay.py, `jetrl replay`): a real `jetrl up` run of 5 steps is stopped, its
recording read back from the run dir's JetStream store, and a fresh trainer with the original config
trains the recorded batches with the original trainer's losses to 1e-6; with another objective (CISPO) the
same batches give other losses, and a stricter staleness filter drops samples."""

import json
import subprocess
import sys

import pytest
from sqlalchemy import select

from controller.db import EventRow, open_database
from launcher.replay_cli import load
from shared.config import JetrlConfig, load_config
from testkit.diagnosis_scenario import BASE, merged
from tests.rollout.up_helpers import run_until_trained
from trainer_service.replay import replay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 5


async def test_replay_with_the_original_config_reproduces_the_losses_and_another_objective_does_not(tmp_path):
    from launcher.demo.task import write_dataset

    data = merged(BASE, {"run": "rec", "schedule": {"total_steps": STEPS, "max_staleness": 2, "batch_size": 4},
                         "rollout": {"max_in_flight": 16}})
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(data))
    cfg = load_config(JetrlConfig, str(p), [])
    train, heldout = write_dataset(tmp_path / "data", train=200, heldout=20)
    run_dir = tmp_path / "run"
    await run_until_trained(cfg, run_dir, train, timeout_s=400)

    _, Session = open_database(f"sqlite:///{run_dir / 'controller.db'}")
    with Session() as s:
        original = {e.data["step"]: e.data for e in s.scalars(
            select(EventRow).where(EventRow.run_id == "rec", EventRow.kind == "step").order_by(EventRow.id))}
    assert sorted(original) == list(range(1, STEPS + 1))

    same = load_config(JetrlConfig, str(run_dir / "config.yaml"), [])
    rec = await load(same, "rec", run_dir)
    assert [st.step for st in rec.steps] == list(range(1, STEPS + 1)) and rec.undecodable == 0
    assert all(len(st.trained) == 4 for st in rec.steps)
    records = replay(same, rec, out=tmp_path / "same", save_every=STEPS)
    for r in records:
        o = original[r["step"]]
        assert r["samples"] == o["samples"] and r["missing"] == 0
        assert abs(r["loss"] - o["loss"]) <= 1e-6, (r["step"], r["loss"], o["loss"])
        assert abs(r["entropy"] - o["entropy"]) <= 1e-6
    saved = tmp_path / "same" / "versions" / str(STEPS)
    assert (saved / "model.safetensors").is_file() or any(saved.glob("*.safetensors"))
    assert len((tmp_path / "same" / "steps.jsonl").read_text().splitlines()) == STEPS

    cispo = load_config(JetrlConfig, str(run_dir / "config.yaml"), ["trainer.algorithm.objective=cispo"])
    other = replay(cispo, rec, steps=2)
    assert len(other) == 2 and any(abs(a["loss"] - original[a["step"]]["loss"]) > 1e-4 for a in other)

    strict = load_config(JetrlConfig, str(run_dir / "config.yaml"), ["schedule.max_staleness=0"])
    counted = replay(strict, rec)
    stale_in_original = sum(sum(v for k, v in original[s]["staleness_hist"].items() if int(k) > 0)
                            for s in original)
    assert sum(r["samples"] for r in counted) == sum(o["samples"] for o in original.values()) - stale_in_original

    # the command line: the same replay, its summary printed
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "replay", "--run-dir", str(run_dir), "--out",
                          str(tmp_path / "cli"), "--steps", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 trained steps" not in out.stdout and f"{STEPS} trained steps" in out.stdout
    assert "replayed 2 steps" in out.stdout

    # the corrections of `jetrl demo --ablation --replay`, two of them, each evaluated on the held-out set
    from rich.console import Console

    from launcher.demo.replay_ablation import replay_corrections

    results = await replay_corrections(run_dir, tmp_path / "corr", Console(), save_every=2, names=["tis", "geo_mask"],
                                       heldout=heldout)
    assert [r["variant"] for r in results] == ["tis", "geo_mask"]
    for r in results:
        assert r["steps"] == STEPS and [v for v, _ in r["heldout_curve"]] == [2, 4, 5]  # step k makes version k
        assert all(0.0 <= x <= 1.0 for _, x in r["heldout_curve"])
    assert json.loads((tmp_path / "corr" / "replay.json").read_text())["runs"][1]["variant"] == "geo_mask"
