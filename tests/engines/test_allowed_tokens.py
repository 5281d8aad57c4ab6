"""rollout.sampling.allowed_token_ids: the local engine samples only those ids and records the logprobs
of the masked softmax, the trainer's logprobs apply the same mask (equal to the engine's), vLLM gets the
parameter and processed logprobs, sglang refuses it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from ci_gate import need_vllm_venv
from engines_helpers import engine_config

from rollout_service.engines import GenerateRequest, SamplingParams, make_engine
from rollout_service.engines.sglang import generate_body
from rollout_service.engines.vllm import completion_body, server_args
from shared.config import ConfigError, JetrlConfig, load_config
from shared.model.logits_mask import MASKED, allowed_vector, mask_logits

DIGITS = list(range(4, 14))  # "0".."9" in the tiny character tokenizer


def test_mask_logits_hand_values_and_bad_ids_name_the_option():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    allowed = allowed_vector([0, 2], 3)
    out = mask_logits(logits, allowed)
    assert out[0].tolist() == [1.0, MASKED, 3.0]
    lp = torch.log_softmax(out, -1)
    # softmax over {0, 2} only: log(e / (e + e^3)), log(e^3 / (e + e^3)); the masked id has probability 0
    torch.testing.assert_close(lp[0, [0, 2]], torch.tensor([1.0, 3.0]) - torch.logsumexp(torch.tensor([1.0, 3.0]), 0))
    assert lp[1, 1].exp() == 0 and torch.isfinite(lp).all()
    rows = mask_logits(logits, allowed, rows=torch.tensor([False, True]))
    assert rows[0].tolist() == [1.0, 2.0, 3.0] and rows[1, 1] == MASKED
    assert allowed_vector([], 3) is None and mask_logits(logits, None) is logits
    with pytest.raises(ValueError, match="rollout.sampling.allowed_token_ids"):
        allowed_vector([3], 3)


async def test_engine_and_trainer_give_the_same_masked_logprobs(tiny_dirs):
    from trainer_service.backends.fsdp import FSDPBackend

    cfg = engine_config(engine="local", sampling={"allowed_token_ids": DIGITS})
    results = await masked_generations(cfg, tiny_dirs[0])
    cfg.trainer.device = "cpu"
    plain = unmasked_backend(cfg)
    for chunk in (1024, 0):  # loss positions through the chunked head, and full logits
        cfg.trainer.logprob_chunk_tokens = chunk
        check_trainer_logprobs(FSDPBackend(cfg), plain, results)


async def masked_generations(cfg, model_dir) -> list:
    """Four sampled generations of 6 tokens under the digits mask from the engine `cfg` names."""
    cfg.model.path = str(model_dir)
    cfg.model.dtype = "float32"
    eng = make_engine(cfg)
    await eng.start()
    try:
        return await asyncio.gather(*[
            eng.generate(GenerateRequest(prompt_ids=[1] + [20 + i + j for j in range(5 + i)],
                                         sampling=SamplingParams(max_new_tokens=6, seed=i, allowed_token_ids=DIGITS)))
            for i in range(4)])
    finally:
        await eng.close()


def unmasked_backend(cfg):
    """The trainer on the same model without allowed_token_ids (its logprobs must differ)."""
    from trainer_service.backends.fsdp import FSDPBackend

    return FSDPBackend(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"sampling": cfg.rollout.sampling.model_copy(update={"allowed_token_ids": []})})}))


def check_trainer_logprobs(backend, plain, results) -> None:
    from trainer_service.packing import TrainItem, pack

    for r in results:
        assert len(r.output_ids) == 6 and set(r.output_ids) <= set(DIGITS), r.output_ids
        toks = np.array(r.prompt_ids + r.output_ids, np.int32)
        mask = np.array([0] * len(r.prompt_ids) + [1] * 6, np.uint8)
        m = pack([TrainItem(tokens=toks, loss_mask=mask, behav_logp=np.zeros(len(toks), np.float32), advantage=0.0)])
        sel = m.mask > 0
        trained = backend.forward(m)[0][sel]
        torch.testing.assert_close(trained, torch.tensor(r.logprobs), atol=1e-5, rtol=0)
        unmasked = plain.forward(m)[0][sel]
        assert (unmasked < trained - 1e-3).all()  # the mask matters: the full softmax gives each digit less


def test_vllm_sends_the_ids_and_asks_a_started_server_for_processed_logprobs():
    body = completion_body("m", "r", [1], SamplingParams(allowed_token_ids=[4, 5]))
    assert body["allowed_token_ids"] == [4, 5]
    assert "allowed_token_ids" not in completion_body("m", "r", [1], SamplingParams())
    assert server_args(["--seed", "0"], [4]) == ["--seed", "0", "--logprobs-mode", "processed_logprobs"]
    assert server_args(["--logprobs-mode=processed_logprobs"], [4]) == ["--logprobs-mode=processed_logprobs"]
    assert server_args([], []) == []


def test_config_refuses_sglang_and_vllm_with_temperature_and_per_task_lists():
    with pytest.raises(ConfigError, match="allowed_token_ids.*sglang"):
        load_config(JetrlConfig, None, ["rollout.engine=sglang", "rollout.sampling.allowed_token_ids=[4,5]"])
    with pytest.raises(ConfigError, match="allowed_token_ids.*temperature 1"):
        load_config(JetrlConfig, None, ["rollout.engine=vllm", "rollout.vllm.url=http://x",
                                        "rollout.sampling.allowed_token_ids=[4,5]", "rollout.sampling.temperature=0.7"])
    cfg = load_config(JetrlConfig, None, ["rollout.sampling.allowed_token_ids=[4,5]"])
    assert SamplingParams.from_config(cfg.rollout.sampling, {"temperature": 0.5}).allowed_token_ids == [4, 5]
    with pytest.raises(ValueError, match="not per task"):
        SamplingParams.from_config(cfg.rollout.sampling, {"allowed_token_ids": [4]})
    with pytest.raises(ValueError, match="sglang"):
        generate_body("r", [1], SamplingParams(allowed_token_ids=[4]))


@pytest.mark.vllm
@pytest.mark.slow
async def test_a_vllm_server_started_by_the_engine_returns_the_trainers_masked_logprobs(tiny_dirs):
    from engines_helpers import VLLM_PYTHON

    from trainer_service.backends.fsdp import FSDPBackend

    need_vllm_venv(VLLM_PYTHON)
    cfg = engine_config(engine="vllm", vllm={"start_server": True, "python": VLLM_PYTHON},
                        sampling={"allowed_token_ids": DIGITS})
    results = await masked_generations(cfg, tiny_dirs[0])
    cfg.trainer.device = "cpu"
    cfg.rollout.engine = "local"
    plain = unmasked_backend(cfg)
    check_trainer_logprobs(FSDPBackend(cfg), plain, results)
