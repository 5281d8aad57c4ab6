"""Every shipped example config validates with `jetrl config show`; examples/demo.yaml is what `jetrl demo` runs."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.demo.run import demo_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"demo.yaml", "gsm8k_grpo.yaml", "gsm8k_tool_agent.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_validates(path):
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "config", "show", "-c", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["run"]


def test_demo_yaml_is_the_demo_config():
    assert yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text()) == demo_settings()


def test_gsm8k_data_the_examples_reference_is_shipped_with_its_licence():
    d = ROOT / "examples" / "data" / "gsm8k"
    assert (d / "train.jsonl").stat().st_size > 1_000_000 and (d / "test.jsonl").stat().st_size > 100_000
    assert "MIT License" in (d / "README.md").read_text()
