"""The sglang engine client against a stand-in of SGLang's HTTP API (SGLang has no CPU build)."""

from __future__ import annotations

import pytest
from engines_helpers import TINY, engine_config
from engines_remote_checks import (
    check_logprobs_equal_a_forward_pass,
    check_pause_resume_abort,
    check_weight_update_mid_run,
)
from engines_sglang_standin import StandinServer

from rollout_service.engines import make_engine
from rollout_service.engines.sglang import SglangEngine, parse_generate
from shared.config import JetrlConfig
from shared.runtime.natsd import free_port


@pytest.fixture(scope="module")
def standin(tiny_dirs):
    cfg = JetrlConfig.model_validate({"model": {**TINY, "path": str(tiny_dirs[0]), "dtype": "float32"}})
    server = StandinServer(cfg, free_port()).start()
    yield server
    server.stop()


@pytest.fixture
async def engine(standin):
    eng = make_engine(engine_config(engine="sglang", sglang={"url": standin.url}))
    assert isinstance(eng, SglangEngine)
    await eng.start()
    yield eng
    await eng.close()


async def test_sglang_logprobs_equal_a_transformers_forward_pass(engine, hf_models):
    await check_logprobs_equal_a_forward_pass(engine, hf_models[0], atol=1e-4)


async def test_sglang_weight_update_mid_run_continues_under_the_new_weights(
    engine, standin, tiny_dirs, hf_models
):
    async def progress():
        return standin.engine.stats()["tokens_generated"]

    try:
        await check_weight_update_mid_run(engine, tiny_dirs, hf_models, progress, atol=1e-4)
    finally:
        await engine.update_weights(0, path=str(tiny_dirs[0]))


async def test_sglang_pause_resume_and_abort(engine):
    await check_pause_resume_abort(engine)


async def test_sglang_cancelled_generate_is_aborted_on_the_server(standin):
    """A caller that goes away (an agent's client disconnected) must not leave its request generating
    on the server: the client sends /abort_request for it."""
    import asyncio
    import time

    from rollout_service.engines.base import GenerateRequest, PromptTooLong, SamplingParams

    eng = make_engine(engine_config(engine="sglang", sglang={"url": standin.url},
                                    service={"max_prompt_tokens": 64}))
    await eng.start()
    decode = standin.engine._decode
    standin.engine._decode = lambda: time.sleep(0.01) or decode()  # a model slow enough to be caught running
    try:
        with pytest.raises(PromptTooLong):  # rollout.service.max_prompt_tokens, before any request is sent
            await eng.generate(GenerateRequest(prompt_ids=[5] * 65, sampling=SamplingParams(max_new_tokens=1)))
        req = GenerateRequest(prompt_ids=[5, 6, 7], sampling=SamplingParams(max_new_tokens=200, ignore_eos=True))
        before = standin.engine.stats()["tokens_generated"]
        task = asyncio.create_task(eng.generate(req))
        deadline = time.monotonic() + 10
        while standin.engine.stats()["running"] < 1:
            assert time.monotonic() < deadline, standin.engine.stats()
            await asyncio.sleep(0.01)
        task.cancel()
        deadline = time.monotonic() + 2
        while standin.engine.stats()["running"] > 0:
            assert time.monotonic() < deadline, "the server kept generating for a cancelled request"
            await asyncio.sleep(0.01)
        assert standin.engine.stats()["tokens_generated"] - before < 200
    finally:
        standin.engine._decode = decode
        await eng.close()


def test_sglang_response_parsing_reads_tokens_logprobs_and_finish_reason():
    seg = parse_generate(
        {"text": "ab", "output_ids": [7, 8],
         "meta_info": {"finish_reason": {"type": "length", "length": 2}, "output_token_logprobs": [[-0.5, 7, None], [-1.25, 8, None]]}}
    )  # fmt: skip
    assert seg.output_ids == [7, 8] and seg.logprobs == [-0.5, -1.25] and seg.finish_reason == "length"
    with pytest.raises(ValueError, match="meta_info"):
        parse_generate({"text": "x"})
