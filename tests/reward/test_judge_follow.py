"""reward.judge.follow_policy (reward_service/judge/follow.py): a judge on the local engine swaps in the
versions the trainer announces on the real weights KV, forgets answers of the older weights, and skips a
version it cannot fetch; off by default, refused for an endpoint judge."""

from __future__ import annotations

import asyncio

import pytest
import torch

from reward_service.judge.follow import follow_policy
from reward_service.judge.judge import Judge
from shared.config import ModelConfig
from shared.config.reward import JudgeConfig
from shared.contract.messages import WeightVersion
from shared.model.tinymodel import build_tiny_model
from weight_store.announce import announce, watch

RUN = "judged"


def perturbed_dir(path, seed: int):
    model, _ = build_tiny_model(ModelConfig())
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(path)
    return path


async def test_the_judge_follows_announced_versions_and_skips_one_it_cannot_fetch(js, tmp_path):
    j = Judge(JudgeConfig(backend="local", template="Grade: {completion}", max_new_tokens=6, parse_retries=0,
                          on_unparseable="error_zero", follow_policy=True))
    await j.start()
    engine = j.backend.engine
    dirs = {1: perturbed_dir(tmp_path / "v1", 1), 3: perturbed_dir(tmp_path / "v3", 3)}

    async def fetch(wv: WeightVersion):
        if wv.version not in dirs:
            raise FileNotFoundError(f"version {wv.version} is not in the store")
        return dirs[wv.version]

    follower = asyncio.create_task(follow_policy(engine, watch(js, RUN, idle_s=0.3), fetch, on_swap=j.swapped))
    try:
        before = await j.score_group(["some answer"], None, {"prompt": "p"})
        remembered = asyncio.get_running_loop().create_future()
        remembered.set_result(0.5)
        j._cache["an answer of version 0"] = remembered
        await announce(js, WeightVersion(run=RUN, version=1, sha256="a" * 64))
        for _ in range(200):
            if engine.version == 1:
                break
            await asyncio.sleep(0.05)
        assert engine.version == 1 and j.stats["policy_version"] == 1 and not j._cache
        await announce(js, WeightVersion(run=RUN, version=2, sha256="b" * 64))  # not in the store: skipped
        await announce(js, WeightVersion(run=RUN, version=3, sha256="c" * 64))
        for _ in range(200):
            if engine.version == 3:
                break
            await asyncio.sleep(0.05)
        assert engine.version == 3 and j.stats["policy_version"] == 3
        after = await j.score_group(["some answer"], None, {"prompt": "p"})
        assert before[0].error != after[0].error  # other weights, other words (both quoted in the error)
    finally:
        follower.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follower
        await j.close()


def test_follow_policy_is_refused_for_an_endpoint_judge():
    with pytest.raises(ValueError, match="follow_policy: only a judge on jetrl's own engine"):
        Judge(JudgeConfig(backend="openai", base_url="http://x/v1", model="m", follow_policy=True))
    assert JudgeConfig().follow_policy is False
