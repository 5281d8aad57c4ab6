"""reward_service.local_client.LocalRewardClient: RewardClient's `score` interface in process, giving the
same result a reward replica sends over NATS for the same group."""

from __future__ import annotations

from reward_fixtures import replicas, run_config

from reward_service.client import RewardClient
from reward_service.local_client import LocalRewardClient


async def test_scores_in_process_as_a_replica_does_over_nats(nats_config, nc):
    cfg = run_config(nats_config)
    group = ("gsm8k", ["#### 18", "The answer is 17.", "no idea"], "#### 18")
    local = LocalRewardClient(cfg.reward)
    await local.start()
    try:
        here = await local.score(*group, payload={"prompt": "q"}, completion_ids=[[1, 2], [3], []])
        unknown = await local.score("no-such-task", ["x"], "x")
    finally:
        await local.close()
    async with replicas(cfg, 1, "gsm8k"):
        there = await RewardClient(nc, cfg.reward).score(*group, payload={"prompt": "q"},
                                                         completion_ids=[[1, 2], [3], []])
    assert here.rewards == there.rewards == [1.0, 0.0, 0.0]
    assert here.errors == there.errors == [None, None, None] and here.error is None
    assert here.metrics == there.metrics
    assert unknown.error and unknown.rewards == [0.0]  # a failure comes back in the result, not raised
