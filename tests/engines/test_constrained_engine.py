"""SamplingParams.constraint and top_logprobs at the engine level: the local engine enforces a JSON schema
with llguidance; an engine that cannot (sim) refuses with a ValueError naming the field."""

from __future__ import annotations

import json

import pytest
from ci_gate import skip_without_modules

from rollout_service.engines.base import GenerateRequest, SamplingParams
from rollout_service.engines.constraint import Constraint
from rollout_service.engines.local import LocalEngine
from rollout_service.engines.sim import SimEngine
from shared.config import JetrlConfig

pytestmark = skip_without_modules("llguidance", install="pip install -e .[dev]")
# the tiny tokenizer has no brackets or braces: a schema it can write
SCHEMA = {"type": "integer", "minimum": 10, "maximum": 999}


def cfg() -> JetrlConfig:
    return JetrlConfig.model_validate({"run": "c", "telemetry": {"metrics_port": -1}})


async def test_local_engine_output_matches_the_schema_and_reports_top_logprobs():
    engine = LocalEngine(cfg())
    await engine.start()
    try:
        prompt = engine.tokenizer.encode("list:", add_special_tokens=False)
        for seed in range(4):
            res = await engine.generate(GenerateRequest(prompt, SamplingParams(
                max_new_tokens=40, seed=seed, constraint=Constraint("json_schema", SCHEMA), top_logprobs=3)))
            assert res.finish_reason == "stop"
            value = json.loads(engine.tokenizer.decode(res.output_ids, skip_special_tokens=True))
            assert isinstance(value, int) and 10 <= value <= 999
            assert len(res.top_logprobs) == len(res.output_ids)
            for lp, top in zip(res.logprobs, res.top_logprobs, strict=True):
                assert len(top) == 3 and lp <= top[0][1] + 1e-6
    finally:
        await engine.close()


async def test_sim_engine_refuses_a_constraint_and_top_logprobs():
    engine = SimEngine(cfg())
    await engine.start()
    try:
        with pytest.raises(ValueError, match="sampling.constraint"):
            await engine.generate(GenerateRequest([1, 2], SamplingParams(constraint=Constraint("json_schema", {}))))
        with pytest.raises(ValueError, match="sampling.top_logprobs"):
            await engine.generate(GenerateRequest([1, 2], SamplingParams(top_logprobs=2)))
    finally:
        await engine.close()
