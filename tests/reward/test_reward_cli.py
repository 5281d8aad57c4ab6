"""`jetrl reward serve` refuses a bad task or scorer at start, naming what to fix."""

from __future__ import annotations

from typer.testing import CliRunner

from launcher.cli import build_app


def test_serve_with_an_unknown_task_and_no_scorer_exits_2_naming_the_field():
    out = CliRunner().invoke(build_app(), ["reward", "serve", "--task", "nope"])
    assert out.exit_code == 2
    assert "reward.scorer" in out.output and "no built-in scorer" in out.output


def test_serve_with_an_unimportable_custom_scorer_exits_2():
    out = CliRunner().invoke(build_app(), ["reward", "serve", "--task", "mine", "reward.scorer=no_such_pkg_xyz:fn"])
    assert out.exit_code == 2 and "'no_such_pkg_xyz:fn': no module named 'no_such_pkg_xyz'" in out.output


def test_serve_with_an_invalid_task_name_exits_2():
    out = CliRunner().invoke(build_app(), ["reward", "serve", "--task", "a.b"])
    assert out.exit_code == 2 and "reward task" in out.output


def test_a_bad_reward_option_names_the_dotted_field():
    out = CliRunner().invoke(build_app(), ["reward", "serve", "reward.concurrency=0"])
    assert out.exit_code == 2 and "reward.concurrency" in out.output
