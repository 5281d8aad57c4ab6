"""The local engine: exact logprobs, batch-invariant seeded sampling, weight swaps between decode steps.
The logprob and weight-swap tests run again on a CUDA GPU where there is one (`pytest -m gpu`)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engines_helpers import assert_greedy, engine_config, forward_logprobs, wait_until

from rollout_service.engines import GenerateRequest, SamplingParams, make_engine
from rollout_service.engines.local import LocalEngine

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


async def started(tiny_dirs, device: str = "cpu", **local) -> LocalEngine:
    cfg = engine_config(engine="local", local=local, device=device)
    cfg.model.path = str(tiny_dirs[0])
    cfg.model.dtype = "float32"
    eng = make_engine(cfg)
    assert isinstance(eng, LocalEngine)
    await eng.start()
    return eng


def requests(n: int) -> list[GenerateRequest]:
    """Prompts of different lengths, sampling settings and lengths (so rows join and leave at different steps)."""
    out = []
    for i in range(n):
        sp = SamplingParams(
            temperature=[1.0, 0.7, 1.3, 0.0][i % 4],
            top_k=[0, 20, 0, 0][i % 4],
            top_p=[1.0, 1.0, 0.9, 1.0][i % 4],
            max_new_tokens=8 + 7 * i,
            seed=100 + i,
        )
        out.append(
            GenerateRequest(prompt_ids=[1] + [5 + (3 * i + j) % 60 for j in range(2 + 3 * i)], sampling=sp)
        )
    return out


@pytest.mark.parametrize("device", DEVICES)
async def test_local_logprobs_equal_a_fresh_forward_pass(tiny_dirs, hf_models, device):
    eng = await started(tiny_dirs, device)
    try:
        results = await asyncio.gather(*[eng.generate(r) for r in requests(6)])
    finally:
        await eng.close()
    for r in results:
        assert r.output_ids and len(r.logprobs) == len(r.output_ids) == len(r.versions)
        ref = forward_logprobs(hf_models[0], r.prompt_ids, r.output_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("max_batch", [3, 32])
async def test_continuous_batching_gives_the_same_tokens_as_each_request_alone(tiny_dirs, max_batch):
    reqs = requests(7)
    eng = await started(tiny_dirs, max_batch=max_batch, max_prefill_batch=2)
    try:
        alone = [await eng.generate(GenerateRequest(r.prompt_ids, r.sampling)) for r in reqs]
        # staggered: later requests join while earlier ones are mid-decode
        tasks = []
        for r in reqs:
            tasks.append(asyncio.create_task(eng.generate(r)))
            before = eng.stats()["tokens_generated"]

            async def progressed(before=before):
                return eng.stats()["tokens_generated"] >= before + 3 or all(t.done() for t in tasks)

            await wait_until(progressed, what="a few decode steps")
        together = await asyncio.gather(*tasks)
    finally:
        await eng.close()
    for a, b in zip(alone, together, strict=True):
        assert b.output_ids == a.output_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)


async def _swap_mid_generation(eng: LocalEngine, path: str, n_new: int = 120):
    req = GenerateRequest(
        [1, 5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=n_new, stop_token_ids=[])
    )
    task = asyncio.create_task(eng.generate(req))

    async def some_tokens():
        return eng.stats()["tokens_generated"] >= 5

    await wait_until(some_tokens, what="5 generated tokens")
    await eng.pause()
    k = int(eng.stats()["tokens_generated"])
    await eng.update_weights(1, path=path)
    await eng.resume()
    return await task, k


@pytest.mark.parametrize("device", DEVICES)
async def test_weight_swap_mid_generation_switches_version_at_one_token_and_continues_under_new_weights(
    tiny_dirs, hf_models, device
):
    eng = await started(tiny_dirs, device)
    try:
        r, k = await _swap_mid_generation(eng, str(tiny_dirs[1]))
    finally:
        await eng.close()
    n = len(r.output_ids)
    assert r.versions == [0] * k + [1] * (n - k) and 0 < k < n
    # tokens before the swap are v0's greedy choices, after it v1's, given everything generated so far
    assert_greedy(hf_models[0], r.prompt_ids, r.output_ids, 0, k)
    assert_greedy(hf_models[1], r.prompt_ids, r.output_ids, k, n)
    lp = torch.tensor(r.logprobs)
    torch.testing.assert_close(
        lp[:k], forward_logprobs(hf_models[0], r.prompt_ids, r.output_ids)[:k], atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        lp[k:], forward_logprobs(hf_models[1], r.prompt_ids, r.output_ids)[k:], atol=1e-4, rtol=0
    )


async def test_weight_swap_keeping_the_stale_cache_switches_versions_but_not_the_context(
    tiny_dirs, hf_models
):
    eng = await started(tiny_dirs, recompute_kv_on_swap=False)
    try:
        r, k = await _swap_mid_generation(eng, str(tiny_dirs[1]))
    finally:
        await eng.close()
    n = len(r.output_ids)
    assert r.versions == [0] * k + [1] * (n - k) and 0 < k < n
    # the context before the swap still holds v0's keys/values: v1's fresh forward pass differs
    fresh = forward_logprobs(hf_models[1], r.prompt_ids, r.output_ids)[k:]
    assert (torch.tensor(r.logprobs[k:]) - fresh).abs().max() > 1e-3


async def test_swap_from_an_in_memory_state_dict_changes_the_policy_and_a_bad_one_changes_nothing(
    tiny_dirs, hf_models
):
    eng = await started(tiny_dirs)
    try:
        await eng.update_weights(7, state_dict=hf_models[1].state_dict())
        sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=3)
        running = asyncio.create_task(eng.generate(GenerateRequest([1, 9, 9], sp)))
        with pytest.raises(ValueError, match="missing"):
            await eng.update_weights(8, state_dict={"model.norm.weight": torch.ones(64)})
        bad_shape = {
            k: v[..., :1] if k.endswith("lm_head.weight") else v for k, v in hf_models[0].state_dict().items()
        }
        with pytest.raises(ValueError, match="wrong shape"):
            await eng.update_weights(9, state_dict=bad_shape)
        r = await running
    finally:
        await eng.close()
    assert set(r.versions) == {7} and eng.version == 7 and r.finish_reason in ("length", "stop")
    torch.testing.assert_close(
        torch.tensor(r.logprobs),
        forward_logprobs(hf_models[1], r.prompt_ids, r.output_ids),
        atol=1e-4,
        rtol=0,
    )


async def test_stop_token_ids_and_stop_strings_end_generation_and_are_kept(tiny_dirs):
    eng = await started(tiny_dirs)
    try:
        base = await eng.generate(
            GenerateRequest([1, 20, 21], SamplingParams(temperature=0.0, max_new_tokens=30))
        )
        assert base.finish_reason == "length"
        stop_tok = base.output_ids[5]
        first = base.output_ids.index(stop_tok)
        r = await eng.generate(
            GenerateRequest(
                [1, 20, 21], SamplingParams(temperature=0.0, max_new_tokens=30, stop_token_ids=[stop_tok])
            )
        )
        assert r.output_ids == base.output_ids[: first + 1] and r.finish_reason == "stop"
        text = eng.tokenizer.decode(base.output_ids[6:8])
        r = await eng.generate(
            GenerateRequest([1, 20, 21], SamplingParams(temperature=0.0, max_new_tokens=30, stop=[text]))
        )
        assert r.finish_reason == "stop" and eng.tokenizer.decode(r.output_ids).endswith(text)
        assert r.output_ids == base.output_ids[: len(r.output_ids)] and len(r.output_ids) <= 8
    finally:
        await eng.close()


async def test_pause_holds_requests_and_abort_returns_partial_results(tiny_dirs):
    eng = await started(tiny_dirs)
    try:
        await eng.pause()
        held = asyncio.create_task(
            eng.generate(GenerateRequest([1, 5], SamplingParams(max_new_tokens=20, seed=1)))
        )
        await asyncio.sleep(0.3)
        assert not held.done() and eng.stats()["tokens_generated"] == 0
        await eng.resume()
        assert len((await held).output_ids) >= 1
        long = asyncio.create_task(
            eng.generate(
                GenerateRequest([1, 5], SamplingParams(max_new_tokens=10_000, seed=2), request_id="long")
            )
        )

        async def started_decoding():
            return (
                eng.stats()["running"] >= 1
                and eng.stats()["tokens_generated"] > len((await held).output_ids) + 2
            )

        await wait_until(started_decoding, what="the long request to decode")
        assert await eng.abort("long") == 1
        r = await long
        assert r.finish_reason == "abort" and 0 < len(r.output_ids) < 10_000
        assert len(r.versions) == len(r.logprobs) == len(r.output_ids)
        assert await eng.abort(None) == 0
    finally:
        await eng.close()


async def test_bad_requests_fail_naming_what_to_fix(tiny_dirs):
    eng = await started(tiny_dirs)
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await eng.generate(GenerateRequest([1, 10_000]))
        with pytest.raises(ValueError, match="sampling.top_p"):
            await eng.generate(GenerateRequest([1, 5], SamplingParams(top_p=0.0)))
        with pytest.raises(ValueError, match="prompt_ids is empty"):
            await eng.generate(GenerateRequest([]))
        with pytest.raises(ValueError, match="exactly one of path or state_dict"):
            await eng.update_weights(1)
    finally:
        await eng.close()
    with pytest.raises(ValueError, match="rollout.vllm.url"):
        make_engine(engine_config(engine="vllm"))


async def test_a_groups_shared_prompt_is_prefilled_once_with_the_same_samples(tiny_dirs, hf_models):
    """Two groups of 4 samples (different seeds) and a lone prompt, submitted together: share_prefill runs
    3 prefill rows instead of 9 and gives every sample the tokens and logprobs of the unshared prefill."""
    group_a, group_b = [1, 5, 9, 12, 7], [1, 30, 31]
    reqs = [GenerateRequest(p, SamplingParams(temperature=1.0, max_new_tokens=10, seed=s))
            for p, n in ((group_a, 4), (group_b, 4), ([1, 40, 41, 42, 43, 44, 45], 1)) for s in range(n)]
    results = {}
    for share in (True, False):
        eng = await started(tiny_dirs, max_prefill_batch=16, share_prefill=share)
        try:
            await eng.pause()  # all nine wait, then join one prefill batch
            tasks = [asyncio.create_task(eng.generate(GenerateRequest(r.prompt_ids, r.sampling))) for r in reqs]
            await asyncio.sleep(0.2)
            await eng.resume()
            results[share] = await asyncio.gather(*tasks)
            assert eng.stats()["prefill_rows"] == (3 if share else 9)
        finally:
            await eng.close()
    for a, b in zip(results[True], results[False], strict=True):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        ref = forward_logprobs(hf_models[0], a.prompt_ids, a.output_ids)
        torch.testing.assert_close(torch.tensor(a.logprobs), ref, atol=1e-4, rtol=0)
    assert len({tuple(r.output_ids) for r in results[True][:4]}) > 1  # the group's samples differ
