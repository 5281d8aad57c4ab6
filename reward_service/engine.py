"""The scoring engine: one request in, one result out, never an exception. Shared by the NATS service,
offline scoring (`jetrl reward score`) and the benchmark, so all three score the same way.

`handle(raw bytes)` decodes a RewardRequest (bad msgpack, wrong types and missing fields become a
RewardResult with `error` and rewards 0), checks it, and `score_request` runs the task's scorer over
the group where the scorer runs best (inline, thread or the killable process pool), with time limits.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from reward_service.pool import ProcessPool
from reward_service.scorers import (
    BUILTIN,
    MODES,
    GroupFailed,
    Score,
    call_scorer,
    is_judge,
    load_scorer,
    scorer_ref,
)
from shared.config import RewardConfig
from shared.contract import codec
from shared.contract.messages import RewardRequest, RewardResult

log = logging.getLogger("jetrl.reward.engine")


def _salvage(raw: bytes) -> tuple[str, str, int]:
    """(task, request_id, number of completions) from a request that did not decode, best effort."""
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return "", "", 0
    if not isinstance(data, dict):
        return "", "", 0
    rid, task, comps = data.get("request_id"), data.get("task"), data.get("completions")
    return (task if isinstance(task, str) else "", rid if isinstance(rid, str) else "",
            len(comps) if isinstance(comps, (list, tuple)) else 0)


def error_result(task: str, request_id: str, n: int, error: str, t0: float | None = None) -> RewardResult:
    """A result for an unusable request: reward 0 for each completion we could count, `error` set."""
    return RewardResult(task=task, rewards=[0.0] * n, request_id=request_id, metrics=[{} for _ in range(n)],
                        errors=[error] * n, error=error,
                        elapsed_s=time.perf_counter() - t0 if t0 is not None else 0.0)


class ScoringEngine:
    """Scores RewardRequests for one task. `await start()` before use, `await close()` after."""

    def __init__(self, cfg: RewardConfig, task: str | None = None):
        self.cfg = cfg
        self.task = task or cfg.task
        self.judge = None
        if is_judge(self.task, cfg.scorer):  # a model judges the group (reward_service/judge/)
            from reward_service.judge.judge import Judge

            self.judge = Judge(cfg.judge)
            self.ref, self.mode, self._pool, self._threads = "judge", "judge", None, None
            return
        self.ref = scorer_ref(self.task, cfg.scorer)
        self.fn = load_scorer(self.ref)  # import errors surface at start, naming the path
        builtin = not cfg.scorer and self.task in BUILTIN
        self.mode = cfg.executor if cfg.executor != "auto" else (MODES[self.task] if builtin else "thread")
        module = importlib.import_module(self.fn.__module__)
        configure = getattr(module, "configure", None)
        if configure is not None:
            configure(cfg)
        self._min_thread_timeout = cfg.code.wall_s + 2.0 if self.ref == BUILTIN["code"] else 0.0
        workers = cfg.processes or os.cpu_count() or 2
        self._threads = ThreadPoolExecutor(max_workers=max(4, workers), thread_name_prefix="scorer") \
            if self.mode == "thread" else None
        self._pool = ProcessPool(workers, self.ref, cfg.model_dump_json()) if self.mode == "process" else None

    async def start(self) -> None:
        if self.judge is not None:
            await self.judge.start()
        if self._pool is not None:
            await self._pool.start()
        log.info("scoring task %s with %s (%s)", self.task, self.ref, self.mode)

    async def close(self) -> None:
        if self.judge is not None:
            await self.judge.close()
        if self._pool is not None:
            await self._pool.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    @property
    def pool_restarts(self) -> int:
        return self._pool.restarts if self._pool is not None else 0

    # --- scoring --------------------------------------------------------------------------------

    async def _in_thread(self, completion: str, reference: Any, payload: dict, timeout: float) -> Score:
        loop = asyncio.get_running_loop()
        limit = max(timeout, self._min_thread_timeout)
        fut = loop.run_in_executor(self._threads, call_scorer, self.fn, completion, reference, payload)
        try:
            return await asyncio.wait_for(fut, limit)
        except asyncio.TimeoutError:
            return Score(0.0, {}, f"scorer timed out after {limit:g}s")

    async def score_group(self, completions: list[str], reference: Any, payload: dict,
                          timeout: float | None = None) -> list[Score]:
        timeout = timeout or self.cfg.scorer_timeout_s
        if self.judge is not None:  # its own time limit per judge call (reward.judge.request_timeout_s)
            return await self.judge.score_group(completions, reference, payload)
        if self.mode == "inline":
            fn = self.fn
            return [call_scorer(fn, c, reference, payload) for c in completions]
        if self.mode == "thread":
            return list(await asyncio.gather(*(self._in_thread(c, reference, payload, timeout) for c in completions)))
        return list(await asyncio.gather(*(self._pool.run(c, reference, payload, timeout) for c in completions)))

    def check(self, req: RewardRequest) -> str | None:
        """Why a decoded request cannot be scored, or None."""
        if req.task != self.task:
            return f"request is for task {req.task!r} but this service scores {self.task!r}"
        if len(req.completions) > self.cfg.max_completions:
            return f"{len(req.completions)} completions is over this service's limit of {self.cfg.max_completions}"
        if req.completion_ids is not None and len(req.completion_ids) != len(req.completions):
            return f"completion_ids has {len(req.completion_ids)} entries, completions has {len(req.completions)}"
        if req.timeout_s is not None and not req.timeout_s > 0:
            return f"timeout_s must be > 0, got {req.timeout_s}"
        return None

    async def score_request(self, req: RewardRequest) -> RewardResult:
        t0 = time.perf_counter()
        problem = self.check(req)
        if problem:
            return error_result(req.task, req.request_id, len(req.completions), problem, t0)
        timeout = min(req.timeout_s, self.cfg.max_scorer_timeout_s) if req.timeout_s else None
        try:
            scores = await self.score_group(req.completions, req.reference, req.payload, timeout)
        except GroupFailed as exc:  # e.g. the judge gave no answer: the request fails, no reward is made up
            return error_result(req.task, req.request_id, len(req.completions), str(exc), t0)
        return RewardResult(task=req.task, rewards=[s.reward for s in scores], request_id=req.request_id,
                            metrics=[s.metrics for s in scores], errors=[s.error for s in scores],
                            elapsed_s=time.perf_counter() - t0)

    async def handle(self, raw: bytes) -> RewardResult:
        """Decode and score one request's bytes; every failure is a result with `error`."""
        t0 = time.perf_counter()
        try:
            req = codec.decode(raw, expect=RewardRequest)
        except Exception as exc:  # DecodeError, or anything else a hostile map provokes
            task, rid, n = _salvage(raw)
            return error_result(task or self.task, rid, n, f"bad request: {exc}", t0)
        try:
            return await self.score_request(req)
        except Exception as exc:  # a bug in the engine must not take the service down
            log.exception("scoring request %s failed", req.request_id)
            return error_result(req.task, req.request_id, len(req.completions), f"internal error: {exc!r}", t0)
