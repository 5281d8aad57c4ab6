"""`jetrl demo --ablation` / `--task sort` pieces that need no run: the variants' configs, the sort demo's
settings, the held-out-vs-time curve, and the combined plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from ci_gate import need_module

from launcher.demo.ablation import demo_budget, key_figures, plot_ablation, variants
from launcher.demo.report import heldout_vs_time, version_times
from launcher.demo.run import DemoOptions, build_config, demo_settings, digit_token_ids
from shared.config import JetrlConfig, load_config


def test_sort_settings_limit_answers_to_six_digits_scored_by_the_sort_scorer():
    d = demo_settings(task="sort")
    assert d["reward"]["task"] == "sort"
    assert d["rollout"]["sampling"]["max_new_tokens"] == 6
    ids = d["rollout"]["sampling"]["allowed_token_ids"]
    assert ids == digit_token_ids() and len(set(ids)) == 10
    from shared.model.tinymodel import build_tokenizer

    assert build_tokenizer().decode(ids) == "0123456789"
    assert demo_settings()["rollout"]["sampling"]["max_new_tokens"] == 1  # maxdigit unchanged
    with pytest.raises(ValueError, match="demo task"):
        demo_settings(task="reverse")


def test_the_ablation_runs_three_minutes_each_unless_told_and_the_demo_keeps_its_budget():
    assert demo_budget(False, None, None, None) == (15.0, 500, 5)
    assert demo_budget(True, None, None, None) == (3.0, 3000, 10)
    assert demo_budget(True, 1.5, None, 20) == (1.5, 3000, 20)  # what is given wins
    assert demo_budget(False, None, 40, None) == (15.0, 40, 5)


def test_ablation_variants_validate_and_differ_as_documented(tmp_path):
    runs = variants("sort")
    assert [v.name for v in runs] == ["sync", "decoupled", "iw_reinforce", "no_correction"]
    assert [v.max_staleness for v in runs] == [0, 4, 4, 4]
    cfgs = {}
    for v in runs:
        opts = DemoOptions(out=tmp_path, task="sort", max_staleness=v.max_staleness, overrides=list(v.overrides))
        cfgs[v.name] = build_config(opts, f"r-{v.name}", tmp_path)
    a = {k: c.trainer.algorithm for k, c in cfgs.items()}
    assert a["sync"].objective == a["decoupled"].objective == "ppo" and a["decoupled"].decoupled
    assert a["iw_reinforce"].objective == "iw_reinforce" and not a["iw_reinforce"].decoupled
    assert a["no_correction"].objective == "reinforce"
    assert {x.ppo_minibatches for x in a.values()} == {8}  # the same optimizer steps in every run
    assert {c.schedule.batch_size for c in cfgs.values()} == {128}
    assert all(c.schedule.max_staleness == (0 if k == "sync" else 4) for k, c in cfgs.items())


def test_heldout_against_seconds_uses_when_each_version_was_published():
    steps = [{"version": 1, "time": 105.0}, {"version": 2, "time": 107.5}, {"version": 3, "time": 110.0}]
    times = version_times(steps, start=100.0)
    assert times == {0: 0.0, 1: 5.0, 2: 7.5, 3: 10.0}
    assert heldout_vs_time([[0, 0.1], [2, 0.5], [4, 0.9]], times) == [[0.0, 0, 0.1], [7.5, 2, 0.5]]


def test_ablation_plot_and_key_figures(tmp_path):
    s = {"max_staleness": 4, "initial_heldout_reward": 0.1, "final_heldout_reward": 0.8, "versions": 10,
         "train_seconds": 30.0, "first_version_at_target": None, "first_seconds_at_target": None,
         "heldout_curve": [[0, 0.1], [10, 0.8]], "heldout_vs_seconds": [[0.0, 0, 0.1], [30.0, 10, 0.8]],
         "staleness_hist": {"0": 5}}
    rows = [key_figures("sync", "sync", s), key_figures("x", "x", None)]
    assert rows[1]["failed"] and rows[0]["final_heldout_reward"] == 0.8
    need_module("matplotlib", "plots or dev extra")
    path = plot_ablation(rows, tmp_path / "ablation.png", "sort")
    assert Path(path).stat().st_size > 1000


def test_the_cli_refuses_an_unknown_task():
    from typer.testing import CliRunner

    from launcher.cli import build_app

    res = CliRunner().invoke(build_app(), ["demo", "--task", "reverse"])
    assert res.exit_code == 2 and "maxdigit or sort" in res.output


def test_sort_example_config_is_the_sort_demo_config():
    import yaml

    root = Path(__file__).resolve().parents[2]
    assert yaml.safe_load((root / "examples" / "demo_sort.yaml").read_text()) == demo_settings(task="sort")
    load_config(JetrlConfig, str(root / "examples" / "demo_sort.yaml"))
