"""The client the rollout side uses: `await RewardClient(nc, cfg).score(task, completions, reference)`.

A whole group is one request. On a timeout or "no responders" the client asks again (the same
request id; scoring is idempotent), so another replica of the queue group answers when one is dead
or restarting. It never raises for a scoring or transport failure: the result carries `error`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import nats.errors
import numpy as np
from nats.aio.client import Client as NATS

from shared.config import RewardConfig
from shared.contract import codec, subjects
from shared.contract.messages import RewardRequest, RewardResult

log = logging.getLogger("jetrl.reward.client")


def _failed(task: str, n: int, request_id: str, error: str) -> RewardResult:
    return RewardResult(task=task, rewards=[0.0] * n, request_id=request_id, metrics=[{} for _ in range(n)],
                        errors=[error] * n, error=error)


class RewardClient:
    def __init__(self, nc: NATS, cfg: RewardConfig | None = None):
        self.nc = nc
        self.cfg = cfg or RewardConfig()
        self.attempts = 0  # requests sent, retries included (for tests and status lines)

    async def score(self, task: str, completions: list[str], reference: Any, payload: dict | None = None,
                    completion_ids: list[list[int]] | None = None) -> RewardResult:
        """Score one group; the result has one reward, metrics map and error per completion."""
        n = len(completions)
        request_id = uuid.uuid4().hex
        try:
            subject = subjects.reward(task)
            ids = None if completion_ids is None else [np.asarray(c, dtype=np.int32) for c in completion_ids]
            req = RewardRequest(task=task, completions=list(completions), reference=reference,
                                payload=payload or {}, request_id=request_id, completion_ids=ids)
            data = codec.encode(req)
        except (ValueError, TypeError, OverflowError) as exc:
            return _failed(task, n, request_id, f"request not sent: {exc}")
        if len(data) > self.nc.max_payload:
            err = codec.MessageTooLarge("RewardRequest", len(data), self.nc.max_payload, subject)
            return _failed(task, n, request_id, str(err))
        last = ""
        wait = self.cfg.retry_backoff_s
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                await asyncio.sleep(wait)
                wait = min(2.0, wait * 2 or 0.1)
            self.attempts += 1
            try:
                msg = await self.nc.request(subject, data, timeout=self.cfg.timeout_s)
            except nats.errors.NoRespondersError:
                last = f"no reward service answers on {subject}"
                continue
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                last = f"no reply on {subject} within {self.cfg.timeout_s:g}s"
                continue
            except nats.errors.Error as exc:  # connection closed, draining, ...
                last = f"{type(exc).__name__}: {exc}"
                continue
            if attempt:
                log.info("reward request %s answered after %d retries", request_id, attempt)
            return self._read_reply(task, n, request_id, msg)
        return _failed(task, n, request_id, f"{last} (after {self.cfg.retries + 1} attempts)")

    def _read_reply(self, task: str, n: int, request_id: str, msg: Any) -> RewardResult:
        headers = msg.headers or {}
        if "Nats-Service-Error" in headers:
            return _failed(task, n, request_id, f"reward service error {headers.get('Nats-Service-Error-Code', '')}: "
                                                f"{headers['Nats-Service-Error']}")
        try:
            result = codec.decode(msg.data, expect=RewardResult)
        except codec.DecodeError as exc:
            return _failed(task, n, request_id, f"bad reply from the reward service: {exc}")
        if result.error and len(result.rewards) != n:
            return _failed(task, n, request_id, result.error)
        if len(result.rewards) != n:
            return _failed(task, n, request_id, f"reply has {len(result.rewards)} rewards for {n} completions")
        if len(result.metrics) != n:
            result.metrics = [{} for _ in range(n)]
        if len(result.errors) != n:
            result.errors = [result.error] * n
        return result

    async def close(self) -> None:
        """Nothing to release (the NATS connection is the caller's)."""
