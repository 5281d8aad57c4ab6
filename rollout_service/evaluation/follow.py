"""`jetrl eval --follow`: evaluate the run's newest version every `eval_every` versions while the run
trains, publishing each result (and a health heartbeat) as an Event.

An announcement counts only once the weight store holds that version with the manifest digest the
announcement carries (weight_store.verify.StoreCheck): a forged announcement of a high version is logged
and ignored, so it can neither stall the follower on a version it cannot load nor skip real ones."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from rollout_service.evaluation.rows import read_rows
from rollout_service.evaluation.session import SERVICE, EvalSession
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig

log = logging.getLogger("jetrl.eval")


async def eval_follow(cfg: JetrlConfig, ecfg: EvalConfig, stop: asyncio.Event | None = None,
                      instance: str = "") -> None:
    """Evaluate the run's newest version whenever `eval_every` versions have passed since the last
    evaluation (the first version seen is always evaluated), publishing each result as an Event."""
    from shared.contract.bus import EventPublisher
    from weight_store.announce import watch
    from weight_store.verify import StoreCheck

    every = max(1, ecfg.eval_every)
    rows = read_rows(ecfg.dataset, ecfg)
    name = Path(ecfg.dataset).name
    stop = stop or asyncio.Event()
    async with EvalSession(cfg, ecfg) as s:
        health = EventPublisher(s.js, s.nc, cfg.run, SERVICE, instance)
        newest = -1
        done = -1
        changed = asyncio.Event()

        check = StoreCheck(s.weights, cfg.run)

        async def watcher() -> None:
            nonlocal newest
            async for wv in watch(s.js, cfg.run):
                if wv.version <= newest:
                    continue
                while True:
                    try:
                        reason = await check.refusal(wv)
                        break
                    except Exception as exc:  # the store unreachable: undecided, ask again
                        log.warning("cannot check version %d against the weight store (%s); retrying",
                                    wv.version, exc)
                        await asyncio.sleep(2.0)
                if reason is not None:
                    log.warning("ignoring the announcement of version %d: %s", wv.version, reason)
                    continue
                newest = wv.version
                changed.set()

        async def heartbeat() -> None:
            while True:
                await health.emit("health", {"status": "ok", "instance": instance, "version": done})
                await asyncio.sleep(cfg.telemetry.events_interval_s)

        tasks = [asyncio.create_task(watcher()), asyncio.create_task(heartbeat())]
        try:
            while not stop.is_set():
                waiter = asyncio.create_task(changed.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED, timeout=5.0)
                waiter.cancel()
                stopper.cancel()
                changed.clear()
                if stop.is_set() or newest < 0 or (done >= 0 and newest < done + every):
                    continue
                target = newest
                try:
                    await s.evaluator.load(target)
                    result = await s.evaluator.evaluate(rows, dataset=name)
                except Exception as exc:  # a version pruned before we fetched it, reward service restarting
                    log.warning("evaluation of version %d failed (%s: %s); retrying with the newest", target,
                                type(exc).__name__, exc)
                    await asyncio.sleep(1.0)
                    changed.set()
                    continue
                done = result.version
                log.info("eval %s", result.line())
                await s.emit(result, instance)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
