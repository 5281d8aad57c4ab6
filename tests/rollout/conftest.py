"""Rollout test fixtures."""

from __future__ import annotations

import pytest
from rollout_doubles import worker_config

from reward_service.service import RewardService
from shared.contract import bus


@pytest.fixture
async def reward_service(nats_config, js):
    """The real reward service (maxdigit scorer) answering on jetrl.reward.maxdigit."""
    conn = await bus.connect(nats_config, name="reward-test")
    svc = RewardService(conn, worker_config(nats_config.servers[0]), task="maxdigit")
    await svc.start()
    yield svc
    await svc.stop(drain_s=1)
    await conn.close()
