"""A replica SIGKILLed mid-request: the caller's retry reaches another replica (real subprocesses)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from reward_fixtures import spawn_replica, wait_for_log

from reward_service.client import RewardClient
from shared.config import RewardConfig


@pytest.mark.slow
async def test_a_replica_killed_mid_request_does_not_lose_the_request(nats_server, nc, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    procs = []
    try:
        for i in range(2):
            log = tmp_path / f"replica-{i}.log"
            p = spawn_replica(nats_server.url, "slow", log, "reward.scorer=reward_test_scorers:slow_and_tell",
                              "reward.executor=thread", "reward.scorer_timeout_s=30")
            procs.append((p, log))
        for p, log in procs:
            await wait_for_log(log, "answering jetrl.reward.slow", p)
        client = RewardClient(nc, RewardConfig(timeout_s=4.0, retries=3, retry_backoff_s=0.1))
        pending = asyncio.create_task(
            client.score("slow", ["yes", "no"], "yes", {"marker_dir": str(markers), "sleep_s": 1.5}))
        for _ in range(200):  # the replica that took the request says so before it sleeps
            if any(markers.iterdir()):
                break
            await asyncio.sleep(0.05)
        victim = int(next(markers.iterdir()).name)
        assert victim in {p.pid for p, _ in procs}
        os.kill(victim, signal.SIGKILL)
        result = await asyncio.wait_for(pending, 60)
        assert result.error is None, result.error
        assert result.rewards == [1.0, 0.0]
        survivor = {p.pid for p, _ in procs} - {victim}
        assert {m["pid"] for m in result.metrics} == survivor
        assert client.attempts == 2
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, _ in procs:
            try:
                p.wait(15)
            except Exception:
                p.kill()
