"""`reward.judge.follow_policy`: the judge swaps in every version the run's trainer announces, so the policy
judges its own samples (self-rewarding setups). Off by default: a judge that moves with the policy is a judge
the policy can train against, and its scores are no longer comparable across the run.

The judge's model must be the policy's (`judge.model` = `model.path`): a version's files replace its weights
(a LoRA version is merged by the local engine, as in a rollout worker). Versions come as a rollout worker
gets them: the weights KV watch (weight_store/announce.py) and a verified fetch from the weight store
(weight_store/client.py, the announcement's manifest digest checked). A version that cannot be fetched or
loaded is logged and skipped; the judge keeps the weights it has and takes the next announcement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from shared.contract.messages import WeightVersion

log = logging.getLogger("jetrl.reward.judge")

FetchFn = Callable[[WeightVersion], Awaitable[Path]]


async def follow_policy(engine, announcements: AsyncIterator[WeightVersion], fetch: FetchFn,
                        on_swap: Callable[[int], None] | None = None) -> None:
    """Swap each announced version newer than the engine's into it, until cancelled."""
    async for wv in announcements:
        if wv.version <= engine.version:
            continue
        try:
            path = await fetch(wv)
            await engine.update_weights(wv.version, path=str(path))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("judge: policy version %d not loaded (%s: %s); the judge keeps version %d", wv.version,
                        type(exc).__name__, exc, engine.version)
            continue
        log.info("judge: now judging with policy version %d", wv.version)
        if on_swap is not None:
            on_swap(wv.version)


async def follow_run(judge, js, cfg) -> None:
    """follow_policy for `judge` (a Judge on an EngineBackend) on run `cfg.run`: its weights KV key and the
    weight store of `cfg.weights`."""
    from weight_store.announce import watch
    from weight_store.client import WeightStoreClient

    client = WeightStoreClient(cfg.weights)

    async def fetch(wv: WeightVersion) -> Path:
        return await client.fetch(cfg.run, wv.version, expect_sha256=wv.sha256)

    try:
        await follow_policy(judge.backend.engine, watch(js, cfg.run), fetch, on_swap=judge.swapped)
    finally:
        await client.close()
