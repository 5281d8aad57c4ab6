"""Checks shared by the HTTP engine tests (vllm against a real server, sglang against its stand-in)."""

from __future__ import annotations

import asyncio

import torch
from engines_helpers import assert_greedy, forward_logprobs, wait_until

from rollout_service.engines import GenerateRequest, SamplingParams


async def check_logprobs_equal_a_forward_pass(engine, model, atol: float) -> None:
    reqs = [
        GenerateRequest(
            [1] + [5 + i] * (2 + 2 * i), SamplingParams(temperature=1.0, max_new_tokens=12 + 4 * i, seed=i)
        )
        for i in range(4)
    ]
    results = await asyncio.gather(*[engine.generate(r) for r in reqs])
    for r in results:
        assert r.output_ids and len(r.output_ids) == len(r.logprobs) == len(r.versions)
        assert set(r.versions) == {engine.version}
        ref = forward_logprobs(model, r.prompt_ids, r.output_ids)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=atol, rtol=0)


async def _settled(progress) -> float:
    """The progress counter once it stops moving (a server may count the previous requests' tokens late)."""
    last = await progress()
    while True:
        await asyncio.sleep(0.1)
        now = await progress()
        if now == last:
            return now
        last = now


async def _swap_while_generating(
    engine, tiny_dirs, hf_models, progress, atol: float, n_reqs: int, steps: int, delay: float | None = None
) -> list[int]:
    """Swap v0 -> v1 once `n_reqs` greedy generations made about `steps` decode steps (or, with `delay`,
    that many seconds after they were sent); check every token; return each request's count of v0
    tokens (0 < k < 200: it switched mid-generation)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=200, ignore_eos=True)
    reqs = [GenerateRequest([1, 5 + i, 6, 7], greedy) for i in range(n_reqs)]
    start = await _settled(progress)
    tasks = [asyncio.create_task(engine.generate(r)) for r in reqs]

    async def under_way():  # a few decode steps of the whole batch
        return await progress() >= start + steps * n_reqs

    if delay is None:
        await wait_until(under_way, what="the server to generate tokens")
    else:
        await asyncio.sleep(delay)
    await engine.update_weights(1, path=str(tiny_dirs[1]))
    results = await asyncio.gather(*tasks)
    ks = []
    for r in results:
        n, k = len(r.output_ids), r.versions.count(0)
        assert n == 200 and r.versions == [0] * k + [1] * (n - k), (k, n)
        ks.append(k)
        # tokens before the swap are v0's greedy choices, after it v1's, given all tokens so far
        assert_greedy(hf_models[0], r.prompt_ids, r.output_ids, 0, k)
        assert_greedy(hf_models[1], r.prompt_ids, r.output_ids, k, n)
        lp = torch.tensor(r.logprobs)
        ref0 = forward_logprobs(hf_models[0], r.prompt_ids, r.output_ids)
        ref1 = forward_logprobs(hf_models[1], r.prompt_ids, r.output_ids)
        torch.testing.assert_close(lp[:k], ref0[:k], atol=atol, rtol=0)
        torch.testing.assert_close(lp[k:], ref1[k:], atol=atol, rtol=0)
    return ks


async def _swap_mid_generation(engine, dirs, models, progress, atol: float, what: str) -> None:
    """Retry `_swap_while_generating` until some request switched mid-way. The race is the server's
    speed against the swap's start: when every request had finished first, swap earlier (after one
    decode step; then by the clock, sooner each time, since a server's token counter can lag behind a
    fast generation, as vLLM's did in a CI run); when none had begun, later. Back to v0 between tries."""
    seen, steps, delay = [], 3, None
    for _attempt in range(8):
        ks = await _swap_while_generating(engine, dirs, models, progress, atol, n_reqs=12, steps=steps, delay=delay)
        seen.append(ks)
        if any(0 < k < 200 for k in ks):
            return
        if all(k == 200 for k in ks):  # all finished before the swap
            if steps > 1:
                steps = 1
            else:
                delay = 0.2 if delay is None else delay / 2
        elif delay is None:  # none had begun
            steps += 5
        else:
            delay *= 1.5
        await engine.update_weights(0, path=str(dirs[0]))
    raise AssertionError(f"no generation was still running when {what} (v0 tokens per request, per try: {seen})")


async def check_weight_update_mid_run(engine, tiny_dirs, hf_models, progress, atol: float) -> None:
    """A swap while generations run (retried when the server was too quick and all had finished),
    then new requests get the new weights, then back to v0 from an in-memory state dict."""
    await _swap_mid_generation(engine, tiny_dirs, hf_models, progress, atol, "the weights changed")

    # a new request now gets v1's outputs; after swapping back (state dict) v0's again
    short = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    after = await engine.generate(GenerateRequest([1, 9, 8], short))
    assert set(after.versions) == {1}
    assert_greedy(hf_models[1], after.prompt_ids, after.output_ids, 0, len(after.output_ids))
    await engine.update_weights(2, state_dict=hf_models[0].state_dict())
    back = await engine.generate(GenerateRequest([1, 9, 8], short))
    assert set(back.versions) == {2} and engine.version == 2
    assert_greedy(hf_models[0], back.prompt_ids, back.output_ids, 0, len(back.output_ids))
    assert back.output_ids != after.output_ids


async def check_pause_resume_abort(engine) -> None:
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5, ignore_eos=True)
    await engine.pause()
    held = asyncio.create_task(engine.generate(GenerateRequest([1, 5, 6], sp)))
    await asyncio.sleep(0.5)
    assert not held.done(), "a request finished while the engine was paused"
    await engine.resume()
    r = await held
    assert r.finish_reason == "length" and len(r.output_ids) == 10

    await engine.pause()
    doomed = asyncio.create_task(
        engine.generate(
            GenerateRequest(
                [1, 5, 6], SamplingParams(max_new_tokens=100, ignore_eos=True), request_id="doomed"
            )
        )
    )
    await asyncio.sleep(0.3)
    assert await engine.abort("doomed") == 1
    await engine.resume()
    r = await asyncio.wait_for(doomed, timeout=60)
    assert r.finish_reason == "abort" and len(r.output_ids) < 100
    assert await engine.abort(None) == 0
    health = await engine.health()
    assert health["ok"] and health["engine"] == engine.name


async def check_adapter_swap_mid_run(engine, lora_dirs, base_model, progress, atol: float) -> list[float]:
    """Swap from the base (v0) to a LoRA adapter (v1) while generations run: tokens before the swap are
    the base's, after it the adapter-merged model's (peft's own merge, `lora_dirs["merged"]`). Returns
    the logprobs of a fixed greedy request under the adapter (to compare engines)."""
    models = {0: base_model, 1: lora_dirs["merged"]}
    await _swap_mid_generation(engine, lora_dirs["dirs"], models, progress, atol, "the adapter arrived")
    short = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    after = await engine.generate(GenerateRequest([1, 9, 8], short))
    assert set(after.versions) == {1}
    assert_greedy(models[1], after.prompt_ids, after.output_ids, 0, len(after.output_ids))
    ref = forward_logprobs(models[1], after.prompt_ids, after.output_ids)
    torch.testing.assert_close(torch.tensor(after.logprobs), ref, atol=atol, rtol=0)
    return after.logprobs
