"""In-process scoring with the RewardClient interface: `await LocalRewardClient(cfg).score(task, completions,
reference)` runs the reward service's own ScoringEngine in this process, no NATS.

For callers that must score without a running reward service (`jetrl eval --local-reward`). The result
is the RewardResult a reward replica would send for the same request; like RewardClient.score, a
scoring failure comes back in the result (`error`, `errors`), never as an exception.

    client = LocalRewardClient(cfg.reward)
    await client.start()
    rr = await client.score("maxdigit", ["8"], "8")
    await client.close()
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from reward_service.engine import ScoringEngine
from shared.config import RewardConfig
from shared.contract.messages import RewardRequest, RewardResult


class LocalRewardClient:
    """`RewardClient.score` without NATS: the reward service's own ScoringEngine, in this process."""

    def __init__(self, cfg: RewardConfig):
        self.engine = ScoringEngine(cfg)

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def score(self, task: str, completions: list[str], reference: Any, payload: dict | None = None,
                    completion_ids: list[list[int]] | None = None) -> RewardResult:
        """Score one group; the result has one reward, metrics map and error per completion."""
        ids = None if completion_ids is None else [np.asarray(c, dtype=np.int32) for c in completion_ids]
        return await self.engine.score_request(RewardRequest(
            task=task, completions=list(completions), reference=reference, payload=payload or {},
            request_id=uuid.uuid4().hex, completion_ids=ids))
