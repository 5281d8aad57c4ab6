"""FSDP2 (fully_shard) over 2 gloo ranks on CPU gives the same updated weights as 1 process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig
from shared.model.tinymodel import build_tiny_model

HERE = Path(__file__).resolve().parent


def _run(nproc: int, out: Path, extra: list[str], ckpt: str = "") -> dict:
    """fsdp_step_worker.py on `nproc` ranks; `ckpt` = "<dir>:save" or "<dir>:resume" (see the worker)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(HERE / "fsdp_step_worker.py"), str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), JETRL_TEST_CKPT=ckpt)
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_two_rank_fsdp_step_matches_one_process(tmp_path):
    # activation checkpointing on: recompute in backward must not change the gradients either
    extra = ["trainer.activation_checkpointing=true"]
    one = _run(1, tmp_path / "one.pt", extra)
    two = _run(2, tmp_path / "two.pt", extra)
    assert one["world"] == 1 and two["world"] == 2
    init = build_tiny_model(JetrlConfig().model)[0].state_dict()
    assert set(one["state"]) == set(two["state"]) == set(init)
    changed = 0
    for k, v in one["state"].items():
        assert_close(two["state"][k], v, rtol=1e-4, atol=2e-5, msg=f"{k} differs between 1 and 2 ranks")
        changed += int(not torch.allclose(v, init[k]))
    assert changed == len(init)  # the step moved every tensor
    assert one["stats"]["loss_tokens"] == two["stats"]["loss_tokens"]
    assert abs(one["stats"]["loss"] - two["stats"]["loss"]) < 1e-5
    assert abs(one["stats"]["grad_norm"] - two["stats"]["grad_norm"]) < 1e-4
