"""The sim engine: its latency and output-length distributions are those its config describes."""

from __future__ import annotations

import asyncio
import math
import statistics

import numpy as np
import pytest
from engines_helpers import engine_config

from rollout_service.engines import GenerateRequest, SamplingParams, make_engine
from rollout_service.engines.sim import SimEngine, decode_step_time, draw_output_len, prefill_time


async def sim(**opts) -> SimEngine:
    eng = make_engine(engine_config(engine="sim", sim={"time_scale": 0.0, **opts}))
    assert isinstance(eng, SimEngine)
    await eng.start()
    return eng


async def test_sim_output_lengths_are_lognormal_with_the_configured_median_and_sigma():
    eng = await sim(output_len_median=40.0, output_len_sigma=0.7, max_concurrency=512, seed=1)
    try:
        sp = SamplingParams(max_new_tokens=100_000)
        results = await asyncio.gather(*[eng.generate(GenerateRequest([1, 2, 3], sp)) for _ in range(1500)])
    finally:
        await eng.close()
    logs = [math.log(len(r.output_ids)) for r in results]
    assert abs(math.exp(statistics.median(logs)) - 40.0) < 40.0 * 0.08
    assert abs(statistics.stdev(logs) - 0.7) < 0.7 * 0.08
    for r in results:
        assert r.finish_reason == "stop" and r.output_ids[-1] == 2  # EOS ends a shorter-than-max generation
        assert len(r.logprobs) == len(r.versions) == len(r.output_ids) and max(r.logprobs) <= 0
        assert all(4 <= t < 1000 for t in r.output_ids[:-1])


async def test_sim_lengths_are_clipped_to_max_new_tokens_and_end_with_length():
    eng = await sim(output_len_median=500.0, output_len_sigma=0.0)
    try:
        r = await eng.generate(GenerateRequest([1, 2], SamplingParams(max_new_tokens=30)))
    finally:
        await eng.close()
    assert len(r.output_ids) == 30 and r.finish_reason == "length"


async def test_sim_latency_of_a_lone_request_is_prefill_plus_its_decode_steps():
    opts = {"prefill_base_s": 0.05, "prefill_s_per_token": 0.001, "decode_base_s": 0.02, "decode_s_per_seq": 0.003,
            "decode_s_per_ctx_token": 0.0001, "output_len_median": 25.0, "output_len_sigma": 0.5}  # fmt: skip
    eng = await sim(**opts)
    try:
        r = await eng.generate(GenerateRequest(list(range(10)), SamplingParams(max_new_tokens=1000, seed=7)))
    finally:
        await eng.close()
    o = eng.opts
    n, p = len(r.output_ids), 10
    assert n == draw_output_len(np.random.default_rng(7), o, 1000)  # the seed fixes the length
    expected = prefill_time(o, p) + sum(decode_step_time(o, 1, p + k) for k in range(n))
    assert r.timings["total"] == pytest.approx(expected, rel=1e-9)
    assert r.timings["queue"] == 0 and r.timings["prefill"] == pytest.approx(prefill_time(o, p))
    assert decode_step_time(o, 4, 100) == pytest.approx(0.02 + 0.003 * 4 + 0.0001 * 100)


async def test_sim_runs_at_most_max_concurrency_and_queues_the_rest():
    eng = await sim(max_concurrency=4, output_len_median=10.0, output_len_sigma=0.3)
    try:
        results = await asyncio.gather(
            *[eng.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=50))) for _ in range(20)]
        )
    finally:
        await eng.close()
    assert eng.peak_running == 4
    assert sum(r.timings["queue"] > 0 for r in results) >= 16


async def test_sim_versions_switch_at_a_step_boundary_after_update_weights():
    eng = await sim(output_len_median=1000.0, output_len_sigma=0.0, time_scale=0.05)  # 0.25 ms a step
    try:
        task = asyncio.create_task(eng.generate(GenerateRequest([1, 2], SamplingParams(max_new_tokens=400))))
        await asyncio.sleep(0.02)
        await eng.update_weights(3)  # wakes the engine in the middle of a sleep over many steps
        r = await task
        assert await eng.abort(None) == 0
    finally:
        await eng.close()
    k = r.versions.count(0)
    assert 10 <= k < 400 and r.versions == [0] * k + [3] * (400 - k)


async def test_sim_steps_slept_together_keep_the_virtual_times_of_steps_slept_one_by_one():
    """At time_scale > 0 the engine sleeps the steps that change nothing in one go (fewer wake-ups for
    hundreds of engines); the simulated timings and the tokens' count are those of the step-by-step
    engine (time_scale 0), and the wall time follows the simulated time."""
    import time

    opts = dict(output_len_median=300.0, output_len_sigma=0.0, decode_base_s=0.002, decode_s_per_ctx_token=1e-6)
    sp = SamplingParams(max_new_tokens=400, seed=5)
    ref = await sim(**opts)
    try:
        expect = await ref.generate(GenerateRequest([1, 2, 3], sp))
    finally:
        await ref.close()
    eng = await sim(**opts, time_scale=1.0)
    try:
        t0 = time.monotonic()
        got = await eng.generate(GenerateRequest([1, 2, 3], sp))
        wall = time.monotonic() - t0
    finally:
        await eng.close()
    assert len(got.output_ids) == len(expect.output_ids) == 300 and got.finish_reason == "stop"
    assert got.output_ids == expect.output_ids and got.logprobs == expect.logprobs  # the same draws, in order
    for k in ("queue", "prefill", "decode", "total"):
        assert math.isclose(got.timings[k], expect.timings[k], rel_tol=1e-9, abs_tol=1e-12), k
    assert wall >= expect.timings["total"] * 0.95  # slept what it simulates (not less)
